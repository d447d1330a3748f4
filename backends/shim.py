"""Shared body of the Python stand-ins for Triton's native `onnxruntime` and `pytorch` backends.

Configs say `backend: "onnxruntime"` / `"pytorch"`, so the same repository runs on the NGC image
(native C++ backends) and on the pip-installed server (these shims, which Triton finds as
BACKENDS/<name>/model.py). They honour the native `intra_op_thread_count` parameter and batch
ragged requests themselves (see pooltriton.backends.ragged).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from pooltriton.backends.common import Counters, ModelArgs, input_array
from pooltriton.backends.ragged import RaggedStats, run_ragged


class EncoderShim:
    default_filename = "model"

    def load(self, path: Path, threads: int) -> None:
        raise NotImplementedError

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def initialize(self, args: dict[str, str]) -> None:
        model = ModelArgs(args)
        filename = model.config.get("default_model_filename") or self.default_filename
        self.input_names = [tensor["name"] for tensor in model.config["input"]]
        self.output_names = [tensor["name"] for tensor in model.config["output"]]
        # Outputs with a sequence axis ([L, ...] after the batch axis) are cut back per request.
        self.per_token = {t["name"] for t in model.config["output"] if len(t["dims"]) >= 2}
        self.pad_values = {"input_ids": int(model.parameter("pad_token_id", 0))}
        self.stats = RaggedStats()
        self.counters = Counters(model.name, ("pooltriton_tokens_total", "pooltriton_padding_tokens_total"))
        self.load(model.version_dir / filename, int(model.parameter("intra_op_thread_count", 0)))

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.output_names, self.run(feeds)))

    def execute(self, requests: list) -> list:
        batch = [{name: input_array(request, name) for name in self.input_names} for request in requests]
        real, computed = self.stats.real_tokens, self.stats.computed_tokens
        outputs = run_ragged(batch, self._run, self.per_token, self.pad_values, self.stats)
        real = self.stats.real_tokens - real
        self.counters.add("pooltriton_tokens_total", real)
        self.counters.add("pooltriton_padding_tokens_total", self.stats.computed_tokens - computed - real)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor(name, np.ascontiguousarray(v)) for name, v in out.items()])
            for out in outputs
        ]
