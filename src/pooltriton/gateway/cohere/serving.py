"""Cohere's embed, v1 and v2, over the one pooling service: its input types as the model's prompts, its
embedding types (float, int8, uint8, binary, ubinary, base64)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import numpy as np
from fastapi import Request, Response

from pooltriton.client.service import ServedModel
from pooltriton.contract.requests import check_dimensions
from pooltriton.gateway.cohere.protocol import CohereEmbedRequest, CohereEmbedV1Request
from pooltriton.gateway.errors import APIError
from pooltriton.gateway.serving import JSON, base64_vector, served


async def embed(body: CohereEmbedRequest, request: Request) -> Response:
    """Cohere's v2 embed: the embeddings by type."""
    embeddings, tokens = await _embed(body, request, body.embedding_types)
    return JSON({"id": str(uuid.uuid4()), "embeddings": embeddings, "texts": body.texts,
                 "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens}},
                 "response_type": "embeddings_by_type"})


async def embed_v1(body: CohereEmbedV1Request, request: Request) -> Response:
    """Cohere's v1 embed (its SDK's `Client`): float vectors alone unless `embedding_types` asks for types."""
    embeddings, tokens = await _embed(body, request, body.embedding_types or ["float"])
    by_type = body.embedding_types is not None
    meta = {"api_version": {"version": "1"}, "billed_units": {"input_tokens": tokens}}
    return JSON({"id": str(uuid.uuid4()), "embeddings": embeddings if by_type else embeddings["float"],
                 "texts": body.texts, "meta": meta,
                 "response_type": "embeddings_by_type" if by_type else "embeddings_floats"})


async def _embed(body: CohereEmbedRequest, request: Request, kinds: Sequence[str]) -> tuple[dict, int]:
    """Both versions' embed: each type's encoding of the vectors, and the tokens read."""
    serving, service = served(request)
    if body.image_urls is not None:
        return await _embed_images(body, serving, service, kinds)
    model = await serving.model(body.model, "embed")
    named = prompt(model, body.input_type)
    try:  # the size first: a size the model cannot give is the error to report, whatever its types
        check_dimensions(model, body.output_dimension)
    except ValueError as error:
        raise APIError(400, str(error), "output_dimension") from None
    check_packing(kinds, body.output_dimension or model.width)
    check_scaling(kinds, model)
    pooled = await serving(service.encode(body.texts, model=model.name, priority=body.priority,
                                          dimensions=body.output_dimension, **body.parameters(),
                                          **({"prompt_name": named} if named else {})),
                           fields={"dimensions": "output_dimension", "input": "texts"})
    return {kind: encode(pooled.values, kind) for kind in dict.fromkeys(kinds)}, pooled.tokens


async def _embed_images(body: CohereEmbedRequest, serving, service, kinds: Sequence[str]) -> tuple[dict, int]:
    """`images` or image inputs: the model's image tower (input_type "image" or any other: images take none)."""
    if body.output_dimension is not None:
        raise APIError(400, "output_dimension: image embeddings are answered whole", "output_dimension")
    model = await serving(service.image_info(body.model))
    check_packing(kinds, model.width)
    check_scaling(kinds, model)
    data = await serving.media.load_all(body.image_urls or [])
    pooled = await serving(service.embed_images(data, model=model.name, priority=body.priority))
    return {kind: encode(pooled.values, kind) for kind in dict.fromkeys(kinds)}, pooled.tokens


# Cohere's input types and the prompt names sentence-transformers models use for them.
PROMPTS = {"search_query": ("query",), "search_document": ("document", "passage", "doc")}


def prompt(model: ServedModel, input_type: str | None) -> str | None:
    """The model's prompt an input_type names (itself, or search_query -> query, search_document ->
    document/passage), None where the model has none for it: Cohere's SDKs send input_type on every call,
    and a model without prompts embeds every kind of text the same way."""
    if input_type is None:
        return None
    return next((name for name in (input_type, *PROMPTS.get(input_type, ())) if name in model.prompts), None)


PACKED_TYPES = ("binary", "ubinary")


def check_packing(kinds: Sequence[str], width: int | None) -> None:
    """Binary types pack 8 components per byte: a width not divisible by 8 is refused (before the model
    runs where the width is known)."""
    packed = [kind for kind in kinds if kind in PACKED_TYPES]
    if packed and width and width % 8:
        raise APIError(400, f"embedding type {packed[0]} packs 8 components per byte: the dimension {width} is "
                       "not divisible by 8", "embedding_types")


SCALED_TYPES = ("int8", "uint8")


def check_scaling(kinds: Sequence[str], model: ServedModel) -> None:
    """int8/uint8 scale each component by 127, which keeps it in range only in a unit vector: a model
    whose embeddings are raw (a sentence-transformers pipeline without Normalize, SPLADE's weights) would
    come back clipped, so the type is refused before the model runs. Exports older than the flag pass."""
    scaled = [kind for kind in kinds if kind in SCALED_TYPES]
    if scaled and model.use_activation is False:
        raise APIError(400, f"embedding type {scaled[0]} scales unit-length vectors by 127: model "
                       f"{model.name!r} returns unnormalised embeddings, which it would clip; ask for float, "
                       "base64, binary or ubinary", "embedding_types")


def encode(vectors: np.ndarray, kind: str) -> list:
    """Cohere's embedding types. int8/uint8 scale unit-vector components by 127; binary types pack
    the sign bits 8 per byte, 1 for a component >= 0 (binary: signed, ubinary: unsigned), as vLLM packs
    them, and need a dimension divisible by 8."""
    if kind == "float":
        return vectors.tolist()
    if kind == "base64":
        return [base64_vector(v) for v in vectors]
    if kind in ("int8", "uint8"):
        scaled = np.clip(np.round(vectors * 127), -128, 127).astype(np.int64)
        return (scaled + (128 if kind == "uint8" else 0)).tolist()
    check_packing([kind], vectors.shape[1])
    packed = np.packbits(vectors >= 0, axis=1).astype(np.int64)
    return (packed - 128 if kind == "binary" else packed).tolist()
