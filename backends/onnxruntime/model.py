"""A Python stand-in for Triton's native `onnxruntime` backend (absent from the pip-installed server).

Configs say `backend: "onnxruntime"` so the same repository runs on the NGC image (native C++
backend) and on the pip-installed server (this shim, which Triton finds as BACKENDS/onnxruntime/
model.py). It honours the same `intra_op_thread_count` parameter and, with ragged inputs, batches
mixed lengths itself (see pooltriton.backends.ragged).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

from pooltriton.backends.common import ModelArgs, input_array
from pooltriton.backends.ragged import RaggedStats, run_ragged


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        model = ModelArgs(args)
        filename = model.config.get("default_model_filename") or "model.onnx"
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(model.parameter("intra_op_thread_count", 0))
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(model.version_dir / filename), options,
                                            providers=["CPUExecutionProvider"])
        self.input_names = [tensor["name"] for tensor in model.config["input"]]
        self.output_names = [tensor["name"] for tensor in model.config["output"]]
        # Outputs with a sequence axis ([L, ...] after the batch axis) are cut back per request.
        self.per_token = {t["name"] for t in model.config["output"] if len(t["dims"]) >= 2}
        self.pad_values = {"input_ids": int(model.parameter("pad_token_id", 0))}
        self.stats = RaggedStats()

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self.session.run(self.output_names, feeds)
        return dict(zip(self.output_names, values))

    def execute(self, requests: list) -> list:
        batch = [{name: input_array(request, name) for name in self.input_names} for request in requests]
        outputs = run_ragged(batch, self._run, self.per_token, self.pad_values, self.stats)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor(name, np.ascontiguousarray(v)) for name, v in out.items()])
            for out in outputs
        ]
