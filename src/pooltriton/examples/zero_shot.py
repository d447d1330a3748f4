"""A working plugin: zero-shot classification with an embedding model.

Request parameters: "labels" (list of label names, required) and optional "template" (default
"This text is about {}."). Each input text is answered with the label whose templated description
embeds closest (cosine), and every label's score.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pooltriton.contract import OUTPUT_NAMES
from pooltriton.core.plugins import IOProcessor, register
from pooltriton.core.semantics import Task

DEFAULT_TEMPLATE = "This text is about {}."


@register("zero_shot")
class ZeroShotClassifier(IOProcessor):
    def _labels(self, params: dict[str, Any]) -> list[str]:
        labels = params.get("labels")
        if isinstance(labels, str):  # KServe parameters are scalars: accept a JSON list or "a,b,c"
            import json

            labels = json.loads(labels) if labels.startswith("[") else [x.strip() for x in labels.split(",")]
        if not labels or not all(isinstance(x, str) and x for x in labels):
            raise ValueError('zero_shot needs the request parameter "labels": a non-empty list of names')
        return labels

    def pre_process(self, inputs: list[str], params: dict[str, Any]) -> list[str]:
        template = params.get("template", DEFAULT_TEMPLATE)
        return inputs + [template.format(label) for label in self._labels(params)]

    def post_process(self, inputs: list[str], outputs: dict[str, np.ndarray], params: dict[str, Any]) -> list[Any]:
        labels = self._labels(params)
        vectors = outputs[OUTPUT_NAMES[Task.EMBED]]
        texts, descriptions = vectors[: len(inputs)], vectors[len(inputs) :]
        texts = texts / np.linalg.norm(texts, axis=1, keepdims=True)
        descriptions = descriptions / np.linalg.norm(descriptions, axis=1, keepdims=True)
        scores = texts @ descriptions.T
        return [{"label": labels[int(row.argmax())], "scores": dict(zip(labels, map(float, row)))}
                for row in scores]
