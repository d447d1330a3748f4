"""The gateway's error: `APIError`, answered in the shape of the dialect whose route raised it.

Each dialect's router renders its own errors (`shaped_route`), validation errors included, so a body on a
path two dialects share is answered in the shape of the dialect it was read as. OpenAI's shape is the
default, for the shared routes and the middlewares.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.retry_after = status, message, param, retry_after
        self.kind = kind or {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                             413: "invalid_request_error",
                             429: "rate_limit_error", 503: "service_unavailable"}.get(status, "server_error")

    @property
    def headers(self) -> dict[str, str] | None:
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None


def error_body(status: int, message: str, kind: str, param: str | None = None) -> dict:
    """OpenAI's error shape (vLLM's too)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


# error_body's shape, for the OpenAPI document.
ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "code": {"type": "integer"}}}}}


def openai_error(error: APIError) -> Response:
    return JSONResponse(error_body(error.status, error.message, error.kind, error.param), status_code=error.status,
                        headers=error.headers)


def invalid(error: RequestValidationError) -> APIError:
    """A body that failed validation: 400, as vLLM and OpenAI answer it (FastAPI's own is 422)."""
    first = error.errors()[0] if error.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", []) if p != "body")
    # A whole-body rule (a validator) names no field; pydantic prefixes its message.
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    return APIError(400, f"{where}: {message}" if where else message, where or None)


Render = Callable[[APIError], Response]
Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def rendered(handler: Handler, render: Render) -> Handler:
    """`handler` with its APIErrors and validation errors answered by `render`."""
    async def shaped(request: Request) -> Response:
        try:
            return await handler(request)
        except APIError as error:
            return render(error)
        except RequestValidationError as error:
            return render(invalid(error))
    return shaped


def shaped_route(render: Render) -> type[APIRoute]:
    """A router's route class whose errors come in one dialect's shape (`render`)."""

    class ShapedRoute(APIRoute):
        def get_route_handler(self) -> Handler:
            return rendered(super().get_route_handler(), render)

    return ShapedRoute
