"""int8 for the openvino runtime: the exported fp32 encoder quantized by NNCF, with accuracy control.

Post-training quantization (NNCF's transformer preset: SmoothQuant, per-channel weights) is calibrated
on real sentences (export.corpus). Its accuracy control then measures the quantized encoder against
the fp32 one on held-out sentences and returns layers to fp32, most harmful first, until the metric
drops by at most INT8 tolerance: the metric is min(mean cosine, 1 - (1 - min cosine) / 5), so a drop
within 0.001 means mean >= 0.999 and min >= 0.995 (the bound export.verify then checks against the
user's library, with the retrieval check on text neither step saw).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pooltriton.contract import ACTIVATE
from pooltriton.core.runtimes import INT8, MIN_COSINE_MULTIPLE, TOLERANCES
from pooltriton.core.semantics import Truncation
from pooltriton.core.tokenization import TextTokenizer
from pooltriton.export.corpus import Corpus

CALIBRATION_BATCH = 4  # texts per calibration sample (padded to the longest, as the ragged encoder runs)
# Accuracy control ranks each quantized layer by the metric without it: a subset keeps that affordable
# on 2 cores (each rank is a compilation and one pass over the subset).
RANKING_TEXTS = 25
# Rounds of returning layers to fp32, at most: past that the model is mostly fp32 and not worth int8
# (verification then refuses it, read back from what OpenVINO compiled).
MAX_RESTORE_STEPS = 8


@dataclass(frozen=True)
class Quantized:
    calibration_texts: int
    validation_texts: int
    quantized_operations: int  # int8 fake-quantize nodes left in the graph
    source: str

    def summary(self) -> dict:
        return {"calibration_texts": self.calibration_texts, "validation_texts": self.validation_texts,
                "quantized_operations": self.quantized_operations, "corpus": self.source}


def encoder_feeds(tokenizer: TextTokenizer, texts: list[str] | tuple[str, ...],
                  input_names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Texts as the encoder takes them: a padded batch of the tokenizer stage's tensors."""
    return batch_feeds(tokenizer(list(texts), Truncation.END), input_names)


def batch_feeds(batch, input_names: tuple[str, ...], activate: bool = False) -> dict[str, np.ndarray]:
    """The encoder's inputs for a tokenized batch; `activate`: ACTIVATE for every text (raw vectors
    otherwise, what the references compute)."""
    feeds = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
             "token_type_ids": batch.token_type_ids,
             ACTIVATE: np.full((len(batch.input_ids), 1), int(activate), dtype=np.int64)}
    return {name: feeds[name] for name in input_names}


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.sum(a * b, axis=-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-30)


def cosine_metric(cosines: np.ndarray) -> float:
    """One number for accuracy control whose absolute drop bounds both the mean and the minimum."""
    return float(min(cosines.mean(), 1 - (1 - cosines.min()) / MIN_COSINE_MULTIPLE[INT8]))


def quantize_openvino(onnx_file: Path, target: Path, tokenizer: TextTokenizer, input_names: tuple[str, ...],
                      texts: Corpus, tolerance: float = TOLERANCES[INT8]) -> Quantized:
    """Write the int8 model to `target` (OpenVINO IR, .xml beside its .bin)."""
    import nncf
    import openvino as ov

    logging.getLogger("nncf").setLevel(logging.WARNING)
    core = ov.Core()
    model = core.read_model(str(onnx_file))
    calibration = [encoder_feeds(tokenizer, texts.calibration[i:i + CALIBRATION_BATCH], input_names)
                   for i in range(0, len(texts.calibration), CALIBRATION_BATCH)]
    # One text per item: accuracy control ranks layers by per-item values.
    validation = [(i, encoder_feeds(tokenizer, [text], input_names)) for i, text in enumerate(texts.validation)]
    fp32 = core.compile_model(model, "CPU")
    expected = [np.array(fp32(feeds)[0]) for _, feeds in validation]

    def validate(compiled, items) -> tuple[float, list[float]]:
        cosines = np.concatenate([row_cosines(np.array(compiled(feeds)[0]), expected[i]) for i, feeds in items])
        return cosine_metric(cosines), cosines.tolist()

    quantized = nncf.quantize_with_accuracy_control(
        model, nncf.Dataset(calibration), nncf.Dataset(validation), validate,
        max_drop=tolerance, drop_type=nncf.DropType.ABSOLUTE, model_type=nncf.ModelType.TRANSFORMER,
        subset_size=len(calibration),
        advanced_accuracy_restorer_parameters=nncf.AdvancedAccuracyRestorerParameters(
            ranking_subset_size=min(RANKING_TEXTS, len(validation)), num_ranking_workers=1,
            max_num_iterations=MAX_RESTORE_STEPS))
    target.parent.mkdir(parents=True, exist_ok=True)
    ov.save_model(quantized, str(target), compress_to_fp16=False)
    fake = sum(op.get_type_name() == "FakeQuantize" for op in quantized.get_ordered_ops())
    return Quantized(len(texts.calibration), len(validation), fake, texts.source)
