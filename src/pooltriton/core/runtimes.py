"""The encoder runtimes an export can target, described once for `export/` and `backends/`.

Each runtime is a Triton backend name (native on the NGC image; a Python shim of the same name here),
the file it loads, the precisions and devices it serves, and the config parameters it reads, under
the native backend's own keys so a config means the same on both servers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FP32, BF16, FP16 = "fp32", "bf16", "fp16"
CPU, CUDA = "cpu", "cuda"
# Default verification bound per precision (export.verify says how each is applied; --tolerance overrides).
TOLERANCES = {FP32: 1e-5, BF16: 0.005, FP16: 0.005}


# The native onnxruntime and pytorch backends' thread parameter (written here, read by their shims).
INTRA_OP_THREADS = "intra_op_thread_count"

@dataclass(frozen=True)
class Runtime:
    name: str  # the export option
    backend: str  # Triton's backend name
    filename: str
    precisions: tuple[str, ...]
    devices: tuple[str, ...]

    def parameters(self, threads: int, precision: str) -> dict[str, str]:
        if self.backend == "openvino":
            # bf16 on 2 cores: two one-thread streams +15 % over one two-thread stream; fp32: no gain
            # (docs/performance.md). The shim keeps a one-stream compilation for single requests.
            streams = min(2, threads) if precision == BF16 and threads > 1 else 1
            return {"INFERENCE_NUM_THREADS": str(threads), "NUM_STREAMS": str(streams),
                    "PERFORMANCE_HINT": "LATENCY", "HINT_BF16": "YES" if precision == BF16 else "NO"}
        # onnxruntime and pytorch share this key; TorchScript weights already carry their dtype.
        return {INTRA_OP_THREADS: str(threads)}


RUNTIMES = {
    # On a GPU (the NGC image's native onnxruntime backend, CUDA execution provider; TensorRT optional)
    # the same device-independent file: it is exported and verified on the CPU.
    "onnx": Runtime("onnx", "onnxruntime", "model.onnx", (FP32,), (CPU, CUDA)),
    # Same model.onnx, compiled by OpenVINO: faster fp32 on x86 CPUs and a bf16 path (issue 5).
    "openvino": Runtime("openvino", "openvino", "model.onnx", (FP32, BF16), (CPU,)),
    # Traced on the export device in the export precision (fp16 is the GPU option).
    "torchscript": Runtime("torchscript", "pytorch", "model.pt", (FP32, BF16, FP16), (CPU, CUDA)),
}


def openvino_properties(parameter: Callable[[str, Any], Any]) -> dict[str, object]:
    """OpenVINO compile properties from the native openvino backend's config parameters."""
    properties: dict[str, object] = {"PERFORMANCE_HINT": str(parameter("PERFORMANCE_HINT", "LATENCY")),
                                     "NUM_STREAMS": str(parameter("NUM_STREAMS", 1))}
    threads = int(parameter("INFERENCE_NUM_THREADS", 0))
    if threads:
        properties["INFERENCE_NUM_THREADS"] = threads
    bf16 = str(parameter("HINT_BF16", "NO")).upper() == "YES"
    properties["INFERENCE_PRECISION_HINT"] = "bf16" if bf16 else "f32"
    return properties


# Element types as OpenVINO and torch name them -> our precision names.
_OPENVINO_TYPES = {"f32": FP32, "bf16": BF16, "f16": FP16}
_TORCH_TYPES = {"torch.float32": FP32, "torch.bfloat16": BF16, "torch.float16": FP16}


def openvino_precision(compiled: Any) -> str:
    """What a compiled OpenVINO model really computes in: the CPU plugin resolves the bf16 hint to f32
    where the CPU has no bf16 instructions, and says so only in this property."""
    return _OPENVINO_TYPES[compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()]


def torchscript_precision(module: Any) -> str:
    """The dtype a traced module's weights carry (it was traced in the serving precision)."""
    for parameter in module.parameters():
        if parameter.is_floating_point():
            return _TORCH_TYPES[str(parameter.dtype)]
    return FP32
