"""Check the exported encoder against the PyTorch module it came from, and record the error."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from pooltriton.activation import apply_activation
from pooltriton.export.encoder import PoolingEncoder, export_onnx, export_torchscript
from pooltriton.resolve import PoolerConfig
from pooltriton.runtimes import RUNTIMES, openvino_properties
from pooltriton.semantics import Truncation
from pooltriton.tokenization import TextTokenizer

# fp32: max |Δ| on the activated output (unit vectors / probabilities), the contract the tests hold
# the served answers to; the raw pooled error is recorded as well.
TOLERANCE = 1e-5
# bf16 / fp16: cosine of every output row to the fp32 reference (issue 5's bound for reduced precision).
MIN_COSINE, MEAN_COSINE = 0.98, 0.995

_WORDS = (
    "the model reads text and returns vectors; tokens, padding & masks: café naïve 東京 ünïcödé "
    "supercalifragilisticexpialidocious pneumonoultramicroscopic (parentheses) 12,345.67 e-mail@x.org"
).split()


class VerificationError(RuntimeError):
    pass


@dataclass
class Report:
    runtime: str
    cases: list[dict]
    max_abs_error_raw: float
    max_abs_error_activated: float
    min_cosine: float
    tolerance: float
    passed: bool
    precision: str = "fp32"
    mean_cosine: float = 1.0

    @property
    def bound(self) -> str:
        if self.precision == "fp32":
            return f"max |Δ| {self.max_abs_error_activated:.3g} <= {self.tolerance:g}"
        return (f"cosine mean {self.mean_cosine:.6f} >= {MEAN_COSINE}, "
                f"min {self.min_cosine:.6f} >= {MIN_COSINE}")


def sample_texts(count: int, max_words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, max_words))) for _ in range(count)]


def verification_batches(max_length: int) -> list[list[str]]:
    """Several batch sizes and lengths, up to (and, with truncation, at) the model's limit."""
    return [
        sample_texts(1, 3, seed=1),
        sample_texts(4, 20, seed=2),
        sample_texts(16, max(2, max_length // 3), seed=3),
        sample_texts(3, max_length * 2, seed=4),  # truncated to exactly max_length
    ]


def verify(
    encoder: PoolingEncoder,
    run_exported: Callable[[dict[str, np.ndarray]], np.ndarray],
    tokenizer: TextTokenizer,
    config: PoolerConfig,
    runtime: str,
    precision: str = "fp32",
) -> Report:
    """Run both on the same padded batches; token outputs are compared at real tokens only.
    `encoder` is the fp32 reference; the exported one may run in reduced precision."""
    cases, worst_raw, worst_act, min_cos, cosines = [], 0.0, 0.0, 1.0, []
    for texts in verification_batches(config.max_length):
        batch = tokenizer(texts, Truncation.END)
        feeds = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                 "token_type_ids": batch.token_type_ids}
        feeds = {name: feeds[name] for name in encoder.input_names}
        with torch.no_grad():
            expected = encoder(*(torch.from_numpy(feeds[n]) for n in encoder.input_names)).numpy()
        got = run_exported(feeds)
        if config.task.per_token:
            real = batch.attention_mask.astype(bool)
            expected, got = expected[real], got[real]
        raw = float(np.abs(expected - got).max())
        act_expected = apply_activation(expected, config.activation)
        act_got = apply_activation(got, config.activation)
        act = float(np.abs(act_expected - act_got).max())
        norms = np.linalg.norm(expected, axis=-1) * np.linalg.norm(got, axis=-1)
        row_cos = np.sum(expected * got, axis=-1) / np.maximum(norms, 1e-30)
        cosines.extend(row_cos.ravel().tolist())
        cos = float(np.min(row_cos))
        cases.append({"batch": len(texts), "max_tokens": int(batch.lengths.max()), "max_abs_error_raw": raw,
                      "max_abs_error_activated": act, "min_cosine": cos})
        worst_raw, worst_act, min_cos = max(worst_raw, raw), max(worst_act, act), min(min_cos, cos)
    mean_cos = float(np.mean(cosines))
    if precision == "fp32":
        passed = worst_act <= TOLERANCE
    else:
        passed = min_cos >= MIN_COSINE and mean_cos >= MEAN_COSINE
    report = Report(runtime, cases, worst_raw, worst_act, min_cos, TOLERANCE, passed, precision, mean_cos)
    if not report.passed:
        raise VerificationError(f"{runtime} {precision} export differs from PyTorch: not {report.bound} "
                                f"({asdict(report)})")
    return report


Runner = Callable[[dict[str, np.ndarray]], np.ndarray]


def onnx_runner(path: Path, precision: str, device: str) -> Runner:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda feeds: session.run(None, feeds)[0]


def openvino_runner(path: Path, precision: str, device: str) -> Runner:
    """Compiled the way the openvino backend compiles it (same properties helper)."""
    import openvino as ov

    parameters = RUNTIMES["openvino"].parameters(threads=0, precision=precision)
    compiled = ov.Core().compile_model(str(path), "CPU", openvino_properties(parameters.get))
    return lambda feeds: np.array(compiled(feeds)[0])


def torchscript_runner(path: Path, precision: str, device: str) -> Runner:
    module = torch.jit.load(str(path), map_location=device).eval()

    def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            return module(*(torch.from_numpy(v).to(device) for v in feeds.values())).float().cpu().numpy()

    return run


def exporter(runtime: str) -> tuple[Callable[[PoolingEncoder, Path, int, str], None],
                                     Callable[[Path, str, str], Runner]]:
    """(export(encoder, path, max_length, device), runner(path, precision, device)) for a runtime."""
    if runtime == "onnx":
        return (lambda encoder, path, max_length, _device: export_onnx(encoder, path, max_length)), onnx_runner
    if runtime == "openvino":  # the same fp32 ONNX file; OpenVINO applies bf16 when it compiles
        return (lambda encoder, path, max_length, _device: export_onnx(encoder, path, max_length)), openvino_runner
    return (lambda encoder, path, _max_length, device: export_torchscript(encoder, path, device)), torchscript_runner
