"""Over-length input: rejected with the limit named, unless the request asks to truncate."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

LONG = " ".join(["pooling"] * 100 + ["models", "serve", "vectors"] * 60)


def test_over_length_is_rejected_naming_the_limit(client) -> None:
    with pytest.raises(InferenceServerException, match=r"limit of 256 tokens.*truncate"):
        client.embed([LONG])


@pytest.mark.parametrize("side", ["END", "START"])
def test_truncate_matches_sentence_transformers(client, minilm_st, side: str) -> None:
    minilm_st.tokenizer.truncation_side = "right" if side == "END" else "left"
    try:
        reference = minilm_st.encode([LONG, "short text"], normalize_embeddings=True)
    finally:
        minilm_st.tokenizer.truncation_side = "right"
    served = client.embed([LONG, "short text"], truncate=side)
    assert np.abs(served - reference).max() <= 1e-5


def test_end_and_start_differ(client) -> None:
    end, start = client.embed([LONG], truncate="END"), client.embed([LONG], truncate="START")
    assert float(end[0] @ start[0]) < 0.999


def test_invalid_truncate_value(client) -> None:
    with pytest.raises(InferenceServerException, match="invalid truncate value"):
        client.embed(["hello"], truncate="MIDDLE")


def test_custom_metrics_count_tokens_padding_and_truncations(server, http_client, minilm_st) -> None:
    """Each counter moves by exactly what one request did: one truncation, its real tokens, and the
    padding of the chunks the ragged planner makes of its rows."""
    import re
    import urllib.request

    from pooltriton.backends.ragged import plan_chunks

    def value(name: str, model: str) -> float:
        text = urllib.request.urlopen(f"http://localhost:{server.metrics_port}/metrics").read().decode()
        match = re.search(rf'^{name}{{model="{model}"}} ([0-9.e+]+)$', text, re.MULTILINE)
        return float(match.group(1)) if match else 0.0

    counters = [("pooltriton_truncations_total", "minilm_tokenizer"), ("pooltriton_tokens_total", "minilm_encoder"),
                ("pooltriton_padding_tokens_total", "minilm_encoder")]
    before = [value(*counter) for counter in counters]
    http_client.embed([LONG], truncate="END")
    texts = ["short", "a somewhat longer text here"]
    http_client.embed(texts)
    after = [value(*counter) for counter in counters]
    lengths = np.array([len(minilm_st.tokenizer(t)["input_ids"]) for t in texts])
    chunks = plan_chunks(lengths)
    padding = sum(len(chunk) * int(lengths[chunk].max()) for chunk in chunks) - int(lengths.sum())
    assert after[0] - before[0] == 1
    assert after[1] - before[1] == 256 + lengths.sum()
    assert after[2] - before[2] == padding > 0
