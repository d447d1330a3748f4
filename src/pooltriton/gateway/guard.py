"""API key, per-route metrics and the process-time header, as a plain ASGI middleware.

Starlette's `BaseHTTPMiddleware` (`@app.middleware("http")`) took ~19 % of the gateway's time under
short-request load (profiled): it wraps every response in a stream through an extra task.
This one only looks at the response's start message on its way out.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.responses import JSONResponse

# Health checks (Kubernetes probes, SageMaker's /ping, text-embeddings-inference's GET /) carry no API key.
OPEN_PATHS = frozenset({"/health", "/ping"})
OPEN_GETS = frozenset({"/"})  # POST / is an inference

# When this request's first service call started and its last one ended (written by serving.Serving's
# calls, which may overlap): TEI's x-compute-time, the part of the answer's time spent in Triton. The guard
# sets one per request.
CALLS_SPAN: ContextVar[list[float] | None] = ContextVar("calls_span", default=None)


class Guard:
    def __init__(self, app: Any, api_key: str | None, observe: Callable[[dict, int, float], None],
                 error_body: Callable[..., dict]) -> None:
        self.app, self.observe, self.error_body = app, observe, error_body
        self.expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        path = scope["path"]
        open_path = path in OPEN_PATHS or (path in OPEN_GETS and scope["method"] == "GET")
        if self.expected is not None and not open_path:
            given = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
            if not hmac.compare_digest(given, self.expected):  # constant time
                body = self.error_body(401, "missing or wrong API key (Authorization: Bearer ...)",
                                       "authentication_error")
                await JSONResponse(body, status_code=401)(scope, receive, send)
                self.observe(scope, 401, time.monotonic() - started)
                return
        status = 500
        span = [float("inf"), float("-inf")]
        CALLS_SPAN.set(span)

        async def send_with_time(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                elapsed_ms = (time.monotonic() - started) * 1000
                headers = MutableHeaders(scope=message)
                headers.append("x-process-time-ms", f"{elapsed_ms:.1f}")
                compute = scope.get("state", {}).get("compute")  # a TEI route's (app._metered)
                if compute is not None:
                    compute_ms = max(span[1] - span[0], 0.0) * 1000
                    for name, value in (("x-compute-time", int(compute_ms)), ("x-total-time", int(elapsed_ms)),
                                        ("x-compute-characters", compute[0]), ("x-compute-tokens", compute[1])):
                        headers.append(name, str(value))
            await send(message)

        try:
            await self.app(scope, receive, send_with_time)
        except Exception:
            self.observe(scope, 500, time.monotonic() - started)
            raise
        # A request cancelled because its client went away is counted by CancelOnDisconnect instead.
        self.observe(scope, status, time.monotonic() - started)
