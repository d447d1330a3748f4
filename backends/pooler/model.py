"""Pooler/activation stage: the encoder's pooled output -> normalised embedding or probabilities.

Per-request parameter "use_activation": false returns raw vectors / logits (vLLM's option).
"""

from __future__ import annotations

import triton_python_backend_utils as pb_utils

from pooltriton.activation import apply_activation
from pooltriton.backends.common import ModelArgs, error_response, input_array, request_parameters
from pooltriton.semantics import Activation


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        model = ModelArgs(args)
        self.activation = Activation(model.parameter("activation"))
        self.use_activation = bool(model.parameter("use_activation", True))
        self.input_name = model.config["input"][0]["name"]
        self.output_name = model.config["output"][0]["name"]

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            enabled = request_parameters(request).get("use_activation", self.use_activation)
            if not isinstance(enabled, bool):
                responses.append(error_response(f"use_activation must be true or false, got {enabled!r}"))
                continue
            values = apply_activation(input_array(request, self.input_name), self.activation, enabled)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(self.output_name, values)]))
        return responses
