"""Between every dialect's routes and the pooling service: which model a body names, what the service's
errors mean in HTTP, and the encodings the dialects share (vLLM keeps this layer as its `serving_*`)."""

from __future__ import annotations

import base64
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response
from tritonclient.utils import InferenceServerException

from pooltriton.client.service import (
    ModelNotFound,
    Overloaded,
    PoolingService,
    RequestError,
    ServedModel,
    WrongTask,
)
from pooltriton.contract import RETRY_AFTER_S
from pooltriton.contract.requests import classify
from pooltriton.gateway.errors import APIError
from pooltriton.gateway.guard import CALLS_SPAN
from pooltriton.gateway.media import MediaPolicy

T = TypeVar("T")
B = TypeVar("B", bound="BaseModel")


POOLING_ROUTE = "/pooling"


class Serving:
    """The service as the routes use it: every call's errors as APIError with their HTTP status."""

    def __init__(self, service: PoolingService, media: MediaPolicy | None = None) -> None:
        self.service = service
        self.media = media or MediaPolicy()  # what image URLs it may fetch (gateway.media)

    async def model(self, name: str | None, task: str | None = None, route: str | None = None,
                    scoring: bool = False) -> ServedModel:
        """The served model a body names, which must serve `task` where one is given (vLLM answers 400,
        "the model does not support" the route's API), or the first for `task`; among models that share a
        name (--served-model-name) the one serving `task` (with `scoring`: the first that can score). The
        model list is read on first use, and again (at most every few seconds) for a name not in it: a model
        loaded since. `route`: the asking route, where its body names the task (/pooling)."""
        if not self.service.models:
            try:
                await self.service.refresh()
            except InferenceServerException as error:
                raise APIError(503, f"Triton is unavailable: {error.message()}") from None
        elif name is not None and name not in self.service.names:
            await self.service.refresh_names()
        try:
            return self.service.served(name, task, scoring)
        except WrongTask as error:
            raise wrong_task(error, route) from None
        except RequestError as error:
            raise APIError(400, str(error), error.param) from None
        except ModelNotFound as error:
            raise APIError(404, str(error), "model", "model_not_found" if name else None) from None

    async def __call__(self, call: Awaitable[T], fields: dict[str, str] | None = None) -> T:
        """A service call. Triton's error keeps its code: UNAVAILABLE from a server that is ready means
        its queue is full, the request waited past the queue timeout, or the tokenizer's admission by work
        refused it: 429 with Retry-After (as that refusal says, else RETRY_AFTER_S), the client's to retry;
        from a server that is not, 503."""
        span, started = CALLS_SPAN.get(), time.monotonic()
        try:
            return await call
        except WrongTask as error:
            raise wrong_task(error) from None
        except RequestError as error:  # named as the route's body names the field (`fields`: service -> body)
            raise APIError(400, str(error), (fields or {}).get(error.param, error.param)) from None
        except ModelNotFound as error:
            raise APIError(404, str(error), "model") from None
        except Overloaded as error:  # refused by admission before anything was sent
            raise APIError(429, str(error), retry_after=error.retry_after_s) from None
        except InferenceServerException as error:
            failure = classify(error)
            if failure.retryable and await self.service.ready():
                raise APIError(429, f"overloaded, retry later: {failure.message}",
                               retry_after=failure.retry_after_s or RETRY_AFTER_S) from None
            raise APIError(failure.status, failure.message) from None
        finally:
            if span is not None:  # the guard's, for TEI's x-compute-time
                span[0], span[1] = min(span[0], started), max(span[1], time.monotonic())


def served(request: Request) -> tuple[Serving, PoolingService]:
    """The app's serving layer and its pooling service."""
    serving: Serving = request.app.state.serving
    return serving, serving.service


def header(prefix: str, asked: str | None, model: ServedModel) -> dict[str, Any]:
    """An answer's id, created and model: the name the client asked for (an alias, --served-model-name) is
    the one answered, as vLLM answers its served name; with none asked, the model's own."""
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "created": int(time.time()), "model": asked or model.name}


async def health_answer(request: Request) -> Response:
    """/health's answer (SageMaker's /ping's too): 503 while Triton is not ready."""
    if not await served(request)[1].ready():
        raise APIError(503, "Triton is not ready", kind="service_unavailable")
    return JSON({"status": "ok"})


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("pooltriton")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree without installing
        return "unknown"


async def json_body(request: Request) -> Any:
    """The body of a route that reads it itself (it takes several dialects' shapes)."""
    from fastapi.exceptions import RequestValidationError

    try:
        return json.loads(await request.body())
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        raise RequestValidationError([{"loc": ("body",), "msg": "the body is not JSON", "type": "json_invalid"}]) \
            from None


def validated(kind: type[B], body: Any) -> B:
    """A body read by its route (json_body) as `kind`; invalid, answered as any invalid body is."""
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError

    try:
        return kind.model_validate(body)
    except ValidationError as error:
        raise RequestValidationError(error.errors()) from None


def as_texts(value: Any, field: str = "input") -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise APIError(400, f"{field}: token-id input is not supported by this server yet; send text", field)


def encode_inputs(value: Any) -> tuple[list[str], dict[str, Any]]:
    """A body's `input` as the service's texts and the parameters they need: text, or OpenAI's and vLLM's
    pre-tokenised ids (each row travels as its JSON list, read by the tokenizer stage)."""
    token_rows = as_token_ids(value)
    if token_rows is not None:
        return [json.dumps(row) for row in token_rows], {"input_format": "token_ids"}
    return as_texts(value), {}


def as_token_ids(value: Any) -> list[list[int]] | None:
    """OpenAI's pre-tokenised input: a list of ids, or a list of such lists; None for text."""
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        return value
    return None


def usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": tokens, "total_tokens": tokens}


def base64_vector(vector: np.ndarray, dtype: str = "float32", endianness: str = "native") -> str:
    """OpenAI's base64 (float32, this machine's byte order), or vLLM's embed_dtype and endianness."""
    return base64.b64encode(packed(vector, dtype, endianness)).decode()


def packed(vector: np.ndarray, dtype: str = "float32", endianness: str = "native") -> bytes:
    """An answer's values as bytes of `dtype` in `endianness` order, row by row (vLLM's tensor2binary)."""
    values = np.asarray(vector).astype(np.float32)
    if dtype == "float16":
        values = values.astype(np.float16)
    elif dtype == "bfloat16":  # the upper half of float32, rounded to nearest even as torch casts
        bits = values.view(np.uint32).astype(np.uint64)  # no carry wraps around
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        values = np.where(np.isnan(values), np.uint16(0x7FC0), rounded)  # a carry must not make NaN inf
    if endianness != "native" and endianness != sys.byteorder:
        values = values.byteswap()
    return values.tobytes()


def encoded_answers(answers: Sequence[np.ndarray], encoding: str, dtype: str, endianness: str) -> list[Any]:
    """/v1/embeddings' and /pooling's answers in their `encoding_format`: float lists or base64 strings."""
    if encoding == "base64":
        return [base64_vector(answer, dtype, endianness) for answer in answers]
    return [np.asarray(answer).tolist() for answer in answers]


def bytes_answer(answers: Sequence[np.ndarray], encoding: str, dtype: str, endianness: str,
                 header: dict[str, Any]) -> Response:
    """vLLM's `bytes` / `bytes_only` answer: every answer's packed values back to back as the body; with
    `bytes`, a `metadata` header holds `header` (id, created, model, usage) and per answer its index, dtype,
    byte order, start and end in the body and shape (vLLM's decode_pooling_output reads them)."""
    items, body, offset = [], [], 0
    for index, answer in enumerate(answers):
        data = packed(answer, dtype, endianness)
        items.append({"index": index, "embed_dtype": dtype, "endianness": endianness, "start": offset,
                      "end": offset + len(data), "shape": list(np.shape(answer))})
        body.append(data)
        offset += len(data)
    headers = None if encoding == "bytes_only" else {"metadata": json.dumps({**header, "data": items})}
    return Response(b"".join(body), media_type="application/octet-stream", headers=headers)


try:  # JSON of numpy arrays straight from their buffers (requirements-serve.txt installs it)
    import orjson

    def dump_json(body: Any) -> bytes:
        return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
except ImportError:  # pragma: no cover - the same answer, slower
    import json

    def dump_json(body: Any) -> bytes:
        return json.dumps(body, default=lambda value: value.tolist()).encode()


class JSON(Response):
    """A JSON answer serialised once, numpy arrays included: a route returning it skips FastAPI's
    `jsonable_encoder` walk over every float (~19 % of the gateway's time, profiled)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dump_json(content)


def wrong_task(error: WrongTask, route: str | None = None) -> APIError:
    """vLLM's 400 for a model that does not serve the route's API, with the route that does serve it, or
    on /pooling (which serves every task, named in its body) the task to name."""
    served = error.model
    if route == POOLING_ROUTE:
        return APIError(400, f'{error}: send "task": "{served.task}" or leave it out', "task")
    hint = POOLING_ROUTE if served.per_token else "/classify" if served.task == "classify" else None
    where = f"; use {hint}" if hint else ""
    return APIError(400, f"{error}: it does not serve this API{where}", "model")
