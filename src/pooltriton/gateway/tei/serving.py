"""text-embeddings-inference's endpoints over the one pooling service: /embed, /embed_sparse, /embed_all,
/predict, /rerank, /similarity, /tokenize, /decode, /embeddings (its OpenAI route), /info, GET / and POST /
(the route of the model's kind)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import numpy as np
from fastapi import Request, Response

from pooltriton.client.service import ServedModel
from pooltriton.gateway.errors import APIError
from pooltriton.gateway.serving import (
    JSON,
    base64_vector,
    encode_inputs,
    json_body,
    served,
    usage,
    validated,
    version,
)
from pooltriton.gateway.tei import answers
from pooltriton.gateway.tei.protocol import (
    TEIDecodeRequest,
    TEIEmbedRequest,
    TEIEmbedSparseRequest,
    TEIOpenAIRequest,
    TEIPredictRequest,
    TEIRerankRequest,
    TEISimilarityRequest,
    TEITokenizeRequest,
)

T = TypeVar("T")
Batches = tuple[list[list[int]], list[tuple[list[str], dict[str, Any]]]]


def _empty(texts: Sequence[str], pairs: Sequence[str | None] | None = None, param: str = "inputs") -> None:
    """TEI's 400 "Empty" for no input, or an input with no text (a pair only where both are empty); `param`:
    the body's field (its OpenAI route's is `input`; TEI's message names `inputs` on every route)."""
    if not texts or any(not text and not (pairs and pairs[i]) for i, text in enumerate(texts)):
        raise APIError(400, "`inputs` cannot be empty", param, kind="Empty")


def _characters(texts: Sequence[str], token_ids: bool = False) -> int:
    """TEI's count of what was computed on: a text's characters, a row of token ids its ids."""
    if token_ids:  # each row travels as its JSON list
        return sum(text.count(",") + 1 for text in texts if text != "[]")
    return sum(map(len, texts))


def _metered(request: Request, characters: int, tokens: int) -> None:
    """TEI's x-compute-characters / x-compute-tokens (with x-compute-time and x-total-time: the guard adds
    them as the answer starts), which HF's endpoints and usage meters read."""
    request.state.compute = (characters, tokens)


async def _all(calls: Sequence[Awaitable[T]]) -> list[T]:
    """Every call's answer; the first failure raised once all have ended (none left running unobserved)."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    if failed := next((result for result in results if isinstance(result, BaseException)), None):
        raise failed
    return results  # type: ignore[return-value]


def _batches(inputs: Any, param: str = "inputs") -> Batches:
    """TEI's Input: texts, rows of token ids, or a batch of both (then each kind is one encode and the
    answers are put back in order: the index groups); TEI's 400 Empty for an empty input."""
    groups: list[list[int]] = []
    if isinstance(inputs, list) and any(isinstance(v, str) for v in inputs) and \
            any(isinstance(v, list) for v in inputs):
        groups = [[i for i, v in enumerate(inputs) if isinstance(v, kind)] for kind in (str, list)]
    encoded = [encode_inputs([inputs[i] for i in group]) for group in groups] or [encode_inputs(inputs)]
    # token ids travel as JSON lists: an empty one is "[]"
    _empty([text if not input_format or text != "[]" else "" for texts, input_format in encoded for text in texts],
           param=param)
    return groups, encoded


async def _encode(request: Request, model: ServedModel, batches: Batches, parameters: dict[str, Any], *,
                  priority: int, fields: dict[str, str] | None = None,
                  dimensions: int | None = None) -> tuple[np.ndarray | list[np.ndarray], int]:
    """The embedding routes' encode: the values in the inputs' order (`dimensions`: TEI's cut, normalised
    again where `use_activation`) and the tokens computed."""
    serving, service = served(request)
    groups, encoded = batches
    answers.check_dimensions(dimensions, model.width)  # before the model runs, where the width is known
    results = await _all([serving(service.encode(texts, model=model.name, priority=priority, **parameters,
                                                 **input_format), fields=fields)
                          for texts, input_format in encoded])
    tokens = sum(result.tokens for result in results)
    _metered(request, sum(_characters(texts, bool(input_format)) for texts, input_format in encoded), tokens)
    values: Any = results[0].values
    if groups:
        values = [np.empty(0)] * sum(map(len, groups))
        for group, result in zip(groups, results):
            for index, value in zip(group, result.values):
                values[index] = value
        values = values if isinstance(results[0].values, list) else np.stack(values)
    if isinstance(values, list):  # per token: one array per input
        return [np.ascontiguousarray(value, dtype=np.float32) for value in values], tokens
    return answers.cut(np.ascontiguousarray(values, dtype=np.float32), dimensions, parameters["use_activation"]), tokens


async def _embedding(request: Request, body: TEIEmbedSparseRequest, task: str, sparse: bool = False,
                     dimensions: int | None = None) -> np.ndarray | list[np.ndarray]:
    """/embed, /embed_sparse and /embed_all: the model the body names, else the first of the route's kind."""
    serving, _ = served(request)
    batches = _batches(body.inputs)
    parameters = body.parameters()
    model = await answers.model_for(serving, body.model, task, sparse, fallback=not parameters["use_activation"])
    if model.sparse and parameters["use_activation"]:
        raise APIError(424, "`normalize` is not available for SPLADE models: send \"normalize\": false for the "
                       "whole vector, or use /embed_sparse")
    values, _ = await _encode(request, model, batches, parameters, priority=body.priority,
                              fields={"input": "inputs"}, dimensions=dimensions)
    return values


async def embed(body: TEIEmbedRequest, request: Request) -> Response:
    """/embed: [[float]], normalised unless `normalize` is false."""
    return JSON(await _embedding(request, body, "embed", dimensions=body.dimensions))


async def embed_sparse(body: TEIEmbedSparseRequest, request: Request) -> Response:
    """/embed_sparse: a SPLADE model's non-zero weights, [[{index, value}]]."""
    return JSON(answers.sparse_values(await _embedding(request, body, "embed", sparse=True)))


async def embed_all(body: TEIEmbedSparseRequest, request: Request) -> Response:
    """/embed_all: every token's embedding per input, [[[float]]], raw: the hidden states a token_embed model
    serves (a pooled model's are pooled inside its graph)."""
    return JSON(await _embedding(request, body, "token_embed"))


async def similarity(body: TEISimilarityRequest, request: Request) -> Response:
    """/similarity (sentence similarity): the cosine of the source sentence's embedding to each sentence's,
    as the bi-encoder scores them."""
    serving, service = served(request)
    if not body.inputs.sentences:
        raise APIError(400, "`inputs.sentences` cannot be empty", "inputs.sentences", kind="Empty")
    _empty([body.inputs.source_sentence, *body.inputs.sentences])
    model = await answers.model_for(serving, body.model, "embed", fallback=True)
    scores = await serving(service.score(body.inputs.source_sentence, body.inputs.sentences, model=model.name,
                                         priority=body.priority, **body.options()),
                           fields={"query": "inputs.source_sentence", "documents": "inputs.sentences"})
    _metered(request, len(body.inputs.source_sentence) + _characters(body.inputs.sentences), scores.tokens)
    return JSON(np.ascontiguousarray(scores.values, dtype=np.float32))


async def decode(body: TEIDecodeRequest, request: Request) -> Response:
    """/decode: one text per row of ids, special tokens skipped by default."""
    serving, service = served(request)
    rows = body.rows()
    if not all(rows):  # `ids: []` is one empty row, as TEI reads it
        raise APIError(400, "`input_ids` cannot be empty", "ids", kind="Empty")
    model = await serving.model(body.model)
    return JSON(await serving(service.detokenize_rows(rows, model=model.name,
                                                      skip_special_tokens=body.skip_special_tokens)))


async def predict(body: TEIPredictRequest, request: Request) -> Response:
    """/predict: every label's score per input, highest first; single texts and pairs (a cross-encoder's)
    may share a batch, sent as one encode each."""
    serving, service = served(request)
    sequences, batched = body.sequences()
    _empty([first for first, _ in sequences], [second for _, second in sequences])
    model = await answers.model_for(serving, body.model, "classify")
    groups = [(indices, paired) for paired in (False, True)
              if (indices := [i for i, (_, second) in enumerate(sequences) if (second is not None) == paired])]
    calls = [serving(service.encode([sequences[i][0] for i in indices], model=model.name, priority=body.priority,
                                    pairs=[sequences[i][1] for i in indices] if paired else None,
                                    **body.parameters()), fields={"input": "inputs"})
             for indices, paired in groups]
    results = await _all(calls)
    scores = np.empty((len(sequences), results[0].values.shape[1]), dtype=np.float32)
    for (indices, _), result in zip(groups, results):
        scores[indices] = result.values
    _metered(request, sum(len(first) + len(second or "") for first, second in sequences),
             sum(result.tokens for result in results))
    ranked = answers.predictions(scores if body.raw_scores else answers.activation(scores), model.labels)
    return JSON(ranked if batched else ranked[0])


async def rerank(body: TEIRerankRequest, request: Request) -> Response:
    """/rerank: [{index, score, text?}], highest first; a cross-encoder's logit by TEI's own activation."""
    if not body.texts:
        raise APIError(400, "`texts` cannot be empty", "texts", kind="Empty")
    serving, service = served(request)
    model = await serving.model(body.model, scoring=True)
    if model.scorer is None:
        raise APIError(424, f"model {model.name!r} is not a re-ranker model")
    logits = model.task == "classify"
    options = {**body.parameters(), "use_activation": False} if logits else body.parameters()
    ranked = await serving(service.rerank(body.query, body.texts, model=model.name, top_n=body.top_n or None,
                                          priority=body.priority, **options))
    _metered(request, len(body.query) * len(body.texts) + _characters(body.texts), ranked.tokens)
    scores = np.array([r.score for r in ranked.values], dtype=np.float32)
    if logits and not body.raw_scores:
        scores = answers.activation(scores[:, None])[:, 0]
    return JSON([{"index": r.index, "score": float(score), **({"text": r.document} if body.return_text else {})}
                 for r, score in zip(ranked.values, scores)])


async def tokenize(body: TEITokenizeRequest, request: Request) -> Response:
    """/tokenize: [[{id, text, special, start, stop}]] per input, untruncated."""
    serving, service = served(request)
    model = await serving.model(body.model)
    if not body.inputs or "" in ([body.inputs] if isinstance(body.inputs, str) else body.inputs):
        raise APIError(400, "`inputs` cannot be empty", "inputs", kind="Empty")  # TEI tokenizes no empty text
    pieces = await serving(service.pieces(body.inputs, model=model.name, add_special_tokens=body.add_special_tokens,
                                          prompt_name=body.prompt_name))
    return JSON([answers.tokens_of(text) for text in pieces])


async def openai_embeddings(body: TEIOpenAIRequest, request: Request) -> Response:
    """TEI's OpenAI route (it serves /v1/embeddings so too; ours there is vLLM's): an over-long input is
    truncated (TEI's --auto-truncate), every vector normalised after the cut to `dimensions` (any size up to
    the width), and a `model` not served is the first embedding model (TEI serves one and only warns of it).
    Errors in OpenAI's shape."""
    serving, service = served(request)
    batches = _batches(body.input, "input")
    if not service.models:
        await serving.model(None)  # the model list, read on first use
    # Any other name (an OpenAI client's default, a Hugging Face id with its "/") is TEI's one model: here the
    # first embedding model, at once (no index read for a name that is no model's).
    model = await answers.model_for(serving, body.model if body.model in service.names else None, "embed")
    if model.sparse:
        raise APIError(424, "`normalize` is not available for SPLADE models: use /embed_sparse")
    vectors, tokens = await _encode(request, model, batches, {"truncate": "END", "use_activation": True},
                                    priority=body.priority, dimensions=body.dimensions)
    data = [{"object": "embedding", "index": i,
             "embedding": base64_vector(v) if body.encoding_format == "base64" else v} for i, v in enumerate(vectors)]
    return JSON({"object": "list", "data": data, "model": model.name, "usage": usage(tokens)})


async def info(request: Request, model: str | None = None) -> Response:
    """/info, of the model `?model=` names or the one POST / serves."""
    serving, service = served(request)
    chosen = await serving.model(model)
    return JSON(answers.info_of(chosen, version(), service.max_batch, await answers.router_settings(service, chosen)))


async def health(request: Request) -> Response:
    """GET /: /health, unhealthy in TEI's shape."""
    if not await served(request)[1].ready():
        raise APIError(503, "unhealthy")
    return JSON({"status": "ok"})


async def default(request: Request, model: str | None = None) -> Response:
    """POST / (where huggingface_hub's InferenceClient posts): a body whose `inputs` holds `source_sentence`
    is /similarity; any other is the route of the model's kind, as TEI routes its one model: an embedding
    model /embed (SPLADE: /embed_sparse), a cross-encoder /rerank, another classifier /predict, a token_embed
    model /embed_all. The model: the body's `model`, else `?model=`, else the first served (by name)."""
    body = await json_body(request)
    # huggingface_hub's InferenceClient posts to its URL as given and names no model in the body.
    if isinstance(body, dict) and body.get("model") is None and model is not None:
        body = {**body, "model": model}
    if isinstance(body, dict) and isinstance(body.get("inputs"), dict):
        return await similarity(validated(TEISimilarityRequest, body), request)
    name = body.get("model") if isinstance(body, dict) else None
    chosen = await served(request)[0].model(name if isinstance(name, str) else None)
    if isinstance(body, dict) and name is None:  # the route serves the model chosen here
        body = {**body, "model": chosen.name}
    if chosen.task == "embed" and chosen.sparse:
        return await embed_sparse(validated(TEIEmbedSparseRequest, body), request)
    if chosen.task == "embed":
        return await embed(validated(TEIEmbedRequest, body), request)
    if chosen.task == "classify" and chosen.scorer is not None:
        return await rerank(validated(TEIRerankRequest, body), request)
    if chosen.task == "classify":
        return await predict(validated(TEIPredictRequest, body), request)
    if chosen.task == "token_embed":
        return await embed_all(validated(TEIEmbedSparseRequest, body), request)
    raise APIError(424, f"Model {chosen.name!r} ({chosen.task}) has no text-embeddings-inference route")
