"""vLLM's (and OpenAI's) pooling endpoints over the one pooling service: each a few lines that read a body,
call the service and write the answer."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from fastapi import Request, Response

from pooltriton.client.service import PoolingService
from pooltriton.gateway.errors import APIError
from pooltriton.gateway.media import content_images, message_images
from pooltriton.gateway.openai.protocol import (
    BYTES_FORMATS,
    ClassifyRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    PoolingRequest,
    RerankRequest,
    ScoreRequest,
    TokenizeRequest,
)
from pooltriton.gateway.serving import (
    JSON,
    POOLING_ROUTE,
    Serving,
    as_texts,
    bytes_answer,
    encode_inputs,
    encoded_answers,
    header,
    served,
    usage,
)


async def _inputs(body: EmbeddingRequest | ClassifyRequest | PoolingRequest, serving: Serving, service: PoolingService,
                  model: str) -> tuple[list[str], dict[str, Any]]:
    """A body's texts (or pre-tokenised rows) for the service: its `input`, or vLLM's chat form, the conversation
    rendered by the model's template and tokenized as one pre-tokenised input."""
    if body.messages is None:
        return encode_inputs(body.input)
    if (text := _tower_text(body.messages)) is not None and (await serving.model(model)).image_model:
        return [text], {}  # CLIP's and SigLIP's chat form: one message of one text, no template (vLLM's)
    ids = await serving(service.chat(body.messages, model=model, **body.chat()))
    return [json.dumps(ids)], {"input_format": "token_ids"}


def _tower_text(messages: list[dict]) -> str | None:
    """The text of one message holding one text (a string, or one text part), else None."""
    content = messages[0].get("content") if len(messages) == 1 and isinstance(messages[0], dict) else None
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict):
        content = content[0].get("text") if content[0].get("type") == "text" else None
    return content if isinstance(content, str) else None


def _images(body: EmbeddingRequest | PoolingRequest) -> list[tuple[str, str]] | None:
    """(url, where) of the images a body sends: vLLM's image parts in `messages`, or infinity's `input` of
    data URLs with modality "image"; None for a body of texts."""
    if getattr(body, "modality", "text") == "image":
        urls = [body.input] if isinstance(body.input, str) else list(body.input or [])
        return [(url, f"input[{index}]") for index, url in enumerate(urls)]
    return message_images(body.messages) if body.messages is not None else None


async def _embed_images(body: EmbeddingRequest | PoolingRequest, images: list[tuple[str, str]], serving: Serving,
                        service: PoolingService):
    if body.dimensions is not None:
        raise APIError(400, "dimensions: image embeddings are answered whole", "dimensions")
    if body.messages is not None and (len(images) != 1 or len(body.messages) != 1):
        raise APIError(400, "messages: one message of one image (or one text) per request, as vLLM reads CLIP's "
                            "and SigLIP's chat form; send several images as `input` with modality \"image\"",
                       "messages")
    model = await serving(service.image_info(body.model))
    data = await serving.media.load_all(images)
    return model, await serving(service.embed_images(data, model=model.name, priority=body.priority,
                                                     use_activation=body.parameters().get("use_activation")))


async def _score_images(query: Any, field: str, images: list[tuple[str, str]], body: ScoreRequest | RerankRequest,
                        serving: Serving, service: PoolingService):
    if not isinstance(query, str):
        raise APIError(400, f"{field}: one text, scored against image documents", field)
    data = await serving.media.load_all(images)
    return await serving(service.score_images(query, data, model=body.model, priority=body.priority))


async def embeddings(body: EmbeddingRequest, request: Request) -> Response:
    serving, service = served(request)
    images = _images(body)
    if images is not None:
        model, pooled = await _embed_images(body, images, serving, service)
    else:
        model = await serving.model(body.model, "embed")
        texts, input_format = await _inputs(body, serving, service, model.name)
        pooled = await serving(service.encode(texts, model=model.name, priority=body.priority, **body.parameters(),
                                              dimensions=body.dimensions, **input_format))
    vectors = np.ascontiguousarray(pooled.values, dtype=np.float32)
    answer = header("embd", body.model, model)
    if body.encoding_format in BYTES_FORMATS:
        return bytes_answer(vectors, body.encoding_format, body.embed_dtype, body.endianness,
                            {**answer, "usage": usage(pooled.tokens)})
    # float: the float32 rows as they are (orjson writes them from their buffer)
    answers = vectors if body.encoding_format == "float" else encoded_answers(
        vectors, body.encoding_format, body.embed_dtype, body.endianness)
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(answers)]
    return JSON({**answer, "object": "list", "data": data, "usage": usage(pooled.tokens)})


async def classify(body: ClassifyRequest, request: Request) -> Response:
    serving, service = served(request)
    model = await serving.model(body.model, "classify")
    texts, input_format = await _inputs(body, serving, service, model.name)
    pooled = await serving(service.encode(texts, model=model.name, priority=body.priority, **body.parameters(),
                                          **input_format))
    data = [{"index": i, "label": model.labels[int(p.argmax())] if model.labels else int(p.argmax()),
             "probs": p.tolist(), "num_classes": len(p)} for i, p in enumerate(pooled.values)]
    return JSON({**header("classify", body.model, model), "object": "list", "data": data,
                 "usage": usage(pooled.tokens)})


async def score(body: ScoreRequest, request: Request) -> Response:
    serving, service = served(request)
    model = await serving.model(body.model, scoring=True)
    (first, left), (second, right) = body.pair()
    images = content_images(right, second)
    if images is not None:  # vLLM's multimodal scoring: the cosine of the text and image towers' embeddings
        pooled = await _score_images(left, first, images, body, serving, service)
        data = [{"index": i, "object": "score", "score": float(s)} for i, s in enumerate(pooled.values)]
        return JSON({**header("score", body.model, model), "object": "list", "data": data,
                     "usage": usage(pooled.tokens)})
    queries, documents = as_texts(left, first), as_texts(right, second)
    pooled = await serving(service.score(queries, documents, model=model.name, priority=body.priority,
                                         **body.parameters()))
    data = [{"index": i, "object": "score", "score": float(s)} for i, s in enumerate(pooled.values)]
    return JSON({**header("score", body.model, model), "object": "list", "data": data,
                 "usage": usage(pooled.tokens)})


async def rerank(body: RerankRequest, request: Request) -> Response:
    serving, service = served(request)
    model = await serving.model(body.model, scoring=True)
    images = content_images(body.documents, "documents")
    if images is not None:
        pooled = await _score_images(body.query, "query", images, body, serving, service)
        order = sorted(range(len(images)), key=lambda i: -float(pooled.values[i]))[: body.top_n or None]
        answer = header("rerank", body.model, model)
        return JSON({"id": answer["id"], "model": answer["model"], "usage": usage(pooled.tokens),
                     "results": [{"index": i, "relevance_score": float(pooled.values[i])} for i in order]})
    ranked = await serving(service.rerank(body.query, body.candidates(), model=model.name, top_n=body.top_n or None,
                                          priority=body.priority, **body.parameters()))
    results = []
    for result in ranked.values:
        item: dict[str, Any] = {"index": result.index, "relevance_score": result.score}
        if body.return_documents:
            item["document"] = {"text": result.document}
        results.append(item)
    answer = header("rerank", body.model, model)
    return JSON({"id": answer["id"], "model": answer["model"], "results": results, "usage": usage(ranked.tokens)})


async def pooling(body: PoolingRequest, request: Request) -> Response:
    serving, service = served(request)
    images = _images(body) if body.task in (None, "embed") else None
    if images is not None:  # a CLIP / SigLIP image, as on /v1/embeddings
        model, pooled = await _embed_images(body, images, serving, service)
    else:
        model = await serving.model(body.model, body.task, POOLING_ROUTE)
        texts, input_format = await _inputs(body, serving, service, model.name)
        pooled = await serving(service.encode(texts, model=model.name, priority=body.priority, **body.parameters(),
                                              **input_format))
    answer = header("pool", body.model, model)
    answers = [np.asarray(values) for values in pooled.values]
    if body.encoding_format in BYTES_FORMATS:
        return bytes_answer(answers, body.encoding_format, body.embed_dtype, body.endianness,
                            {**answer, "usage": usage(pooled.tokens)})
    data = encoded_answers(answers, body.encoding_format, body.embed_dtype, body.endianness)
    return JSON({**answer, "object": "list", "data": [{"index": i, "object": "pooling", "data": values}
                                                       for i, values in enumerate(data)],
                 "usage": usage(pooled.tokens)})


async def tokenize(body: TokenizeRequest, request: Request) -> Response:
    """The model's own tokenizer stage, untruncated."""
    serving, service = served(request)
    model = await serving.model(body.model)
    prompt = body.prompt or ""
    if body.messages is not None:  # vLLM's chat form: the conversation as the model's template writes it
        options = body.chat()
        options.pop("add_special_tokens")
        prompt = await serving(service.chat_text(body.messages, model=model.name, **options))
    if body.return_token_strs:
        (pieces,) = await serving(service.pieces(prompt, model=model.name, with_prompt=False,
                                                 add_special_tokens=body.special_tokens),
                                  fields={"inputs": "prompt"})
        ids, strings = pieces.ids, pieces.tokens
    else:
        ids = (await serving(service.tokenize(prompt, model=model.name,
                                              add_special_tokens=body.special_tokens)))[0]
        strings = None
    return JSON({"tokens": ids, "count": len(ids), "max_model_len": model.max_length, "token_strs": strings})


async def detokenize(body: DetokenizeRequest, request: Request) -> Response:
    serving, service = served(request)
    model = await serving.model(body.model)
    prompt = await serving(service.detokenize(body.tokens, model=model.name,
                                              skip_special_tokens=body.skip_special_tokens))
    return JSON({"prompt": prompt})
