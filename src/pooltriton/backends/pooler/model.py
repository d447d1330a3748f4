"""Pooler/activation stage: the encoder's output -> the public answer (classification and token tasks;
an embed encoder normalises in its own graph and its ensemble has no pooler).

Sequence tasks: [n, C] -> activation (normalise / softmax / sigmoid / identity) -> [n, C].
Token tasks: [n, L, C] -> each text's real tokens (STEP: only its step-tag positions), activated,
concatenated to [T, C], plus TOKEN_COUNTS [n, 1] saying how many rows belong to each text.
Per-request parameter "use_activation": false returns raw vectors / logits (vLLM's option).
"""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from pooltriton.backends.common import ModelArgs, error_response, input_array, request_parameters, use_activation
from pooltriton.contract import ATTENTION_MASK, ENCODER_OUTPUT, INPUT_IDS, OUTPUT_NAMES, TOKEN_COUNTS
from pooltriton.contract.parameters import PoolerParameters
from pooltriton.core.activation import apply_activation
from pooltriton.core.semantics import Activation, Task


def real_token_rows(values: np.ndarray, mask: np.ndarray, ids: np.ndarray | None, step_tag_id: int | None,
                    drop_first: int | None = None, drop_last: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """[n, L, C] -> ([T, C], counts [n, 1]): no padding row leaves this function, nor a text's first real
    token where it is `drop_first`, nor its last where it is `drop_last` (either padding side)."""
    real = mask.astype(bool)
    keep = real & (ids == step_tag_id) if step_tag_id is not None else real.copy()
    rows = np.arange(real.shape[0])
    if drop_first is not None:
        _drop(keep, ids, rows, real.argmax(axis=1), drop_first)
    if drop_last is not None:
        _drop(keep, ids, rows, real.shape[1] - 1 - real[:, ::-1].argmax(axis=1), drop_last)
    counts = keep.sum(axis=1, dtype=np.int64).reshape(-1, 1)
    return values[keep], counts


def _drop(keep: np.ndarray, ids: np.ndarray, rows: np.ndarray, position: np.ndarray, token: int) -> None:
    """Each row's token at `position` left out where it is a real token and `token` (a row with no real
    token has none: argmax found a padding position)."""
    edge = keep[rows, position] & (ids[rows, position] == token)
    keep[rows[edge], position[edge]] = False


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        parameters = ModelArgs(args).stage(PoolerParameters)
        self.task = Task(parameters.task)
        self.activation = Activation(parameters.activation)
        self.use_activation = parameters.use_activation
        self.step_tag_id = parameters.step_tag_id
        self.drop = (parameters.drop_first, parameters.drop_last)
        self.output = OUTPUT_NAMES[self.task]

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            try:
                enabled = use_activation(request_parameters(request), self.use_activation)
            except ValueError as error:
                responses.append(error_response(str(error)))
                continue
            values = input_array(request, ENCODER_OUTPUT)
            tensors = []
            if self.task.per_token:
                values, counts = real_token_rows(values, input_array(request, ATTENTION_MASK),
                                                 input_array(request, INPUT_IDS), self.step_tag_id, *self.drop)
                tensors.append(pb_utils.Tensor(TOKEN_COUNTS, counts))
            activated = apply_activation(values, self.activation, enabled)
            tensors.insert(0, pb_utils.Tensor(self.output, np.ascontiguousarray(activated)))
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses
