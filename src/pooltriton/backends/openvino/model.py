"""Python stand-in for Triton's native `openvino` backend: compiles the same model.onnx with OpenVINO.

Honours the native backend's parameters: INFERENCE_NUM_THREADS, NUM_STREAMS, PERFORMANCE_HINT and
HINT_BF16 ("YES": bfloat16 inference on CPUs with AVX512-BF16/AMX, the reduced-precision option). An
int8 export is OpenVINO IR (model.xml) quantized by NNCF; it compiles like any other.
With NUM_STREAMS > 1 the chunks of one dynamic batch run concurrently, one stream each (measured
+15 % for bf16 on 2 cores), while a batch of one chunk (a single request) runs on a one-stream
compilation that uses every thread, so streams do not cost single-text latency.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import triton_python_backend_utils as pb_utils

from pooltriton.backends.common import ModelArgs
from pooltriton.backends.shim import EncoderShim
from pooltriton.contract.parameters import EncoderParameters
from pooltriton.core.capabilities import load_warning
from pooltriton.core.runtimes import BF16, FP32, openvino_precision, openvino_properties


class TritonPythonModel(EncoderShim):
    default_filename = "model.onnx"
    single_row_multiple = 8  # OpenVINO compiles kernels per input shape

    def load(self, path: Path, model: ModelArgs) -> None:
        core, properties = ov.Core(), openvino_properties(model.text)
        streams = int(properties["NUM_STREAMS"])
        self.concurrent_chunks = max(streams, 1)
        latency = core.compile_model(str(path), "CPU", {**properties, "NUM_STREAMS": "1",
                                                          "PERFORMANCE_HINT": "LATENCY"})
        self.request = latency.create_infer_request()
        requested = model.stage(EncoderParameters).precision or (
            BF16 if properties["INFERENCE_PRECISION_HINT"] == "bf16" else FP32)
        warning = load_warning(requested, openvino_precision(latency))
        if warning:
            pb_utils.Logger.log_warn(f"{model.name}: {warning}")
        self.outputs = [latency.output(name) for name in self.output_names]
        self.queue = None
        if streams > 1:
            throughput = core.compile_model(str(path), "CPU", {**properties, "PERFORMANCE_HINT": "THROUGHPUT"})
            self.queue = ov.AsyncInferQueue(throughput, streams)
            self.queue.set_callback(self._collect)
            self.queue_outputs = [throughput.output(name) for name in self.output_names]
            self.collected: dict[int, list[np.ndarray]] = {}

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        results = self.request.infer(feeds)
        # The request reuses its output buffers on the next call: copy.
        return [np.array(results[output]) for output in self.outputs]

    def _collect(self, request: ov.InferRequest, index: int) -> None:
        self.collected[index] = [np.array(request.get_tensor(output).data) for output in self.queue_outputs]

    def run_chunks(self, chunks: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
        if self.queue is None or len(chunks) == 1:
            return [self.run(feeds) for feeds in chunks]
        self.collected = {}
        for index, feeds in enumerate(chunks):
            self.queue.start_async(feeds, index)
        self.queue.wait_all()
        return [self.collected[index] for index in range(len(chunks))]
