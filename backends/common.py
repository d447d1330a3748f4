"""Helpers shared by the Python-based backends (imported inside the Triton stub only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import triton_python_backend_utils as pb_utils

from pooltriton.repository import read_parameters


class ModelArgs:
    """What `initialize(args)` says about the model: its parsed config, parameters and version folder."""

    def __init__(self, args: dict[str, str]) -> None:
        self.config: dict[str, Any] = json.loads(args["model_config"])
        self.parameters = read_parameters(self.config)
        self.name: str = args["model_name"]
        self.version_dir = Path(args["model_repository"]) / args["model_version"]

    def parameter(self, key: str, default: Any = None) -> Any:
        """Parameters are strings in config.pbtxt; JSON-decode the ones that hold JSON."""
        if key not in self.parameters:
            return default
        text = self.parameters[key]
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text


def request_parameters(request: Any) -> dict[str, Any]:
    """KServe request parameters (e.g. {"truncate": "END"}); they reach every model of an ensemble."""
    raw = request.parameters()
    return json.loads(raw) if raw else {}


def error_response(message: str) -> Any:
    """A client error (HTTP 400 / gRPC INVALID_ARGUMENT) for this request only."""
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG))


def input_array(request: Any, name: str) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()
