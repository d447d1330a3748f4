"""Python client for the served pooling models, over Triton's HTTP or gRPC protocol (tritonclient).

    client = PoolingClient("localhost:8001", protocol="grpc")
    vectors = client.embed(["A man is eating food."])            # np.ndarray [1, 384], L2-normalised
    tokens = client.encode(["Call John"], task="token_classify", model="rampart")  # per-text arrays
    scores = client.score("query", ["doc a", "doc b"], model="minilm")            # bi-encoder cosine

Big inputs are split into requests of at most `max_batch` texts and reassembled in order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pooltriton.scoring import split_tokens

DEFAULT_URLS = {"http": "localhost:8000", "grpc": "localhost:8001"}
MAX_BATCH = 128  # the exported models' max_batch_size
TOKEN_COUNTS = "TOKEN_COUNTS"


@dataclass(frozen=True)
class Classification:
    """Class probabilities (or logits with use_activation=False) with the model's label names."""

    probabilities: np.ndarray  # [n, C]
    labels: tuple[str, ...]

    def top(self) -> list[tuple[str, float]]:
        best = self.probabilities.argmax(axis=1)
        return [(self.labels[i], float(self.probabilities[row, i])) for row, i in enumerate(best)]


@dataclass(frozen=True)
class TokenClassification:
    """One [tokens_i, C] array per text (real tokens only) with the model's label names."""

    probabilities: list[np.ndarray]
    labels: tuple[str, ...]

    def tags(self) -> list[list[str]]:
        return [[self.labels[i] for i in p.argmax(axis=1)] for p in self.probabilities]


@dataclass(frozen=True)
class RerankResult:
    index: int
    score: float
    document: str


@dataclass(frozen=True)
class ModelInfo:
    name: str
    task: str
    outputs: tuple[str, ...]
    labels: tuple[str, ...]


class PoolingClient:
    def __init__(self, url: str | None = None, protocol: str = "http", model: str = "minilm",
                 max_batch: int = MAX_BATCH, timeout_s: float = 60.0) -> None:
        if protocol == "http":
            import tritonclient.http as client_module

            self._client = client_module.InferenceServerClient(url or DEFAULT_URLS["http"],
                                                               network_timeout=timeout_s)
        elif protocol == "grpc":
            import tritonclient.grpc as client_module

            self._client = client_module.InferenceServerClient(url or DEFAULT_URLS["grpc"])
        else:
            raise ValueError(f"protocol must be 'http' or 'grpc', not {protocol!r}")
        self._module = client_module
        self.protocol, self.model, self.max_batch = protocol, model, max_batch
        self._info: dict[str, ModelInfo] = {}

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> PoolingClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- model metadata ---------------------------------------------------------------------------
    def info(self, model: str | None = None) -> ModelInfo:
        """Task, outputs and label names of a served ensemble, from its config (cached)."""
        model = model or self.model
        if model not in self._info:
            if self.protocol == "grpc":
                config = self._client.get_model_config(model, as_json=True)["config"]
            else:
                config = self._client.get_model_config(model)
            parameters = {k: v["string_value"] for k, v in (config.get("parameters") or {}).items()}
            self._info[model] = ModelInfo(
                name=model,
                task=parameters.get("task", ""),
                outputs=tuple(o["name"] for o in config["output"]),
                labels=tuple(json.loads(parameters.get("labels", "[]"))),
            )
        return self._info[model]

    # -- tasks ------------------------------------------------------------------------------------
    def embed(self, texts: str | Sequence[str], *, model: str | None = None, truncate: str | None = None,
              use_activation: bool | None = None) -> np.ndarray:
        """One vector per text, [n, dim] float32. `truncate`: None/"NONE" rejects over-length texts
        with an error naming the limit; "END" or "START" cuts them to the model's limit."""
        return self.encode(texts, model=model, truncate=truncate, use_activation=use_activation)

    def classify(self, texts: str | Sequence[str], *, model: str | None = None,
                 pairs: Sequence[str] | None = None, **options: Any) -> Classification:
        """Class probabilities per text (or per (text, pair) for cross-encoders) with label names."""
        values = self.encode(texts, model=model, pairs=pairs, **options)
        return Classification(values, self.info(model).labels)

    def classify_tokens(self, texts: str | Sequence[str], *, model: str | None = None,
                        **options: Any) -> TokenClassification:
        return TokenClassification(self.encode(texts, model=model, **options), self.info(model).labels)

    def encode(self, texts: str | Sequence[str], *, model: str | None = None, task: str | None = None,
               pairs: Sequence[str] | None = None, **options: Any) -> np.ndarray | list[np.ndarray]:
        """vLLM's `encode(task=...)`: sequence tasks return [n, C]; token tasks a list of [tokens_i, C]
        arrays, exactly each text's real tokens. `task`, when given, must be the model's task."""
        model = model or self.model
        info = self.info(model)
        if task is not None and info.task and task != info.task:
            raise ValueError(f"model {model!r} serves task {info.task!r}, not {task!r} (one task per model)")
        batch = [texts] if isinstance(texts, str) else list(texts)
        if not batch:
            raise ValueError("texts is empty: pass at least one text")
        pair_list = None if pairs is None else list(pairs)
        if pair_list is not None and len(pair_list) != len(batch):
            raise ValueError(f"{len(pair_list)} pairs for {len(batch)} texts: they pair up one to one")
        parameters = {k: v for k, v in options.items() if v is not None}
        per_token = TOKEN_COUNTS in info.outputs
        parts = []
        for start in range(0, len(batch), self.max_batch):
            end = start + self.max_batch
            inputs = {"TEXT": batch[start:end]}
            if pair_list is not None:
                inputs["TEXT_PAIR"] = pair_list[start:end]
            result = self._infer(model, inputs, info.outputs, parameters, batched=True)
            if per_token:
                parts.extend(split_tokens(result[info.outputs[0]], result[TOKEN_COUNTS]))
            else:
                parts.append(result[info.outputs[0]])
        return parts if per_token else np.concatenate(parts, axis=0)

    def score(self, query: str | Sequence[str], documents: str | Sequence[str], *, model: str | None = None,
              **options: Any) -> np.ndarray:
        """Scores from `<model>_score`: 1:1, 1:N (one query) or N:N (zipped lists)."""
        queries = [query] if isinstance(query, str) else list(query)
        docs = [documents] if isinstance(documents, str) else list(documents)
        if not queries or not docs:
            raise ValueError("query and documents each need at least one text")
        parameters = {k: v for k, v in options.items() if v is not None}
        name = f"{model or self.model}_score"
        result = self._infer(name, {"QUERY": queries, "DOCUMENTS": docs}, ("SCORES",), parameters, batched=False)
        return result["SCORES"]

    def rerank(self, query: str, documents: Sequence[str], *, model: str | None = None, top_n: int | None = None,
               **options: Any) -> list[RerankResult]:
        """Documents sorted by score, best first (cross-encoder, bi-encoder or late interaction)."""
        scores = self.score(query, list(documents), model=model, **options)
        order = np.argsort(-scores, kind="stable")[: top_n or len(documents)]
        return [RerankResult(int(i), float(scores[i]), documents[i]) for i in order]

    def plugin(self, model: str, inputs: str | Sequence[str], **parameters: Any) -> list[Any]:
        """Call a plugin model (see pooltriton.plugins): one decoded JSON answer per input."""
        batch = [inputs] if isinstance(inputs, str) else list(inputs)
        if not batch:
            raise ValueError("inputs is empty: pass at least one input")
        params = {k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in parameters.items()}
        result = self._infer(model, {"INPUT": batch}, ("OUTPUT",), params, batched=False)
        return [json.loads(item) for item in result["OUTPUT"]]

    # -- transport --------------------------------------------------------------------------------
    def _infer(self, model: str, inputs: dict[str, list[str]], outputs: Sequence[str],
               parameters: dict[str, Any], batched: bool) -> dict[str, np.ndarray]:
        tensors = []
        for name, texts in inputs.items():
            data = np.array([t.encode("utf-8") if isinstance(t, str) else t for t in texts], dtype=object)
            shape = [len(texts), 1] if batched else [len(texts)]
            tensor = self._module.InferInput(name, shape, "BYTES")
            tensor.set_data_from_numpy(data.reshape(shape))
            tensors.append(tensor)
        requested = [self._module.InferRequestedOutput(name) for name in outputs]
        result = self._client.infer(model, tensors, outputs=requested, parameters=parameters or None)
        return {name: result.as_numpy(name) for name in outputs}
