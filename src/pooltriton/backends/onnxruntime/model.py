"""Python stand-in for Triton's native `onnxruntime` backend: runs the same model.onnx."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from pooltriton.backends.common import ModelArgs
from pooltriton.backends.shim import EncoderShim
from pooltriton.core.runtimes import INTRA_OP_THREADS


class TritonPythonModel(EncoderShim):
    default_filename = "model.onnx"

    def load(self, path: Path, model: ModelArgs) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = model.integer(INTRA_OP_THREADS, 0)
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(self.output_names, feeds)
