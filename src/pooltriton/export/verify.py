"""Check the exported encoder against the PyTorch module it came from, and record the error."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from pooltriton.core.activation import apply_activation
from pooltriton.core.capabilities import detect
from pooltriton.core.resolve import PoolerConfig
from pooltriton.core.runtimes import (
    BF16,
    FP32,
    RUNTIMES,
    TOLERANCES,
    openvino_precision,
    openvino_properties,
    torchscript_precision,
)
from pooltriton.core.semantics import Truncation
from pooltriton.core.tokenization import TextTokenizer
from pooltriton.export.encoder import PoolingEncoder, export_onnx, export_torchscript

# Bounds (pooltriton.core.runtimes.TOLERANCES): fp32 holds every raw output value within T x (1 + the largest
# |value| of that batch's reference), numpy's allclose with rtol = atol = T, so a classifier with large
# logits is held to the same relative accuracy as unit-length embeddings (a fixed 1e-5 on softmax output
# failed a valid tiny token classifier whose cosine was 0.9999998). bf16 / fp16: cosine of every output
# row to the fp32 reference, mean >= 1 - T and min >= 1 - 4 T.
TOLERANCE, REDUCED_TOLERANCE = TOLERANCES[FP32], TOLERANCES[BF16]
MEAN_COSINE, MIN_COSINE = 1 - REDUCED_TOLERANCE, 1 - 4 * REDUCED_TOLERANCE

_WORDS = (
    "the model reads text and returns vectors; tokens, padding & masks: café naïve 東京 ünïcödé "
    "supercalifragilisticexpialidocious pneumonoultramicroscopic (parentheses) 12,345.67 e-mail@x.org"
).split()


class VerificationError(RuntimeError):
    def __init__(self, message: str, report: Report | None = None) -> None:
        super().__init__(message)
        self.report = report


def bound_text(precision: str, tolerance: float) -> str:
    if precision == FP32:
        return f"max |Δ| <= {tolerance:g} x (1 + max |reference|) per batch"
    return f"cosine to fp32 mean >= {1 - tolerance:.6g}, min >= {1 - 4 * tolerance:.6g}"


@dataclass
class Report:
    runtime: str
    cases: list[dict]
    max_abs_error_raw: float
    max_abs_error_activated: float
    min_cosine: float
    tolerance: float
    passed: bool
    precision: str = FP32  # what the export asked for
    mean_cosine: float = 1.0
    executed_precision: str = FP32  # what the runtime compiled, read back from it
    bound: str = ""
    capabilities: dict = field(default_factory=dict)  # the exporting machine's (pooltriton.core.capabilities)

    def table(self) -> str:
        """The report as a short table (printed at export)."""
        rows = [f"verification of the {self.runtime} encoder against PyTorch fp32: asked {self.precision}, "
                f"ran {self.executed_precision}; bound: {self.bound}",
                f"  {'batch':>5} {'tokens':>6} {'max |Δ|':>9} {'allowed':>9} {'min cos':>10}"]
        for case in self.cases:
            allowed = f"{case['allowed_abs_error']:.2e}" if self.precision == FP32 else "-"
            rows.append(f"  {case['batch']:>5} {case['max_tokens']:>6} {case['max_abs_error_raw']:>9.2e} "
                        f"{allowed:>9} {case['min_cosine']:>10.7f}")
        rows.append(f"  {'passed' if self.passed else 'FAILED'}: mean cosine {self.mean_cosine:.7f}, "
                    f"min {self.min_cosine:.7f}")
        return "\n".join(rows)


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
    runner: Runner,
    tokenizer: TextTokenizer,
    config: PoolerConfig,
    runtime: str,
    precision: str = FP32,
    tolerance: float | None = None,
) -> Report:
    """Run both on the same padded batches; token outputs are compared at real tokens only.
    `encoder` is the fp32 reference; the exported one may run in reduced precision, and must run in
    the precision asked for (read back from the runtime, so a silent fp32 fallback is caught)."""
    tolerance = TOLERANCES[precision] if tolerance is None else tolerance
    cases, worst_raw, worst_act, min_cos, cosines, within = [], 0.0, 0.0, 1.0, [], True
    for texts in verification_batches(config.max_length):
        batch = tokenizer(texts, Truncation.END)
        feeds = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                 "token_type_ids": batch.token_type_ids}
        feeds = {name: feeds[name] for name in encoder.input_names}
        with torch.no_grad():
            expected = encoder(*(torch.from_numpy(feeds[n]) for n in encoder.input_names)).numpy()
        got = runner.run(feeds)
        if config.task.per_token:
            real = batch.attention_mask.astype(bool)
            expected, got = expected[real], got[real]
        raw = float(np.abs(expected - got).max())
        allowed = tolerance * (1 + float(np.abs(expected).max()))
        within = within and raw <= allowed
        act_expected = apply_activation(expected, config.activation)
        act_got = apply_activation(got, config.activation)
        act = float(np.abs(act_expected - act_got).max())
        norms = np.linalg.norm(expected, axis=-1) * np.linalg.norm(got, axis=-1)
        row_cos = np.sum(expected * got, axis=-1) / np.maximum(norms, 1e-30)
        cosines.extend(row_cos.ravel().tolist())
        cos = float(np.min(row_cos))
        cases.append({"batch": len(texts), "max_tokens": int(batch.lengths.max()), "max_abs_error_raw": raw,
                      "allowed_abs_error": allowed, "max_abs_error_activated": act, "min_cosine": cos})
        worst_raw, worst_act, min_cos = max(worst_raw, raw), max(worst_act, act), min(min_cos, cos)
    mean_cos = float(np.mean(cosines))
    if precision == FP32:
        passed = within
    else:
        passed = min_cos >= 1 - 4 * tolerance and mean_cos >= 1 - tolerance
    passed = passed and runner.precision == precision
    report = Report(runtime, cases, worst_raw, worst_act, min_cos, tolerance, passed, precision, mean_cos,
                    runner.precision, bound_text(precision, tolerance), detect().summary())
    if runner.precision != precision:
        raise VerificationError(
            f"the {runtime} runtime was asked for {precision} but compiled the encoder in {runner.precision} "
            f"on this CPU ({report.capabilities['class']}, flags from {report.capabilities['flags_source']}): "
            f"the export would not be what it says. "
            f"Use --precision auto or {runner.precision}.", report)
    if not report.passed:
        worst = max(cases, key=lambda c: c["max_abs_error_raw"] / c["allowed_abs_error"])
        measured = (f"max |Δ| {worst['max_abs_error_raw']:.3g} > {worst['allowed_abs_error']:.3g} allowed "
                    f"(batch {worst['batch']}, {worst['max_tokens']} tokens)" if precision == FP32
                    else f"cosine mean {mean_cos:.6f}, min {min_cos:.6f}")
        raise VerificationError(
            f"the {runtime} {precision} encoder differs from PyTorch beyond its bound ({report.bound}): "
            f"{measured}. If the model is known to be numerically sensitive, a looser --tolerance "
            f"(now {tolerance:g}) accepts it; otherwise the export is wrong.", report)
    return report


@dataclass(frozen=True)
class Runner:
    """An exported encoder file, loaded the way its Triton backend loads it."""

    run: Callable[[dict[str, np.ndarray]], np.ndarray]
    precision: str  # what the runtime really computes in


def onnx_runner(path: Path, precision: str, device: str) -> Runner:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return Runner(lambda feeds: session.run(None, feeds)[0], FP32)


def openvino_runner(path: Path, precision: str, device: str) -> Runner:
    """Compiled the way the openvino backend compiles it (same properties helper)."""
    import openvino as ov

    parameters = RUNTIMES["openvino"].parameters(threads=0, precision=precision)
    compiled = ov.Core().compile_model(str(path), "CPU", openvino_properties(parameters.get))
    return Runner(lambda feeds: np.array(compiled(feeds)[0]), openvino_precision(compiled))


def torchscript_runner(path: Path, precision: str, device: str) -> Runner:
    module = torch.jit.load(str(path), map_location=device).eval()

    def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            return module(*(torch.from_numpy(v).to(device) for v in feeds.values())).float().cpu().numpy()

    return Runner(run, torchscript_precision(module))


def exporter(runtime: str) -> tuple[Callable[[PoolingEncoder, Path, int, str], None],
                                     Callable[[Path, str, str], Runner]]:
    """(export(encoder, path, max_length, device), runner(path, precision, device)) for a runtime."""
    if runtime == "onnx":
        return (lambda encoder, path, max_length, _device: export_onnx(encoder, path, max_length)), onnx_runner
    if runtime == "openvino":  # the same fp32 ONNX file; OpenVINO applies bf16 when it compiles
        return (lambda encoder, path, max_length, _device: export_onnx(encoder, path, max_length)), openvino_runner
    return (lambda encoder, path, _max_length, device: export_torchscript(encoder, path, device)), torchscript_runner
