"""text-embeddings-inference's routes; errors in its shape ({"error", "error_type"}) and codes, except on its
OpenAI route (/embeddings), which answers in OpenAI's. /rerank and /tokenize are shared with vLLM: the
gateway's `shared` module routes those by body."""

from __future__ import annotations

from fastapi import APIRouter

from pooltriton.gateway.errors import openai_error, shaped_route
from pooltriton.gateway.protocol import Health
from pooltriton.gateway.tei import answers, protocol, serving

router = APIRouter(route_class=shaped_route(answers.error))
router.add_api_route("/", serving.health, methods=["GET"], response_model=Health)
router.add_api_route("/", serving.default, methods=["POST"], response_model=protocol.Embeddings
                     | protocol.SparseEmbeddings | protocol.TokenEmbeddings | protocol.Predictions | protocol.Ranks
                     | protocol.Similarities,
                     openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {
                         "anyOf": [{"$ref": f"#/components/schemas/{kind}"} for kind in (
                             "TEIEmbedRequest", "TEIEmbedSparseRequest", "TEIPredictRequest", "TEIRerankRequest",
                             "TEISimilarityRequest")]}}}}})
router.add_api_route("/info", serving.info, methods=["GET"], response_model=protocol.Info)
router.add_api_route("/embed", serving.embed, methods=["POST"], response_model=protocol.Embeddings)
router.add_api_route("/embed_sparse", serving.embed_sparse, methods=["POST"],
                     response_model=protocol.SparseEmbeddings)
router.add_api_route("/embed_all", serving.embed_all, methods=["POST"], response_model=protocol.TokenEmbeddings)
router.add_api_route("/predict", serving.predict, methods=["POST"], response_model=protocol.Predictions)
router.add_api_route("/similarity", serving.similarity, methods=["POST"], response_model=protocol.Similarities)
router.add_api_route("/decode", serving.decode, methods=["POST"], response_model=protocol.Decoded)

# Its OpenAI route, in OpenAI's error shape.
openai_router = APIRouter(route_class=shaped_route(openai_error))
openai_router.add_api_route("/embeddings", serving.openai_embeddings, methods=["POST"],
                            response_model=protocol.OpenAIResponse)

# Routed by body with vLLM's (gateway.shared): path -> (body, handler, answer).
SHARED = {"/rerank": (protocol.TEIRerankRequest, serving.rerank, protocol.Ranks),
          "/tokenize": (protocol.TEITokenizeRequest, serving.tokenize, protocol.Tokens)}
