"""SageMaker's routes (/invocations, /ping); errors in OpenAI's shape."""

from __future__ import annotations

from fastapi import APIRouter

from pooltriton.gateway.errors import openai_error, shaped_route
from pooltriton.gateway.openai import protocol as vllm
from pooltriton.gateway.protocol import Health
from pooltriton.gateway.sagemaker import serving
from pooltriton.gateway.tei import protocol as tei

router = APIRouter(route_class=shaped_route(openai_error))
router.add_api_route("/invocations", serving.invocations, methods=["POST"], response_model=(
    vllm.EmbeddingResponse | vllm.ClassifyResponse | vllm.RerankResponse | vllm.ScoreResponse | vllm.PoolingResponse
    | tei.Embeddings | tei.SparseEmbeddings | tei.TokenEmbeddings | tei.Predictions | tei.Ranks | tei.Similarities))
for method in ("GET", "POST"):
    router.add_api_route("/ping", serving.ping, methods=[method], response_model=Health)
