"""Request bodies over a limit get a 413, whatever their framing, and never grow the gateway's memory.

Answering before reading the body made uvicorn drop the connection under a client still sending (a
20 MB body saw a reset, not the 413), and a chunked body without Content-Length was not limited at all.
This ASGI middleware reads the body first, keeping at most `max_bytes` of it: over the limit it reads
the rest without keeping it and answers 413; otherwise it replays what it read to the app.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


class BodyLimit:
    def __init__(self, app: Any, max_bytes: int, error_body: Callable[[int, str, str], dict]) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.error_body = error_body

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks, size, more, over = [], 0, True, False
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left: nothing to answer
            body = message.get("body", b"")
            size += len(body)
            over = over or size > self.max_bytes
            if not over:
                chunks.append(body)
            more = message.get("more_body", False)
        if over:
            await self._too_large(send)
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)

    async def _too_large(self, send: Callable) -> None:
        payload = json.dumps(self.error_body(413, f"request body over {self.max_bytes} bytes",
                                             "invalid_request_error")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
