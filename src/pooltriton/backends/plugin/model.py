"""Plugin stage: INPUT (BYTES [n]) -> the user's pre_process -> the wrapped ensemble (BLS) ->
post_process -> OUTPUT (BYTES [n], one JSON document per input). See pooltriton.core.plugins."""

from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from pooltriton.backends.common import (
    CalledModelError,
    ModelArgs,
    call_model,
    error_response,
    input_array,
    internal_error,
    request_parameters,
)
from pooltriton.contract import ENCODE_PARAMETERS, PLUGIN_INPUT, PLUGIN_OUTPUT, TEXT
from pooltriton.contract.parameters import PluginParameters
from pooltriton.core.plugins import get_plugin
from pooltriton.core.tokenization import InputError, decode_texts


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        model = ModelArgs(args)
        parameters = model.stage(PluginParameters)
        self.name = parameters.plugin
        self.plugin = get_plugin(self.name, parameters.module)
        self.target = parameters.model
        self.outputs = list(parameters.outputs)

    def _call(self, texts: list[str], parameters: dict) -> dict[str, np.ndarray]:
        # The wrapped model sees only the parameters it understands.
        passed = {k: v for k, v in parameters.items() if k in ENCODE_PARAMETERS}
        return call_model(self.target, {TEXT: texts}, self.outputs, passed)

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            try:
                inputs = decode_texts(input_array(request, PLUGIN_INPUT))
                parameters = request_parameters(request)
                texts = self.plugin.pre_process(inputs, parameters)
                answers = self.plugin.post_process(inputs, self._call(texts, parameters), parameters)
                encoded = np.array([json.dumps(a).encode() for a in answers], dtype=np.object_)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(PLUGIN_OUTPUT, encoded)]))
            except CalledModelError as error:  # the wrapped ensemble's own code (a full queue stays retryable)
                responses.append(error.response())
            except (InputError, ValueError) as error:  # the plugin refused the input
                responses.append(error_response(f"plugin: {error}"))
            except Exception as error:  # the plugin's own bug: the server's fault, and it keeps serving
                responses.append(internal_error(f"plugin {self.name} failed: {type(error).__name__}: {error}"))
        return responses
