"""Check the exported encoder against the user's own library (export.reference), and record the error."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from pooltriton.contract import ACTIVATE
from pooltriton.core.activation import apply_activation
from pooltriton.core.capabilities import detect
from pooltriton.core.resolve import PoolerConfig
from pooltriton.core.runtimes import (
    BF16,
    FP32,
    INT8,
    MIN_COSINE_MULTIPLE,
    RUNTIMES,
    TOLERANCES,
    openvino_precision,
    openvino_properties,
    torchscript_precision,
)
from pooltriton.core.semantics import Activation, Truncation
from pooltriton.core.tokenization import TextTokenizer
from pooltriton.export.corpus import Corpus, corpus
from pooltriton.export.encoder import PoolingEncoder, export_onnx, export_torchscript
from pooltriton.export.quantize import batch_feeds, encoder_feeds, row_cosines
from pooltriton.export.reference import Reference

# Bounds. The truth is the reference (export.reference) in fp64. fp32: every raw output value of the export
# is within NOISE_MULTIPLE x fp32's own rounding on that batch (the reference in fp32 against fp64 on this CPU,
# so wider SIMD and another summation order move the bound with the kernels) plus a floor of
# T x (1 + the largest |value| of the batch's reference) (pooltriton.core.runtimes.TOLERANCES; a fixed
# relative bound alone sat at the edge of fp32 itself: 1.1e-5 measured on logits near 490 on an AVX-512
# host). A 0.1 % error is ~10x the sum (measured on the large-logit classifier of the tests).
# bf16 / fp16: cosine of every output row to the reference, mean >= 1 - T and min >= 1 - 4 T.
# int8: mean >= 1 - T and min >= 1 - 5 T (0.999 / 0.995), also on real sentences (export.corpus), and
# the top-10 neighbours of real queries among real documents as the reference finds them, >= 1 - 50 T
# (95 %; --tolerance moves all three).
NOISE_MULTIPLE = 8
NEIGHBOURS, AGREEMENT_MULTIPLE = 10, 50
TOLERANCE, REDUCED_TOLERANCE = TOLERANCES[FP32], TOLERANCES[BF16]
MEAN_COSINE, MIN_COSINE = 1 - REDUCED_TOLERANCE, 1 - 4 * REDUCED_TOLERANCE
# An embed encoder's in-graph normalisation is compared run by run on batches up to this length (a
# second run of an 8k batch would double the export's peak memory); longer ones are normalised here.
IN_GRAPH_CHECK_TOKENS = 512

_WORDS = (
    "the model reads text and returns vectors; tokens, padding & masks: café naïve 東京 ünïcödé "
    "supercalifragilisticexpialidocious pneumonoultramicroscopic (parentheses) 12,345.67 e-mail@x.org"
).split()


class VerificationError(RuntimeError):
    def __init__(self, message: str, report: Report | None = None) -> None:
        super().__init__(message)
        self.report = report


def agreement_bound(tolerance: float) -> float:
    """int8's share of top-k neighbours that must be the reference's."""
    return max(0.0, 1 - AGREEMENT_MULTIPLE * tolerance)


def bound_text(precision: str, tolerance: float) -> str:
    if precision == FP32:
        return (f"max |Δ| to the reference in fp64 <= {NOISE_MULTIPLE} x the reference's own fp32 max |Δ| + "
                f"{tolerance:g} x (1 + max |reference|) per batch")
    cosine = (f"cosine to the reference in fp64 mean >= {1 - tolerance:.6g}, "
              f"min >= {1 - MIN_COSINE_MULTIPLE[precision] * tolerance:.6g}")
    if precision == INT8:
        return (f"{cosine}, on random words and real sentences; top-{NEIGHBOURS} neighbours of real queries "
                f"agree with the reference's in >= {agreement_bound(tolerance):.0%}")
    return cosine


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
    max_fp32_noise: float = 0.0  # the reference in fp32 against fp64: its own rounding on these batches
    noise_multiple: float = NOISE_MULTIPLE
    reference: str = ""  # what the export was compared with
    retrieval: dict | None = None  # int8: neighbours of real queries against the reference's
    quantization: dict | None = None  # int8: how export.quantize made the model

    def table(self) -> str:
        """The report as a short table (printed at export)."""
        rows = [f"verification of the {self.runtime} encoder against {self.reference} in fp64: asked "
                f"{self.precision}, ran {self.executed_precision}; bound: {self.bound}",
                f"  {'batch':>5} {'tokens':>6} {'max |Δ|':>9} {'fp32 noise':>10} {'allowed':>9} {'min cos':>10}"]
        for case in self.cases:
            allowed = f"{case['allowed_abs_error']:.2e}" if self.precision == FP32 else "-"
            rows.append(f"  {case['batch']:>5} {case['max_tokens']:>6} {case['max_abs_error_raw']:>9.2e} "
                        f"{case['fp32_noise']:>10.2e} {allowed:>9} {case['min_cosine']:>10.7f}")
        if self.retrieval:
            rows.append(f"  top-{self.retrieval['neighbours']} neighbours of {self.retrieval['queries']} real "
                        f"queries among {self.retrieval['documents']} documents: {self.retrieval['agreement']:.1%} "
                        f"as the reference's")
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
    reference: Reference,
    runner: Runner,
    tokenizer: TextTokenizer,
    config: PoolerConfig,
    input_names: tuple[str, ...],
    runtime: str,
    precision: str = FP32,
    tolerance: float | None = None,
    real_texts: Corpus | None = None,
) -> Report:
    """Run the export on padded batches and the reference (the user's library, in fp64 and fp32) on
    each text alone; token outputs are compared at real tokens only. The export may run in reduced
    precision, and must run in the precision asked for (read back from the runtime, so a silent fp32
    fallback is caught)."""
    tolerance = TOLERANCES[precision] if tolerance is None else tolerance
    cases, cosines, within = [], [], True
    for texts in verification_batches(config.max_length):
        batch = tokenizer(texts, Truncation.END)
        feeds = batch_feeds(batch, input_names)
        expected = _stack(reference.run(feeds, torch.float64))
        fp32 = _stack(reference.run(feeds, torch.float32))
        got = runner.run(feeds).astype(np.float64)
        if config.task.per_token:
            got = got[batch.attention_mask.astype(bool)]
        if got.shape != expected.shape:
            raise VerificationError(
                f"the exported {runtime} encoder answers {len(texts)} texts with shape {got.shape}, "
                f"{reference.description} with {expected.shape}: the export does not compute what the model "
                f"does (a module of the model that the export lacks?)")
        _check_finite(runtime, texts, expected, fp32, got)
        # An encoder that activates in its graph (embed) is checked activated too, as it serves, on the
        # batches where a second run costs little: normalisation does not see the length.
        in_graph = ACTIVATE in input_names and int(batch.lengths.max()) <= IN_GRAPH_CHECK_TOKENS
        activated = (runner.run(batch_feeds(batch, input_names, activate=True)).astype(np.float64) if in_graph
                     else apply_activation(got, config.activation))
        case = _compare(expected, fp32, got, activated, config, tolerance)
        case["batch"], case["max_tokens"] = len(texts), int(batch.lengths.max())
        within = within and _excess(case) <= 1
        cosines.extend(case.pop("row_cosines"))
        cases.append(case)
    retrieval = None
    if precision == INT8:
        retrieval, sentence_cosines = check_retrieval(reference, runner, tokenizer, input_names,
                                                        real_texts or corpus())
        cosines.extend(sentence_cosines)
    mean_cos, min_cos = float(np.mean(cosines)), float(np.min(cosines))
    if precision == FP32:
        passed = within
    else:
        passed = min_cos >= 1 - MIN_COSINE_MULTIPLE[precision] * tolerance and mean_cos >= 1 - tolerance
        passed = passed and (retrieval is None or retrieval["agreement"] >= agreement_bound(tolerance))
    passed = passed and runner.precision == precision
    report = Report(runtime, cases, max(c["max_abs_error_raw"] for c in cases),
                    max(c["max_abs_error_activated"] for c in cases), min_cos, tolerance, passed, precision,
                    mean_cos, runner.precision, bound_text(precision, tolerance), detect().summary(),
                    max_fp32_noise=max(c["fp32_noise"] for c in cases), reference=reference.description,
                    retrieval=retrieval)
    if precision == INT8 and runner.precision != INT8:
        raise VerificationError(
            f"the int8 {runtime} encoder runs most of its matrix products in {runner.precision}: accuracy "
            f"control returned them to {runner.precision} to approach its bound ({report.bound}), so int8 "
            f"would cost accuracy and gain little. Use --precision auto or fp32.", report)
    if runner.precision != precision:
        raise VerificationError(
            f"the {runtime} runtime was asked for {precision} but compiled the encoder in {runner.precision} "
            f"on this CPU ({report.capabilities['class']}, flags from {report.capabilities['flags_source']}): "
            f"the export would not be what it says. "
            f"Use --precision auto or {runner.precision}.", report)
    if not report.passed:
        worst = max(cases, key=_excess)
        raw = (worst["max_abs_error_raw"], worst["allowed_abs_error"])
        activated = (worst["max_abs_error_activated"], worst["allowed_abs_error_activated"])
        kind, (error, bound) = max((("raw", raw), ("activated", activated)), key=lambda item: item[1][0] / item[1][1])
        measured = (f"max |Δ| {kind} {error:.3g} > {bound:.3g} allowed "
                    f"(batch {worst['batch']}, {worst['max_tokens']} tokens, fp32 noise "
                    f"{worst['fp32_noise']:.3g})" if precision == FP32
                    else f"cosine mean {mean_cos:.6f}, min {min_cos:.6f}"
                    + (f", top-{NEIGHBOURS} agreement {retrieval['agreement']:.1%}" if retrieval else ""))
        raise VerificationError(
            f"the {runtime} {precision} encoder differs from {reference.description} beyond its bound "
            f"({report.bound}): {measured}. If the model is known to be numerically sensitive, a looser "
            f"--tolerance (now {tolerance:g}) accepts it; otherwise the export is wrong.", report)
    return report


def check_retrieval(reference: Reference, runner: Runner, tokenizer: TextTokenizer, input_names: tuple[str, ...],
                    texts: Corpus, batch: int = 32) -> tuple[dict, list[float]]:
    """How often the export's top-k neighbours of real queries among real documents are the reference's
    (fp32, as users run it), and the cosine of every one of those texts to the reference."""
    theirs, ours = [], []
    everything = [*texts.documents, *texts.queries]
    for start in range(0, len(everything), batch):
        feeds = encoder_feeds(tokenizer, everything[start:start + batch], input_names)
        theirs.append(_stack(reference.run(feeds, torch.float32)))
        ours.append(runner.run(feeds).astype(np.float64))
    expected, got = np.concatenate(theirs), np.concatenate(ours)
    agreement = neighbour_agreement(expected, got, len(texts.documents))
    return ({"agreement": agreement, "neighbours": NEIGHBOURS, "queries": len(texts.queries),
             "documents": len(texts.documents), "corpus": texts.source},
            row_cosines(expected, got).tolist())


def neighbour_agreement(expected: np.ndarray, got: np.ndarray, documents: int, k: int = NEIGHBOURS) -> float:
    """Rows [:documents] are documents, the rest queries: the mean share of each query's k nearest
    documents (cosine) that both embeddings find."""
    def nearest(vectors: np.ndarray) -> np.ndarray:
        unit = vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-30)
        similarity = unit[documents:] @ unit[:documents].T
        return np.argsort(-similarity, axis=1)[:, :k]

    found = zip(nearest(expected), nearest(got), strict=True)
    return float(np.mean([len(set(a) & set(b)) / k for a, b in found]))


def _stack(rows: list[np.ndarray]) -> np.ndarray:
    """Per-text answers as one array: [B, W] for sequence outputs, [real tokens, W] for token outputs."""
    return np.concatenate(rows) if rows[0].ndim == 2 else np.stack(rows)


def _check_finite(runtime: str, texts: list[str], expected: np.ndarray, fp32: np.ndarray, got: np.ndarray) -> None:
    """NaN or inf is its own failure: no bound or cosine means anything then."""
    for who, values in (("the reference in fp64", expected), ("the reference in fp32", fp32),
                        (f"the exported {runtime} encoder", got)):
        if not np.isfinite(values).all():
            raise VerificationError(
                f"{who} produced NaN or inf on a batch of {len(texts)} texts "
                f"({int(np.size(values) - np.isfinite(values).sum())} of {np.size(values)} values): the "
                f"model is not numerically usable as exported")


def _compare(expected: np.ndarray, fp32: np.ndarray, got: np.ndarray, activated: np.ndarray, config: PoolerConfig,
             tolerance: float) -> dict:
    """One batch's errors against the fp64 reference, and the fp32 bound derived from its noise."""
    noise = float(np.abs(fp32 - expected).max())
    raw = float(np.abs(expected - got).max())
    allowed = NOISE_MULTIPLE * noise + tolerance * (1 + float(np.abs(expected).max()))
    act = float(np.abs(apply_activation(expected, config.activation) - activated).max())
    # Normalising divides a vector's error by its norm: the raw bound carried through it.
    shortest = float(np.linalg.norm(expected, axis=-1).min()) if config.activation is Activation.NORMALIZE else 1.0
    # A width-1 output (a 1-label classifier's logit, BGE-M3's token weights) has no direction per row: its
    # batch's column is the vector compared.
    pair = (expected, got) if expected.shape[-1] > 1 else (expected.reshape(1, -1), got.reshape(1, -1))
    row_cos = row_cosines(*pair)
    return {"max_abs_error_raw": raw, "fp32_noise": noise, "allowed_abs_error": allowed,
            "max_abs_error_activated": act, "allowed_abs_error_activated": allowed / max(min(shortest, 1.0), 1e-12),
            "min_cosine": float(np.min(row_cos)),
            "row_cosines": row_cos.ravel().tolist()}


def _excess(case: dict) -> float:
    """A batch's worst error as a multiple of its bound (raw, or activated as served)."""
    return max(case["max_abs_error_raw"] / case["allowed_abs_error"],
               case["max_abs_error_activated"] / case["allowed_abs_error_activated"])


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
