"""The paths two dialects share, /rerank and /tokenize (vLLM's and text-embeddings-inference's): the dialect
is chosen from the body once, before validation (a TEI body carries a key a vLLM body does not), and the
body is then validated, served and its errors answered as that dialect's."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import reduce
from operator import or_
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel

from pooltriton.gateway.errors import APIError, Render, invalid, openai_error, rendered
from pooltriton.gateway.openai.routes import SHARED as VLLM
from pooltriton.gateway.serving import json_body, validated
from pooltriton.gateway.tei import answers as tei_answers
from pooltriton.gateway.tei.routes import SHARED as TEI

# The key that makes a body text-embeddings-inference's on each shared path, and vLLM's keys there: a body
# with both is refused (which API it is for is not known).
TEI_KEYS = {"/rerank": "texts", "/tokenize": "inputs"}
VLLM_KEYS = {"/rerank": ("documents",), "/tokenize": ("prompt", "messages")}
AMBIGUOUS = {"/rerank": "send documents (vLLM's) or texts (text-embeddings-inference's), not both",
             "/tokenize": "send one of prompt (vLLM's), messages (its chat form) and inputs "
                          "(text-embeddings-inference's)"}


@dataclass(frozen=True)
class Reader:
    """One dialect's reading of a shared path."""

    claims: Callable[[Any], bool]
    body: type[BaseModel]
    handler: Callable[..., Any]
    answer: Any
    render: Render


def readers(path: str, dialects: Collection[str]) -> list[Reader]:
    """The enabled dialects' readers of `path`, the one that claims any body last."""
    found = []
    if "tei" in dialects:
        key = TEI_KEYS[path]
        found.append(Reader(lambda body: isinstance(body, dict) and key in body, *TEI[path], tei_answers.error))
    if "openai" in dialects:
        found.append(Reader(lambda body: True, *VLLM[path], openai_error))
    return found


def _route(path: str, choices: list[Reader]) -> Callable[[Request], Any]:
    async def route(request: Request) -> Response:
        try:
            body = await json_body(request)
        except RequestValidationError as error:  # no body to tell the dialect by: the default's shape
            return choices[-1].render(invalid(error))
        if isinstance(body, dict) and TEI_KEYS[path] in body and any(key in body for key in VLLM_KEYS[path]):
            return choices[-1].render(APIError(400, AMBIGUOUS[path]))
        reader = next((choice for choice in choices if choice.claims(body)), choices[-1])

        async def handle(request: Request) -> Response:
            return await reader.handler(validated(reader.body, body), request)

        return await rendered(handle, reader.render)(request)

    return route


def router(dialects: Collection[str]) -> APIRouter:
    shared = APIRouter()
    for path in TEI_KEYS:
        if not (choices := readers(path, dialects)):
            continue
        schema = {"anyOf": [{"$ref": f"#/components/schemas/{choice.body.__name__}"} for choice in choices]}
        shared.add_api_route(path, _route(path, choices), methods=["POST"],
                             response_model=reduce(or_, [choice.answer for choice in choices]),
                             openapi_extra={"requestBody": {"required": True,
                                                            "content": {"application/json": {"schema": schema}}}})
    return shared


def bodies(dialects: Collection[str]) -> list[type[BaseModel]]:
    """The request bodies the shared paths read (for the OpenAPI document's components)."""
    return [choice.body for path in TEI_KEYS for choice in readers(path, dialects)]
