"""Shared body of the Python stand-ins for Triton's native `onnxruntime` and `pytorch` backends.

Configs say `backend: "openvino"` / `"onnxruntime"` / `"pytorch"`, so the same repository runs on
the NGC image (native C++ backends) and on the pip-installed server (these shims, which Triton finds
as BACKENDS/<name>/model.py). Each shim reads the parameters of the native backend it stands in for
(intra_op_thread_count, INFERENCE_NUM_THREADS, HINT_BF16, ...) and batches ragged requests itself
(see pooltriton.backends.ragged).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from pooltriton.backends.common import CANCELLED, Counters, ModelArgs, input_array, skip_cancelled
from pooltriton.backends.ragged import TOKEN_BUDGET, RaggedStats, run_ragged
from pooltriton.contract import INPUT_IDS


class EncoderShim:
    default_filename = "model"
    single_row_multiple = 1  # see run_ragged

    def load(self, path: Path, model: ModelArgs) -> None:
        raise NotImplementedError

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def run_chunks(self, chunks: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
        """All chunks of one dynamic batch; runtimes with several streams override this."""
        return [self.run(feeds) for feeds in chunks]

    def initialize(self, args: dict[str, str]) -> None:
        model = ModelArgs(args)
        filename = model.config.get("default_model_filename") or self.default_filename
        self.input_names = [tensor["name"] for tensor in model.config["input"]]
        self.output_names = [tensor["name"] for tensor in model.config["output"]]
        # Outputs with a sequence axis ([L, ...] after the batch axis) are cut back per request.
        self.per_token = {t["name"] for t in model.config["output"] if len(t["dims"]) >= 2}
        self.pad_values = {INPUT_IDS: model.integer("pad_token_id", 0)}
        self.stats = RaggedStats()
        self.token_budget = model.integer("ragged_token_budget", TOKEN_BUDGET)
        self.max_width = model.integer("max_length", 0)
        self.counters = Counters(model.name, ("pooltriton_tokens_total", "pooltriton_padding_tokens_total", CANCELLED))
        self.load(model.version_dir / filename, model)

    def _run_chunks(self, chunks: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        return [dict(zip(self.output_names, outputs)) for outputs in self.run_chunks(chunks)]

    def finalize(self) -> None:
        self.counters.close()

    def execute(self, requests: list) -> list:
        return skip_cancelled(requests, self._execute, self.counters)

    def _execute(self, requests: list) -> list:
        batch = [{name: input_array(request, name) for name in self.input_names} for request in requests]
        real, computed = self.stats.real_tokens, self.stats.computed_tokens
        outputs = run_ragged(batch, self._run_chunks, self.per_token, self.pad_values, self.stats,
                             token_budget=self.token_budget, single_row_multiple=self.single_row_multiple,
                             max_width=self.max_width)
        real = self.stats.real_tokens - real
        self.counters.add("pooltriton_tokens_total", real)
        self.counters.add("pooltriton_padding_tokens_total", self.stats.computed_tokens - computed - real)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor(name, np.ascontiguousarray(v)) for name, v in out.items()])
            for out in outputs
        ]
