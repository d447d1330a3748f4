"""The plugin task: the example zero-shot IO processor around MiniLM, served by Triton."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from pooltriton.core.plugins import IOProcessor, get_plugin, register
from pooltriton.examples.zero_shot import DEFAULT_TEMPLATE

LABELS = ["sports", "cooking", "finance"]
TEXTS = ["The striker scored twice in the final.", "Whisk the eggs with sugar.", "Stocks fell after the report."]


def test_zero_shot_plugin_equals_sentence_transformers(client, minilm_st) -> None:
    answers = client.plugin("minilm_zero_shot", TEXTS, labels=LABELS)
    vectors = minilm_st.encode(TEXTS + [DEFAULT_TEMPLATE.format(label) for label in LABELS],
                               normalize_embeddings=True)
    expected = vectors[:3] @ vectors[3:].T
    for answer, row in zip(answers, expected):
        np.testing.assert_allclose([answer["scores"][label] for label in LABELS], row, atol=1e-5)
        assert answer["label"] == LABELS[int(row.argmax())]
    assert [a["label"] for a in answers] == LABELS


def test_plugin_errors_are_clear(client) -> None:
    with pytest.raises(InferenceServerException, match="plugin: zero_shot needs the request parameter"):
        client.plugin("minilm_zero_shot", TEXTS)


def test_registry() -> None:
    @register("test_upper")
    class Upper(IOProcessor):
        def pre_process(self, inputs, params):
            return [text.upper() for text in inputs]

    assert get_plugin("test_upper").pre_process(["a"], {}) == ["A"]
    with pytest.raises(KeyError, match="no plugin registered as 'missing'"):
        get_plugin("missing")
