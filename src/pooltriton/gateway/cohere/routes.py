"""Cohere's embed routes; errors in OpenAI's shape (Cohere's SDKs read the status and the message).
Cohere's rerank (/v1/rerank, /v2/rerank) is vLLM's, in the openai package."""

from __future__ import annotations

from fastapi import APIRouter

from pooltriton.gateway.cohere import protocol, serving
from pooltriton.gateway.errors import openai_error, shaped_route

router = APIRouter(route_class=shaped_route(openai_error))
router.add_api_route("/v2/embed", serving.embed, methods=["POST"], response_model=protocol.CohereEmbedResponse)
router.add_api_route("/v1/embed", serving.embed_v1, methods=["POST"], response_model=protocol.CohereEmbedResponse)
