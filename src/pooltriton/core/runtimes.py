"""The encoder runtimes an export can target, described once for `export/` and `backends/`.

Each runtime is a Triton backend name (native on the NGC image; a Python shim of the same name here),
the file it loads, the precisions and devices it serves, and the config parameters it reads, under
the native backend's own keys so a config means the same on both servers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

FP32, BF16, FP16, INT8 = "fp32", "bf16", "fp16", "int8"
CPU, CUDA = "cpu", "cuda"
# Default verification bound per precision (export.verify says how each is applied; --tolerance overrides).
# int8: cosine mean >= 0.999 and min >= 0.995, and retrieval neighbours as fp32's.
TOLERANCES = {FP32: 1e-5, BF16: 0.005, FP16: 0.005, INT8: 0.001}
# The minimum cosine of a reduced precision is 1 - this x its tolerance.
MIN_COSINE_MULTIPLE = {BF16: 4, FP16: 4, INT8: 5}
# int8 on OpenVINO's CPU plugin: int8 weights, and activations quantized at run time per group of input
# channels (VNNI/AMX products). Larger groups run faster and lose more (MiniLM in-process, smoothed: 32 ->
# 128 ~1.2 x; docs/performance.md). Accuracy control takes the largest of these whose loss stays within
# half the tolerance, and the export writes it into the IR's runtime options, so every compilation of the
# file (verification, the stage, Triton's native backend) uses what was verified; an OpenVINO that
# ignores them uses its default, 32: slower and more exact.
INT8_ACTIVATION_GROUPS = (128, 64, 32)
DYNAMIC_QUANTIZATION = "DYNAMIC_QUANTIZATION_GROUP_SIZE"


# The native onnxruntime and pytorch backends' thread parameter (written here, read by their shims).
INTRA_OP_THREADS = "intra_op_thread_count"

@dataclass(frozen=True)
class Runtime:
    name: str  # the export option
    backend: str  # Triton's backend name
    filename: str
    precisions: tuple[str, ...]
    devices: tuple[str, ...]
    # Precisions whose weights are rewritten at export into another file (OpenVINO IR for int8).
    filenames: tuple[tuple[str, str], ...] = ()

    def artefact(self, precision: str) -> str:
        """The file the encoder loads in this precision."""
        return dict(self.filenames).get(precision, self.filename)

    def parameters(self, threads: int, precision: str) -> dict[str, str]:
        if self.backend == "openvino":
            # bf16 on 2 cores: two one-thread streams +15 % over one two-thread stream; fp32: no gain
            # (docs/performance.md). The shim keeps a one-stream compilation for single requests.
            streams = min(2, threads) if precision == BF16 and threads > 1 else 1
            # int8: what is not an int8 product (attention, norms, activations) in bf16 where the CPU has
            # it natively (the plugin resolves the hint to f32 where not): 1.80-2.02 vs 1.74-1.75 x fp32 in-process
            # at the same cosine (docs/performance.md); in f32 where bf16 would stop the products being int8.
            bf16 = precision == BF16 or (precision == INT8 and bf16_keeps_int8_products())
            return {"INFERENCE_NUM_THREADS": str(threads), "NUM_STREAMS": str(streams),
                    "PERFORMANCE_HINT": "LATENCY", "HINT_BF16": "YES" if bf16 else "NO"}
        # onnxruntime and pytorch share this key; TorchScript weights already carry their dtype.
        return {INTRA_OP_THREADS: str(threads)}


RUNTIMES = {
    # On a GPU (the NGC image's native onnxruntime backend, CUDA execution provider; TensorRT optional)
    # the same device-independent file: it is exported and verified on the CPU.
    "onnx": Runtime("onnx", "onnxruntime", "model.onnx", (FP32,), (CPU, CUDA)),
    # Same model.onnx, compiled by OpenVINO: faster fp32 on x86 CPUs and a bf16 path; int8 is
    # the model quantized by NNCF at export (export.quantize), saved as OpenVINO IR.
    "openvino": Runtime("openvino", "openvino", "model.onnx", (FP32, BF16, INT8), (CPU,),
                        filenames=((INT8, "model.xml"),)),
    # Traced on the export device in the export precision (fp16 is the GPU option).
    "torchscript": Runtime("torchscript", "pytorch", "model.pt", (FP32, BF16, FP16), (CPU, CUDA)),
}


@cache
def bf16_keeps_int8_products() -> bool:
    """Whether OpenVINO's CPU plugin, compiling in bf16, still quantizes the activations of products with
    int8 weights at run time. On AMX hosts it does not (measured with OpenVINO 2026.4.1: the same answers
    with the quantization group at 32, 128, 384 or off): it turns the int8 weights into bf16 AMX products,
    no faster than bf16 and not int8. Asked once of a small product with int8 weights: whether switching
    run-time quantization off changes its answer."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    rng = np.random.default_rng(0)
    size = 256
    x = ops.parameter([-1, size], np.float32)
    # NNCF's pattern (u8 weights and zero points, converted): the plugin takes it for compressed weights.
    weights = ops.convert(ops.constant(rng.integers(0, 256, (size, size), dtype=np.uint8)), "f32")
    zero_point = ops.convert(ops.constant(np.full((size, 1), 128, dtype=np.uint8)), "f32")
    scale = ops.constant((rng.random((size, 1)) * 0.01).astype(np.float32))
    product = ops.matmul(x, ops.multiply(ops.subtract(weights, zero_point), scale), False, True)
    model, core = ov.Model([product], [x]), ov.Core()
    feeds = rng.standard_normal((4, size)).astype(np.float32)
    answers = [core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "bf16", DYNAMIC_QUANTIZATION: group,
                                                  "INFERENCE_NUM_THREADS": 1})(feeds)[0] for group in (32, 0)]
    return not np.array_equal(*answers)


def openvino_properties(parameter: Callable[[str, Any], Any]) -> dict[str, object]:
    """OpenVINO compile properties from the native openvino backend's config parameters."""
    properties: dict[str, object] = {"PERFORMANCE_HINT": str(parameter("PERFORMANCE_HINT", "LATENCY")),
                                     "NUM_STREAMS": str(parameter("NUM_STREAMS", 1))}
    threads = int(parameter("INFERENCE_NUM_THREADS", 0))
    if threads:
        properties["INFERENCE_NUM_THREADS"] = threads
    bf16 = str(parameter("HINT_BF16", "NO")).upper() == "YES"
    properties["INFERENCE_PRECISION_HINT"] = "bf16" if bf16 else "f32"
    group = parameter(DYNAMIC_QUANTIZATION, None)  # int8 IR carries its own; a config key overrides it
    if group is not None:
        properties[DYNAMIC_QUANTIZATION] = int(group)
    return properties


# Element types as OpenVINO and torch name them -> our precision names.
_OPENVINO_TYPES = {"f32": FP32, "bf16": BF16, "f16": FP16}
_TORCH_TYPES = {"torch.float32": FP32, "torch.bfloat16": BF16, "torch.float16": FP16}


def openvino_precision(compiled: Any) -> str:
    """What a compiled OpenVINO model really computes in: the CPU plugin resolves the bf16 hint to f32
    on AVX2 (and emulates bf16 on AVX-512 without bf16), and says so only in this property. A quantized
    model is int8 when most of its matrix products run on 8-bit integers in the executed graph."""
    int8, products = openvino_int8_products(compiled)
    if products and 2 * int8 >= products:
        return INT8
    return _OPENVINO_TYPES[compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()]


def openvino_int8_products(compiled: Any) -> tuple[int, int]:
    """(matrix products the CPU plugin runs in int8, all matrix products) of a compiled model: those
    whose activations arrive in 8 bits (a statically quantized graph), or whose weights are 8-bit while
    the plugin quantizes activations at run time (for bf16 activations, only where
    bf16_keeps_int8_products). int8 weights alone are decompressed to float: no faster, so they do not
    count."""
    dynamic = int(compiled.get_property(DYNAMIC_QUANTIZATION)) > 0
    int8 = products = 0
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if info["layerType"].astype(str) in ("FullyConnected", "MatMul", "Convolution"):
            products += 1
            types = [op.input(i).get_element_type().get_type_name() for i in range(min(2, op.get_input_size()))]
            quantized_at_run_time = dynamic and types[-1] in ("u8", "i8") and (
                types[0] != "bf16" or bf16_keeps_int8_products())
            int8 += types[0] in ("u8", "i8") or quantized_at_run_time
    return int8, products


def torchscript_precision(module: Any) -> str:
    """The dtype a traced module's weights carry (it was traced in the serving precision)."""
    for parameter in module.parameters():
        if parameter.is_floating_point():
            return _TORCH_TYPES[str(parameter.dtype)]
    return FP32
