"""What this machine's CPU and encoder runtimes really run, detected in one place, and the precision
`--precision auto` picks from it.

Machines of one kind differ (AVX2 only, AVX-512, AVX-512 with bf16/VNNI, AMX), and OpenVINO silently
compiles a bf16 request in fp32 on AVX2, or emulates bf16 (slower than fp32) on AVX-512 without bf16
instructions. So precision is a decision made from what the hardware runs, stated with its reason, and
an explicit request the CPU cannot honour is an error at export, never a silent fallback.

`POOLTRITON_CPU_FLAGS` (flags separated by spaces or commas) replaces the flags read from
/proc/cpuinfo, and the runtimes' answers are then derived from those flags: tests use it to exercise
the branch this host lacks, and an operator can ask "what would a bf16 machine export?".
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

from pooltriton.core.runtimes import BF16, CPU, FP16, FP32, INT8

OVERRIDE_ENV = "POOLTRITON_CPU_FLAGS"
AUTO = "auto"
# Instructions that make bf16 matrix work native (OpenVINO's CPU plugin uses either).
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
FP16_FLAGS = ("avx512_fp16", "amx_fp16")
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
# The flags worth showing: what decides precision and speed of the encoder's matrix work.
SHOWN_FLAGS = ("fma", "avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
               "amx_tile", "amx_bf16", "amx_int8")
# OpenVINO's names for what its CPU plugin can run (Core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")).
_OPENVINO_NAMES = {FP32: "FP32", BF16: "BF16", FP16: "FP16"}


class PrecisionError(ValueError):
    """An explicit precision this CPU cannot run natively."""


@dataclass(frozen=True)
class Capabilities:
    flags: frozenset[str]
    source: str  # "/proc/cpuinfo" or the override variable
    model_name: str = ""
    # The runtimes' own answers (None: that runtime is not installed here).
    openvino: tuple[str, ...] | None = None
    torch: str | None = None
    onnxruntime: tuple[str, ...] | None = field(default=None)

    @property
    def bf16(self) -> bool:
        """bf16 runs natively: the CPU has the instructions and OpenVINO (where installed) agrees."""
        hardware = any(flag in self.flags for flag in BF16_FLAGS)
        return hardware and (self.openvino is None or _OPENVINO_NAMES[BF16] in self.openvino)

    @property
    def fp16(self) -> bool:
        return any(flag in self.flags for flag in FP16_FLAGS)

    @property
    def vnni(self) -> bool:
        return any(flag in self.flags for flag in VNNI_FLAGS)

    @property
    def cpu_class(self) -> str:
        """The class the README and docs/performance.md measure per."""
        if self.bf16:
            return "avx512-bf16" if "amx_bf16" not in self.flags else "amx"
        if "avx512f" in self.flags:
            return "avx512" + ("-vnni" if self.vnni else "")
        return "avx2" if "avx2" in self.flags else "baseline"

    def native(self, precision: str) -> bool:
        return {FP32: True, BF16: self.bf16, FP16: self.fp16, INT8: self.vnni}[precision]

    def summary(self) -> dict[str, object]:
        return {"cpu": self.model_name, "class": self.cpu_class, "flags": sorted(self.flags & set(SHOWN_FLAGS)),
                "flags_source": self.source, "openvino": list(self.openvino) if self.openvino else None,
                "torch": self.torch, "onnxruntime": list(self.onnxruntime) if self.onnxruntime else None,
                "auto_precision": {runtime: choose_precision(runtime, AUTO, CPU, self)[0]
                                   for runtime in ("openvino", "torchscript", "onnx")}}

    def report(self) -> str:
        """A few lines for `pooltriton capabilities` and the benchmark's header."""
        shown = " ".join(sorted(self.flags & set(SHOWN_FLAGS))) or "none of " + " ".join(SHOWN_FLAGS)
        lines = [f"CPU: {self.model_name or platform.processor() or 'unknown'} ({self.cpu_class})",
                 f"  flags ({self.source}): {shown}",
                 f"  OpenVINO OPTIMIZATION_CAPABILITIES: {_listed(self.openvino)}",
                 f"  torch CPU capability: {self.torch or 'not installed'}",
                 f"  ONNX Runtime providers: {_listed(self.onnxruntime)}"]
        for runtime in ("openvino", "torchscript", "onnx"):
            precision, reason = choose_precision(runtime, AUTO, CPU, self)
            lines.append(f"  --precision auto, --runtime {runtime}: {precision} ({reason})")
        return "\n".join(lines)


def _listed(values: tuple[str, ...] | None) -> str:
    return ", ".join(values) if values else "not installed"


def _cpuinfo() -> tuple[frozenset[str], str]:
    flags: set[str] = set()
    model = ""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset(), platform.processor()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "flags" and not flags:
            flags = set(value.split())
        elif key == "model name" and not model:
            model = value.strip()
    return frozenset(flags), model


def _openvino() -> tuple[str, ...] | None:
    try:
        import openvino as ov
    except ImportError:
        return None
    return tuple(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def _torch() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return str(torch.backends.cpu.get_cpu_capability())


def _onnxruntime() -> tuple[str, ...] | None:
    try:
        import onnxruntime
    except ImportError:
        return None
    return tuple(onnxruntime.get_available_providers())


def detect(flags: str | None = None, runtimes: bool = True) -> Capabilities:
    """This host's capabilities; `flags` (or POOLTRITON_CPU_FLAGS) stands in for the real CPU.
    runtimes=False asks no runtime (a Triton stage must not import torch just to log a warning)."""
    override = flags if flags is not None else os.environ.get(OVERRIDE_ENV)
    if override is None:
        return _host(runtimes)
    chosen = frozenset(override.replace(",", " ").split())
    # What OpenVINO reports on a CPU with these flags (its CPU plugin: FP32, INT8 and BIN always).
    openvino = ("FP32", *(["BF16"] if any(f in chosen for f in BF16_FLAGS) else []), "INT8", "BIN")
    return Capabilities(chosen, OVERRIDE_ENV, "override", openvino,
                        *((_torch(), _onnxruntime()) if runtimes else (None, None)))


@functools.lru_cache(maxsize=2)
def _host(runtimes: bool) -> Capabilities:
    flags, model = _cpuinfo()
    if not runtimes:
        return Capabilities(flags, "/proc/cpuinfo", model)
    return Capabilities(flags, "/proc/cpuinfo", model, _openvino(), _torch(), _onnxruntime())


def choose_precision(runtime: str, requested: str, device: str, capabilities: Capabilities,
                     quantize: bool = True) -> tuple[str, str]:
    """(precision, reason) for an export. `auto`: bf16 where the CPU runs it natively; else int8 where the
    runtime quantizes (openvino), the CPU has VNNI/AMX and `quantize` (the export falls back with
    quantize=False when int8 misses its bounds, or the task is not an embedding); fp32 otherwise (fp16 on
    a GPU). bf16 comes first because where both run it was faster and ~40 x more exact (MiniLM served on
    AVX512-BF16 + VNNI: 2.30 vs 1.79 x B, docs/performance.md). An explicit precision the CPU cannot
    run natively raises PrecisionError."""
    if device != CPU:
        if requested == AUTO:
            return (FP16, "GPU: fp16 tensor cores") if runtime == "torchscript" else (FP32, "the runtime's only")
        return requested, "as asked"
    if requested == AUTO:
        if runtime == "onnx":
            return FP32, "the onnx runtime serves fp32 only"
        if capabilities.bf16:
            return BF16, f"native bf16 ({', '.join(f for f in BF16_FLAGS if f in capabilities.flags)})"
        if runtime == "openvino" and quantize and capabilities.vnni:
            return INT8, (f"int8 matrix instructions ({', '.join(f for f in VNNI_FLAGS if f in capabilities.flags)}) "
                          f"without bf16, if the quantized model meets its bounds")
        int8 = f"no {'/'.join(VNNI_FLAGS)} for int8, " if runtime == "openvino" and quantize else ""
        return FP32, (f"{int8}no {'/'.join(BF16_FLAGS)} on this CPU ({capabilities.cpu_class}): "
                      f"bf16 would not run natively")
    if requested == INT8 and not capabilities.vnni:
        raise PrecisionError(
            f"--precision int8 needs a CPU with {' or '.join(VNNI_FLAGS)}; this one ({capabilities.model_name}, "
            f"{capabilities.cpu_class}) has none, so int8 would run no faster than fp32 and lose accuracy for "
            f"nothing. Use --precision auto (here: {choose_precision(runtime, AUTO, device, capabilities)[0]}).")
    if not capabilities.native(requested):
        needs = {BF16: BF16_FLAGS, FP16: FP16_FLAGS}[requested]
        raise PrecisionError(
            f"--precision {requested} needs a CPU with {' or '.join(needs)}; this one ({capabilities.model_name}, "
            f"{capabilities.cpu_class}) has none, so it would compute in fp32 (OpenVINO silently) or emulate it "
            f"slowly. Use --precision auto (here: fp32) or fp32.")
    return requested, "as asked"


def load_warning(requested: str, executed: str, capabilities: Capabilities | None = None) -> str | None:
    """What an encoder stage on the CPU logs at load when the repository was exported for a precision
    this CPU does not run natively (e.g. exported on an AVX512-BF16 machine, served on an AVX2 one)."""
    capabilities = capabilities or detect(runtimes=False)
    if executed != requested:
        return (f"exported for {requested}, but this CPU ({capabilities.cpu_class}) computes it in {executed}: "
                f"answers stay within the {requested} bound, but the speed-up it was exported for is not there. "
                f"Re-export with --precision auto on this machine (see `pooltriton capabilities`).")
    if not capabilities.native(executed):
        return (f"exported for {executed}, which this CPU ({capabilities.cpu_class}) has no instructions for: "
                f"it is emulated, slower than fp32. Re-export with --precision auto on this machine.")
    return None
