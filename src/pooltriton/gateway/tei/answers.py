"""text-embeddings-inference's answers and rules: its error shape and codes, the model a route serves, its
`dimensions` cut, /info, its tokens, its activation of a classifier's logits."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
from starlette.responses import Response
from tritonclient.utils import InferenceServerException

from pooltriton.client.service import PoolingService, ServedModel
from pooltriton.contract import stages
from pooltriton.contract.config import read_parameters
from pooltriton.contract.requests import TokenPieces
from pooltriton.core.activation import normalize as unit
from pooltriton.core.activation import sigmoid, softmax
from pooltriton.gateway.errors import APIError
from pooltriton.gateway.serving import JSON, Serving


def sparse_values(vectors: np.ndarray) -> list[list[dict[str, Any]]]:
    """text-embeddings-inference's sparse form: each vector's non-zero entries as {index, value}, by index."""
    return [[{"index": int(i), "value": float(row[i])} for i in np.flatnonzero(row)] for row in vectors]


# text-embeddings-inference's error types by status (its ErrorType); the rest of its 4xx are Validation.
ERROR_TYPES = {400: "Empty", 424: "Backend", 429: "Overloaded", 503: "Unhealthy"}


def error(failure: APIError) -> Response:
    """An APIError in text-embeddings-inference's shape ({"error", "error_type"}) and codes: a request it
    cannot serve is 422 Validation (this gateway's 400), a model of the wrong kind (or none of the route's
    kind served) and a failed inference 424 Backend."""
    status = 422 if failure.status == 400 and failure.kind != "Empty" else failure.status
    if status >= 500 and status != 503:  # a failed inference: TEI's Backend error is 424 Failed Dependency
        status = 424
    kind = ERROR_TYPES.get(status, "Validation" if status < 500 else "Backend")
    return JSON({"error": failure.message, "error_type": kind}, status_code=status, headers=failure.headers)


KINDS = {"embed": "embedding model", "classify": "classifier model", "token_embed": "token embedding model"}


async def model_for(serving: Serving, name: str | None, task: str, sparse: bool = False,
                    fallback: bool = False) -> ServedModel:
    """The model a text-embeddings-inference route serves: the one named (a model of another kind is TEI's
    424), else the first of the route's kind (TEI serves one model), or with `fallback` of the task."""
    model = await serving.model(name)  # reads the model list on first use
    if name is None:
        served = [m for m in serving.service.models.values() if m.task == task]
        kind = [m for m in served if m.sparse == sparse] or (served if fallback else [])
        if not kind:
            raise APIError(424, f"no served {'SPLADE ' if sparse else ''}{KINDS[task]}", "model")
        return kind[0]
    # Of the models that answer to the name (--served-model-name), the first of the route's kind.
    fits = [m for m in serving.service.names.get(name, [model]) if m.task == task and (m.sparse or not sparse)]
    if fits:
        return fits[0]
    if model.task != task:
        article = "an" if KINDS[task][0] in "aeiou" else "a"
        raise APIError(424, f"Model {name!r} is not {article} {KINDS[task]} "
                       f"(it serves {model.task})")
    if sparse and not model.sparse:
        raise APIError(424, f"Model {name!r} is not an embedding model with SPLADE pooling")
    return model


def cut(vectors: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """text-embeddings-inference's `dimensions`: the first that many components, of any size up to the width
    (where vLLM's routes take the model's declared Matryoshka sizes only), normalised after the cut."""
    check_dimensions(dimensions, vectors.shape[1])
    if dimensions is None or dimensions == vectors.shape[1]:
        return vectors
    kept = np.ascontiguousarray(vectors[:, :dimensions])
    return unit(kept) if normalize else kept


def check_dimensions(dimensions: int | None, width: int | None) -> None:
    if dimensions is not None and width is not None and dimensions > width:
        raise APIError(400, "`dimensions` should be smaller than the maximum embedding dimension.", "dimensions")


# text-embeddings-inference's names for a pooling (its Pool) and for a precision (its dtype).
POOLING = {"CLS": "cls", "MEAN": "mean", "LAST": "last_token", "SPLADE_MAX": "splade", "SPLADE_SUM": "splade"}
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


async def router_settings(service: PoolingService, model: ServedModel) -> dict[str, int]:
    """text-embeddings-inference's router settings in /info, from the model's stages as Triton reads them:
    max_concurrent_requests the requests its tokenizer stage queues before it refuses (429), tokenization_workers
    that stage's instances, max_batch_tokens the tokens one encoder call takes (the ragged budget, or with
    buckets rows x max length), max_batch_requests its rows. Left out where a stage cannot be read (a plugin's
    model has no tokenizer of its own)."""
    names = stages(model.name)
    try:
        tokenizer, encoder = await service.config(names.tokenizer), await service.config(names.encoder)
    except InferenceServerException:
        return {}
    queue = tokenizer.get("dynamic_batching", {}).get("default_queue_policy", {})
    rows = int(encoder.get("max_batch_size", 0))
    budget = read_parameters(encoder).get("ragged_token_budget")
    workers = sum(int(group.get("count", 1)) for group in tokenizer.get("instance_group", []))
    settings = {"tokenization_workers": workers}
    if int(queue.get("max_queue_size", 0)) > 0:  # 0: Triton's unbounded queue
        settings["max_concurrent_requests"] = int(queue["max_queue_size"])
    if rows > 0:  # 0: an encoder that does not batch
        settings["max_batch_requests"] = rows
    if budget is not None or (rows > 0 and model.max_length):
        settings["max_batch_tokens"] = int(budget) if budget is not None else rows * (model.max_length or 0)
    return settings


def info_of(model: ServedModel, version: str, max_batch: int, router: dict[str, int] | None = None) -> dict[str, Any]:
    """text-embeddings-inference's /info for one served model: what this gateway knows of it (the model's
    config, `router`: router_settings'). A cross-encoder is TEI's reranker; fields TEI does not have:
    `task`, and `pooling` of other than TEI's poolings in its own words."""
    labels = list(model.labels)
    if model.task in ("classify", "token_classify"):
        kind = "reranker" if model.scorer is not None and model.task == "classify" else "classifier"
        model_type: dict[str, Any] = {kind: {"id2label": {str(i): label for i, label in enumerate(labels)},
                                             "label2id": {label: i for i, label in enumerate(labels)}}}
    else:
        pooling = POOLING.get(model.pooling or "", (model.pooling or "unknown").lower())
        model_type = {"embedding": {"pooling": pooling}}
    dtype = DTYPES.get(model.precision or "", model.precision)
    return {"model_id": model.name, "model_sha": None, "model_dtype": dtype,
            "served_model_name": (model.served_names or (model.name,))[0], "model_type": model_type, "task": model.task,
            "max_input_length": model.max_length, "max_batch_requests": None, "max_client_batch_size": max_batch,
            "auto_truncate": True, **(router or {}), "version": version, "sha": None, "docker_label": None}


def tokens_of(pieces: TokenPieces) -> list[dict[str, Any]]:
    """text-embeddings-inference's tokens of one text: a special token its vocabulary string and no span, any
    other the text it covers and its span in UTF-8 bytes of the text read, as TEI's tokenizer counts them."""
    at = [0, *itertools.accumulate(len(character.encode("utf-8", "surrogatepass")) for character in pieces.text)]
    return [{"id": id_, "text": token, "special": True, "start": None, "stop": None} if span is None else
            {"id": id_, "text": pieces.text[span[0]:span[1]], "special": special, "start": at[span[0]],
             "stop": at[span[1]]}
            for id_, token, special, span in zip(pieces.ids, pieces.tokens, pieces.special, pieces.spans, strict=True)]


def activation(logits: np.ndarray) -> np.ndarray:
    """text-embeddings-inference's activation of a classifier's logits, whatever the model's own (its
    problem_type, sentence-transformers' activation_fn): softmax over more than one label, else sigmoid."""
    return softmax(logits) if logits.shape[-1] > 1 else sigmoid(logits)


def predictions(probabilities: np.ndarray, labels: Sequence[str]) -> list[list[dict[str, Any]]]:
    """text-embeddings-inference's /predict answer per input: every label's score, highest first."""
    names = list(labels) or [f"LABEL_{i}" for i in range(probabilities.shape[1])]
    return [[{"score": float(row[i]), "label": names[i]} for i in np.argsort(-row, kind="stable")]
            for row in probabilities]
