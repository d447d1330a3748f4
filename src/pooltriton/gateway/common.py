"""The routes every deployment serves, whichever dialects it turns on: /health, /version, /v1/models,
/metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from pooltriton.gateway.errors import openai_error, shaped_route
from pooltriton.gateway.metrics import CONTENT_TYPE
from pooltriton.gateway.protocol import Health
from pooltriton.gateway.serving import JSON, health_answer, served, version


class Version(BaseModel):
    version: str


class ModelCard(BaseModel):
    id: str
    object: str
    created: int
    owned_by: str
    root: str
    task: str
    max_model_len: int | None
    scoring: bool


class ModelList(BaseModel):
    object: str
    data: list[ModelCard]


router = APIRouter(route_class=shaped_route(openai_error))


@router.get("/health", response_model=Health)
async def health(request: Request) -> Response:
    return await health_answer(request)


@router.get("/version", response_model=Version)
async def version_route() -> Response:
    return JSON({"version": version()})


@router.get("/v1/models", response_model=ModelList)
async def list_models(request: Request) -> Response:
    serving, service = served(request)
    if not service.models:
        await serving.model(None)
    # Every name a client may use (a model's own, then the names it answers to, --served-model-name), as
    # vLLM lists its served names; `root` is the model a name reaches when no task is asked.
    return JSON({"object": "list", "data": [
        {"id": name, "object": "model", "created": 0, "owned_by": "pooltriton", "root": models[0].name,
         "task": models[0].task, "max_model_len": models[0].max_length, "scoring": models[0].scorer is not None}
        for name, models in service.names.items()]})


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE)
