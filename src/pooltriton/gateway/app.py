"""The HTTP gateway in front of Triton (gRPC): it wires the dialects' routers over the one pooling service.

    python -m pooltriton.gateway --triton localhost:8001 --port 8080

Each dialect is a package with its bodies and answers (`protocol`), its endpoints over the pooling service
(`serving`) and its router in its own error shape (`routes`): `openai` (OpenAI's and vLLM's routes),
`cohere`, `tei` (text-embeddings-inference's) and `sagemaker`; `shared` routes the paths two dialects share
by body, `common` serves /health, /version, /v1/models and /metrics. A deployment may turn dialects off
(--dialects). The gateway knows only what Triton tells it (model configs; token counts come back with every
answer), so it needs no access to the model repository's files.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Collection, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from tritonclient.utils import InferenceServerException

from pooltriton.client.coalesce import IN_FLIGHT
from pooltriton.client.service import PoolingService, Transport, TritonTransport
from pooltriton.contract import ADMIN_KEY_ENV, QUEUE_TIMEOUT_MS, admin_headers
from pooltriton.core.images import MAX_IMAGE_BYTES
from pooltriton.gateway import common, shared
from pooltriton.gateway.body_limit import BodyLimit
from pooltriton.gateway.cohere.routes import router as cohere_router
from pooltriton.gateway.disconnect import CancelOnDisconnect
from pooltriton.gateway.errors import ERROR_SCHEMA, APIError, error_body, invalid, openai_error
from pooltriton.gateway.guard import Guard
from pooltriton.gateway.media import MEDIA_TIMEOUT_S, MediaPolicy
from pooltriton.gateway.metrics import CLIENT_CLOSED, GatewayMetrics
from pooltriton.gateway.openai.routes import router as openai_router
from pooltriton.gateway.sagemaker.routes import router as sagemaker_router
from pooltriton.gateway.serving import Serving
from pooltriton.gateway.tei.protocol import ERROR_SCHEMA as TEI_ERROR_SCHEMA
from pooltriton.gateway.tei.routes import openai_router as tei_openai_router
from pooltriton.gateway.tei.routes import router as tei_router

MAX_BODY_BYTES = 8 * 1024 * 1024
# What a request may wait behind the work already queued (the stages' default queue timeout).
DEADLINE_S = QUEUE_TIMEOUT_MS / 1000

# Each dialect's routers (the paths it shares with another are routed by `shared`).
DIALECTS: dict[str, tuple[APIRouter, ...]] = {
    "openai": (openai_router,), "cohere": (cohere_router,), "tei": (tei_router, tei_openai_router),
    "sagemaker": (sagemaker_router,)}
TEI_PATHS = frozenset(route.path for route in tei_router.routes)  # answered in TEI's shape


def create_app(triton_url: str, api_key: str | None = None, client: Transport | None = None,
               admin_key: str | None = None, deadline_s: float | None = DEADLINE_S,
               coalesce: int = IN_FLIGHT, allowed_origins: Sequence[str] = ("*",),
               dialects: Collection[str] = tuple(DIALECTS), media: MediaPolicy | None = None) -> FastAPI:
    """`client`: the service's transport (a fake in the route tests); default: tritonclient's aio gRPC
    client to `triton_url`, made when the app starts. `admin_key`: Triton's, for its restricted
    repository index (default: POOLTRITON_ADMIN_KEY). `deadline_s`: a request whose estimated wait behind
    the work in flight exceeds it is refused at once with 429 and Retry-After (None: no admission).
    `coalesce`: concurrent small requests for one model travel to Triton merged once that many calls are
    in flight per model and options (client.coalesce; 0: one call per request). `allowed_origins`: the
    browser origins CORS lets call it (vLLM's and TEI's default: any; empty: no CORS headers). `dialects`: the
    dialects served (DIALECTS' names; /health, /version, /v1/models and /metrics always are). `media`: the
    image URLs it may fetch (default: data URLs only)."""
    unknown = set(dialects) - set(DIALECTS)
    if unknown:
        raise ValueError(f"unknown dialects {sorted(unknown)}: choose among {', '.join(DIALECTS)}")
    admin_key = admin_key if admin_key is not None else os.environ.get(ADMIN_KEY_ENV)
    headers = admin_headers(admin_key, "grpc") if admin_key else None
    observed = GatewayMetrics()
    serving = Serving(PoolingService(client, model=None, admin_headers=headers,  # type: ignore[arg-type]
                                     deadline_s=deadline_s, coalesce=coalesce,
                                     observe_call=observed.requests_per_call.observe), media)
    service = serving.service

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        if client is None:
            # One attempt: an overloaded server's answer goes back to the HTTP client at once (429 with
            # Retry-After) instead of being retried here on its behalf. Made in the server's event loop.
            service.transport = TritonTransport(triton_url, protocol="grpc", retries=1)
        try:
            await service.refresh()
        except InferenceServerException:
            pass  # Triton not up yet: /health says so, routes refresh on demand
        yield
        if client is None:
            await service.close()

    app = FastAPI(title="pooltriton gateway", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-, vLLM-, Cohere-, text-embeddings-inference- and SageMaker-compatible "
                  "pooling API in front of Triton")
    app.state.serving, app.state.pooling_service, app.state.metrics = serving, service, observed
    _middlewares(app, api_key, observed, tuple(allowed_origins))
    app.include_router(common.router)
    for name in DIALECTS:
        for router in DIALECTS[name] if name in dialects else ():
            app.include_router(router)
    app.include_router(shared.router(dialects))
    app.openapi = lambda: _openapi(app, dialects)
    return app


class BrowserCORS(CORSMiddleware):
    """Starlette's CORS, but a POST without an Origin header (any client but a browser: the short-request hot
    path) passes straight through: it has no CORS header to add, and a POST's answer is not cached, so no
    `Vary: Origin` is owed."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and \
                not any(name == b"origin" for name, _ in scope["headers"]):
            await self.app(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def _middlewares(app: FastAPI, api_key: str | None, observed: GatewayMetrics, origins: tuple[str, ...]) -> None:
    """Body limit, API key and metrics, cancellation on disconnect, CORS."""
    # Innermost: the guard below sees (and counts) its 413s; bodies are bounded however they are framed.
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES, error_body=error_body)

    app.add_middleware(Guard, api_key=api_key, observe=observed.observe, error_body=error_body)

    app.add_middleware(CancelOnDisconnect,
                       on_cancel=lambda scope, seconds: observed.observe(scope, CLIENT_CLOSED, seconds))

    # Outermost: a browser's preflight carries no API key, and is answered before the guard asks for one (the
    # request that follows it does). Starlette's CORSMiddleware is plain ASGI, as vLLM and TEI add it.
    if origins:
        app.add_middleware(BrowserCORS, allow_origins=list(origins), allow_methods=["GET", "POST"],
                           allow_headers=["*"])

    # Each router answers its own errors in its dialect's shape; these are for anything raised elsewhere.
    @app.exception_handler(APIError)
    async def api_error(_request: Request, error: APIError):
        return openai_error(error)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, error: RequestValidationError):
        return openai_error(invalid(error))


def _openapi(app: FastAPI, dialects: Collection[str]) -> dict:
    """FastAPI's document, with the invalid bodies' answer as served: 400 in OpenAI's error shape (TEI's
    routes: 422 in its shape), where FastAPI's default says 422 with its own body; and the bodies the
    shared paths read."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        invalid_body = {"description": "Invalid request", "content": {"application/json": {"schema": {
            "$ref": "#/components/schemas/ErrorResponse"}}}}
        tei_invalid = {"description": "Invalid request (text-embeddings-inference's shape)", "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/TEIErrorResponse"}}}}
        shared_paths = set(shared.TEI_KEYS)
        for path, operations in schema["paths"].items():
            for operation in operations.values():
                responses = operation.get("responses", {})
                if responses.pop("422", None) is None and path not in shared_paths:
                    continue  # nothing a client sends is validated
                if path in TEI_PATHS or (path in shared_paths and "tei" in dialects):
                    responses["422"] = tei_invalid
                if path not in TEI_PATHS:
                    responses["400"] = invalid_body
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        for unused in ("HTTPValidationError", "ValidationError"):
            schemas.pop(unused, None)
        for body in shared.bodies(dialects):
            document = body.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(document.pop("$defs", {}))
            schemas[body.__name__] = document
        schemas["ErrorResponse"], schemas["TEIErrorResponse"] = ERROR_SCHEMA, TEI_ERROR_SCHEMA
        app.openapi_schema = schema
    return app.openapi_schema


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(prog="pooltriton-gateway", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--triton", default="localhost:8001", help="Triton gRPC address")
    parser.add_argument("--host", default=os.environ.get("POOLTRITON_GATEWAY_HOST", "127.0.0.1"),
                        help="address to bind (default: POOLTRITON_GATEWAY_HOST or loopback; images bind all)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--api-key", default=os.environ.get("POOLTRITON_API_KEY"),
                        help="require 'Authorization: Bearer KEY' on every route but /health")
    parser.add_argument("--deadline-s", type=float, default=DEADLINE_S,
                        help="refuse at once (429, Retry-After) a request whose estimated wait behind the work in "
                        f"flight exceeds this (default {DEADLINE_S:g}; 0: no admission by work)")
    parser.add_argument("--coalesce", type=int, default=IN_FLIGHT, metavar="N",
                        help="send concurrent small requests for one model to Triton merged once N calls are in flight "
                        f"per model and options (default {IN_FLIGHT}; 0: one Triton call per request)")
    parser.add_argument("--allowed-origins", nargs="*", metavar="ORIGIN",
                        default=os.environ.get("POOLTRITON_ALLOWED_ORIGINS", "*").split(),
                        help="browser origins CORS lets call the gateway (default: POOLTRITON_ALLOWED_ORIGINS or any, "
                        "as vLLM and text-embeddings-inference; none given: no CORS headers)")
    parser.add_argument("--dialects", nargs="+", choices=list(DIALECTS), metavar="DIALECT",
                        default=os.environ.get("POOLTRITON_DIALECTS", " ".join(DIALECTS)).split(),
                        help=f"the API dialects served (default: POOLTRITON_DIALECTS or all of {', '.join(DIALECTS)}); "
                        "/health, /version, /v1/models and /metrics always are")
    parser.add_argument("--allowed-media-domains", nargs="*", metavar="DOMAIN",
                        default=os.environ.get("POOLTRITON_ALLOWED_MEDIA_DOMAINS", "").split(),
                        help="hosts image URLs may be fetched from (vLLM's flag; default: "
                        "POOLTRITON_ALLOWED_MEDIA_DOMAINS or none: data URLs only); never a private address")
    parser.add_argument("--allowed-local-media-path", type=Path, metavar="DIR",
                        default=os.environ.get("POOLTRITON_ALLOWED_LOCAL_MEDIA_PATH") or None,
                        help="a folder whose images file:// URLs may name (default: none)")
    parser.add_argument("--max-image-bytes", type=int, default=MAX_IMAGE_BYTES,
                        help=f"the largest image taken from a URL (default {MAX_IMAGE_BYTES})")
    parser.add_argument("--media-timeout-s", type=float, default=MEDIA_TIMEOUT_S,
                        help=f"the longest one image fetch may take (default {MEDIA_TIMEOUT_S:g})")
    parser.add_argument("--write-openapi", metavar="FILE", help="write the OpenAPI document and exit")
    args = parser.parse_args(argv)
    if args.max_image_bytes < 1 or args.media_timeout_s <= 0:
        parser.error("--max-image-bytes and --media-timeout-s must be positive")
    media = MediaPolicy(frozenset(d.lower() for d in args.allowed_media_domains), args.allowed_local_media_path,
                        args.max_image_bytes, args.media_timeout_s)
    if args.deadline_s < 0:
        parser.error("--deadline-s must be 0 (no admission by work) or positive")
    if args.coalesce < 0:
        parser.error("--coalesce must be 0 (one Triton call per request) or positive")
    if args.write_openapi:
        document = create_app(args.triton, dialects=args.dialects).openapi()
        Path(args.write_openapi).write_text(json.dumps(document, indent=2) + "\n")
        return 0
    app = create_app(args.triton, args.api_key, deadline_s=args.deadline_s or None, coalesce=args.coalesce,
                     allowed_origins=args.allowed_origins, dialects=args.dialects, media=media)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
