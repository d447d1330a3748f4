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
from pooltriton.semantics import Truncation
from pooltriton.tokenization import TextTokenizer

# Max |Δ| on the activated output (unit vectors / probabilities), the contract the tests hold the
# served answers to; the raw pooled error is recorded as well.
TOLERANCE = 1e-5

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
) -> Report:
    """Run both on the same padded batches; token outputs are compared at real tokens only."""
    cases, worst_raw, worst_act, min_cos = [], 0.0, 0.0, 1.0
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
        cos = float(np.min(np.sum(expected * got, axis=-1) / np.maximum(norms, 1e-30)))
        cases.append({"batch": len(texts), "max_tokens": int(batch.lengths.max()), "max_abs_error_raw": raw,
                      "max_abs_error_activated": act, "min_cosine": cos})
        worst_raw, worst_act, min_cos = max(worst_raw, raw), max(worst_act, act), min(min_cos, cos)
    report = Report(runtime, cases, worst_raw, worst_act, min_cos, TOLERANCE, worst_act <= TOLERANCE)
    if not report.passed:
        raise VerificationError(
            f"{runtime} export differs from PyTorch: max |Δ| {worst_act:.3g} > {TOLERANCE:g} ({asdict(report)})"
        )
    return report


def onnx_runner(path: Path) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda feeds: session.run(None, feeds)[0]


def torchscript_runner(path: Path) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    module = torch.jit.load(str(path)).eval()

    def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            return module(*(torch.from_numpy(v) for v in feeds.values())).numpy()

    return run


def exporter(runtime: str):
    """(export(encoder, path, max_length), runner(path)) for "onnx" or "torchscript"."""
    if runtime == "onnx":
        return export_onnx, onnx_runner
    return (lambda encoder, path, _max_length: export_torchscript(encoder, path)), torchscript_runner
