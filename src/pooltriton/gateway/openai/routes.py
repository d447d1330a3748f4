"""vLLM's (and OpenAI's) routes; errors in OpenAI's shape. /rerank and /tokenize are shared with
text-embeddings-inference: the gateway's `shared` module routes those by body."""

from __future__ import annotations

from fastapi import APIRouter

from pooltriton.gateway.errors import openai_error, shaped_route
from pooltriton.gateway.openai import protocol, serving
from pooltriton.gateway.serving import POOLING_ROUTE

router = APIRouter(route_class=shaped_route(openai_error))
router.add_api_route("/v1/embeddings", serving.embeddings, methods=["POST"],
                     response_model=protocol.EmbeddingResponse)
router.add_api_route("/classify", serving.classify, methods=["POST"], response_model=protocol.ClassifyResponse)
for path in ("/score", "/v1/score"):
    router.add_api_route(path, serving.score, methods=["POST"], response_model=protocol.ScoreResponse)
for path in ("/v1/rerank", "/v2/rerank"):
    router.add_api_route(path, serving.rerank, methods=["POST"], response_model=protocol.RerankResponse)
router.add_api_route(POOLING_ROUTE, serving.pooling, methods=["POST"], response_model=protocol.PoolingResponse)
router.add_api_route("/detokenize", serving.detokenize, methods=["POST"],
                     response_model=protocol.DetokenizeResponse)

# Routed by body with text-embeddings-inference's (gateway.shared), as (path, body, handler, answer).
SHARED = {"/rerank": (protocol.RerankRequest, serving.rerank, protocol.RerankResponse),
          "/tokenize": (protocol.TokenizeRequest, serving.tokenize, protocol.TokenizeResponse)}
