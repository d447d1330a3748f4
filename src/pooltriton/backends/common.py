"""Helpers shared by the Python-based backends (imported inside the Triton stub only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import triton_python_backend_utils as pb_utils

from pooltriton.contract.admission import retry_after_in
from pooltriton.contract.config import read_parameters
from pooltriton.contract.parameters import StageParameters
from pooltriton.contract.requests import text_array

S = TypeVar("S", bound=StageParameters)


class ModelArgs:
    """What `initialize(args)` says about the model: its parsed config, parameters and version folder."""

    def __init__(self, args: dict[str, str]) -> None:
        self.config: dict[str, Any] = json.loads(args["model_config"])
        self.parameters = read_parameters(self.config)
        self.name: str = args["model_name"]
        self.version_dir = Path(args["model_repository"]) / args["model_version"]
        # KIND_GPU instances get their GPU here (as the native backends do); everything else runs on CPU.
        gpu = args.get("model_instance_kind") == "GPU"
        self.device = f"cuda:{args.get('model_instance_device_id', 0)}" if gpu else "cpu"

    def stage(self, kind: type[S]) -> S:
        """This stage's typed parameters (contract.parameters), as the export wrote them."""
        return kind.from_parameters(self.parameters)

    # config.pbtxt parameters are strings; each key is read as the type the export wrote it in, so a
    # value never changes type with its content (a label "1" stays a string).
    def text(self, key: str, default: str | None = None) -> str | None:
        return self.parameters.get(key, default)

    def integer(self, key: str, default: int | None = None) -> int | None:
        return int(self.parameters[key]) if key in self.parameters else default

    def flag(self, key: str, default: bool) -> bool:
        return json.loads(self.parameters[key]) is True if key in self.parameters else default

    def json(self, key: str, default: Any = None) -> Any:
        """Lists and objects (written as JSON by the export)."""
        return json.loads(self.parameters[key]) if key in self.parameters else default


def queue_timeout_s(config: dict[str, Any]) -> float:
    """The stage's queue timeout (its dynamic batching's default queue policy), 0 without one."""
    policy = config.get("dynamic_batching", {}).get("default_queue_policy", {})
    return int(policy.get("default_timeout_microseconds", 0)) / 1e6  # JSON writes 64-bit ints as text


def request_timeout_s(request: Any) -> float | None:
    """The request's own timeout (the client's; an ensemble passes it on to each step), None if it set none."""
    microseconds = request.timeout() if hasattr(request, "timeout") else 0
    return microseconds / 1e6 if microseconds else None


def request_parameters(request: Any) -> dict[str, Any]:
    """KServe request parameters (e.g. {"truncate": "END"}); they reach every model of an ensemble."""
    raw = request.parameters()
    return json.loads(raw) if raw else {}


def use_activation(parameters: dict[str, Any], default: bool) -> bool:
    """The request's use_activation (vLLM's option), else the model's default; ValueError if not a bool."""
    enabled = parameters.get("use_activation", default)
    if not isinstance(enabled, bool):
        raise ValueError(f"use_activation must be true or false, got {enabled!r}")
    return enabled


def error_response(message: str, code: int | None = None) -> Any:
    """An error for this request only: by default a client error (HTTP 400 / gRPC INVALID_ARGUMENT)."""
    code = pb_utils.TritonError.INVALID_ARG if code is None else code
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def internal_error(message: str) -> Any:
    """The stage's own failure (HTTP 500 / gRPC INTERNAL), not the caller's input."""
    return error_response(message, pb_utils.TritonError.INTERNAL)


# Triton 2.51's Python backend hands every BLS error back as INTERNAL, whatever the called model
# answered (measured: a full queue behind the scorer arrived as INTERNAL "Exceeds maximum queue size").
# Where the code is lost, Triton's own fixed rejection messages say that a retry may succeed, as does the
# tokenizer's admission by work (its message ends with when to retry); the rest are the called stages'
# refusals of the input (our stages answer INVALID_ARG for all else they refuse).
RETRYABLE_CORE_MESSAGES = ("Exceeds maximum queue size", "Request timeout expired", "is not healthy",
                           "is not ready", "is not found", "has no available versions")


def called_model_code(code: Any, message: str) -> Any:
    """The code a BLS error stands for: its own where Triton kept it, else recovered (see above)."""
    if code != pb_utils.TritonError.INTERNAL:
        return code
    if any(fragment in message for fragment in RETRYABLE_CORE_MESSAGES) or retry_after_in(message) is not None:
        return pb_utils.TritonError.UNAVAILABLE  # ... or the tokenizer's admission by work
    return pb_utils.TritonError.INVALID_ARG


class CalledModelError(Exception):
    """An error of a model called over BLS, with its Triton code kept: the caller answers with the same
    code (bad input stays 400, a full queue or a restarting stage a retryable UNAVAILABLE)."""

    def __init__(self, model: str, error: Any) -> None:
        super().__init__(error.message())
        self.model = model
        self.code = called_model_code(error.code() if hasattr(error, "code") else pb_utils.TritonError.INTERNAL,
                                      error.message())

    def response(self) -> Any:
        return error_response(str(self), self.code)


def call_model(model: str, inputs: dict[str, list[str]], outputs: list[str],
               parameters: dict[str, Any]) -> dict[str, Any]:
    """BLS: send texts ([n, 1] BYTES per input) to another model of this server and read its outputs.
    An error from it is raised as CalledModelError with its code."""
    tensors = [pb_utils.Tensor(name, text_array(texts, batched=True)) for name, texts in inputs.items()]
    response = pb_utils.InferenceRequest(model_name=model, inputs=tensors, requested_output_names=outputs,
                                         parameters=parameters).exec()
    if response.has_error():
        raise CalledModelError(model, response.error())
    return {name: pb_utils.get_output_tensor_by_name(response, name).as_numpy() for name in outputs}


def input_array(request: Any, name: str) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


class Counters:
    """Custom Prometheus counters (Triton's metrics port), labelled with the model name.

    pooltriton_tokens_total: real tokens the encoder computed on; pooltriton_padding_tokens_total:
    padding positions it computed on as well; pooltriton_truncations_total: texts the tokenizer cut.
    """

    DESCRIPTIONS: ClassVar[dict[str, str]] = {
        "pooltriton_tokens_total": "Real (non-padding) tokens processed",
        "pooltriton_padding_tokens_total": "Padding positions computed by the encoder",
        "pooltriton_truncations_total": "Texts truncated to the model's limit on request",
    }

    def __init__(self, model: str, names: tuple[str, ...]) -> None:
        # Families must outlive their metrics: keep both.
        self._families = {name: pb_utils.MetricFamily(name=name, description=self.DESCRIPTIONS[name],
                                                      kind=pb_utils.MetricFamily.COUNTER) for name in names}
        self._metrics = {name: family.Metric(labels={"model": model}) for name, family in self._families.items()}

    def add(self, name: str, value: int) -> None:
        if value:
            self._metrics[name].increment(value)

    def close(self) -> None:
        """Release metrics, then their families, while the stub's IPC is still up. Left to the
        interpreter's exit, their destructors ran after it was torn down and every stub that held
        counters segfaulted on each server stop (kernel log: `segfault ... in triton_python_backend_stub`)."""
        self._metrics.clear()
        self._families.clear()
