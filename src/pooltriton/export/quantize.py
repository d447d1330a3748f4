"""int8 for the openvino runtime: SmoothQuant, int8 weights by NNCF, activations quantized at run time
per channel group, and accuracy control that picks the group (or returns products to float) within
the bound. Design: docs/design.md#int8-exportquantize.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pooltriton.contract import ACTIVATE
from pooltriton.core.runtimes import (
    DYNAMIC_QUANTIZATION,
    INT8,
    INT8_ACTIVATION_GROUPS,
    MIN_COSINE_MULTIPLE,
    RUNTIMES,
    TOLERANCES,
    openvino_properties,
)
from pooltriton.core.semantics import Truncation
from pooltriton.core.tokenization import TextTokenizer
from pooltriton.export.corpus import Corpus

# Accuracy control ranks each product by the error it causes alone: a subset keeps that affordable on
# 2 cores (each rank is a weight compression, a compilation and one pass over the subset).
RANKING_TEXTS = 25
# A larger activation group than the smallest must keep half the tolerance in hand: accuracy control's
# texts are not all text. MiniLM before smoothing: groups of 64 dropped 0.0007 on validation and verified
# at mean 0.99927, yet gave 0.99890 on unicode-heavy text of up to 250 tokens (32: 0.99903); 128 dropped
# 0.00097 and missed verification itself. Smoothed, 128 stays within half and holds on all three.
GROUP_MARGIN = 0.5
# SmoothQuant's migration strength. On MiniLM (docs/performance.md) 0.5 took the mean cosine to fp32 of
# groups of 128 from 0.99902 to 0.99951 and of 32 from 0.99948 to 0.99967; 0.8 was worse below per-token.
SMOOTHING_ALPHA = 0.5
# Kept out of int8 at most: past half the products verification refuses the model anyway (mostly float:
# no speed left to pay for the error, read back from what OpenVINO compiled).
MAX_RESTORED_SHARE = 0.5


@dataclass(frozen=True)
class Quantized:
    validation_texts: int
    int8_products: int  # products whose weights are int8
    products: int  # all matrix products with constant weights
    restored: tuple[str, ...]  # products accuracy control kept out of int8, most harmful first
    source: str
    activation_group: int  # input channels per run-time activation scale
    smoothed_inputs: int  # product inputs SmoothQuant rescaled

    def summary(self) -> dict:
        return {"method": f"SmoothQuant migration (alpha {SMOOTHING_ALPHA}, activation ranges of the validation "
                          f"texts); int8 weights (NNCF, asymmetric, per output channel); activations quantized at run "
                          f"time per {self.activation_group} input channels (OpenVINO CPU plugin; the largest of "
                          f"{', '.join(map(str, INT8_ACTIVATION_GROUPS))} well within the tolerance); the rest in "
                          "bf16 where the CPU has it natively and the products stay int8 in bf16 (not on AMX), "
                          "else fp32",
                "activation_group": self.activation_group, "smoothed_inputs": self.smoothed_inputs,
                "validation_texts": self.validation_texts, "int8_products": self.int8_products,
                "products": self.products, "kept_out_of_int8": list(self.restored), "corpus": self.source}


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


def restore_steps(products: int) -> list[int]:
    """How many of the ranked products are fp32 at each step of accuracy control: 1, 2, 4, ... up to
    MAX_RESTORED_SHARE of them (a few compilations, not one per product)."""
    limit, steps, count = int(products * MAX_RESTORED_SHARE), [], 1
    while count <= limit:
        steps.append(count)
        count *= 2
    if limit and steps[-1] != limit:
        steps.append(limit)
    return steps


def control_accuracy(products: Sequence[str], measure: Callable[[Sequence[str], int | None], np.ndarray],
                     tolerance: float) -> tuple[str, ...]:
    """The products to keep in fp32 (most harmful first) so that the metric drops by at most
    `tolerance`, or the most accuracy control may keep when no step meets it (verification refuses it).
    `measure(kept_fp32, texts)`: cosines to fp32 on the first `texts` validation texts (None: all)."""
    if 1 - cosine_metric(measure((), None)) <= tolerance:
        return ()
    # Error of each product alone: all others kept in fp32.
    harm = {name: 1 - cosine_metric(measure([other for other in products if other != name], RANKING_TEXTS))
            for name in products}
    ranked = sorted(products, key=lambda name: -harm[name])
    kept: tuple[str, ...] = ()
    for count in restore_steps(len(products)):
        kept = tuple(ranked[:count])
        if 1 - cosine_metric(measure(kept, None)) <= tolerance:
            break
    return kept


def largest_group(groups: Sequence[int], drop: Callable[[int], float], tolerance: float) -> int:
    """The first (largest) activation group whose metric drop is at most GROUP_MARGIN x `tolerance`,
    else the last (smallest), where accuracy control goes on product by product."""
    return next((group for group in groups[:-1] if drop(group) <= GROUP_MARGIN * tolerance), groups[-1])


def weight_products(model) -> list[str]:
    """The matrix products with constant 2-D weights: what weight compression makes int8."""
    return [op.get_friendly_name() for op in model.get_ordered_ops()
            if op.get_type_name() == "MatMul" and op.input(1).get_partial_shape().rank.get_length() == 2
            and op.input_value(1).get_node().get_type_name() in ("Constant", "Convert")]


def smoothing_scales(activation_max: np.ndarray, weight_max: np.ndarray, alpha: float = SMOOTHING_ALPHA) -> np.ndarray:
    """SmoothQuant's per-input-channel scales s = max|x|^alpha / max|w|^(1 - alpha): (x / s) @ (s w) is
    x @ w up to f32 rounding, with the activations' channels evened out, so an outlier channel no longer
    sets the scale of its whole quantization group (the weights, quantized per output channel, take some
    of it). A channel the texts left (nearly) silent is floored at 1 % of the median channel: scaled up by
    its near-zero range, its weights would round to zero for text that does use it."""
    activation_max = np.nan_to_num(activation_max)
    floor = max(0.01 * float(np.median(activation_max)), 1e-5)
    scales = np.maximum(activation_max, floor) ** alpha / np.maximum(weight_max, 1e-5) ** (1 - alpha)
    return np.clip(scales, 1e-3, 1e3).astype(np.float32)


def _smoothable(model) -> dict[tuple[str, int], list]:
    """Products with f32 constant 2-D weights, by the output that feeds them (products that share an input
    share its scales); outputs are named by node, so a node whose name is not unique is left alone."""
    names = Counter(op.get_friendly_name() for op in model.get_ordered_ops())
    groups: dict[tuple[str, int], list] = {}
    for op in model.get_ordered_ops():
        weight = op.input_value(1).get_node() if op.get_type_name() == "MatMul" else None
        if (weight is not None and weight.get_type_name() == "Constant" and not op.get_attributes()["transpose_a"]
                and len(weight.get_output_shape(0)) == 2 and weight.get_output_element_type(0).get_type_name() == "f32"
                and op.get_input_partial_shape(0).rank.is_static
                and names[op.input_value(0).get_node().get_friendly_name()] == 1):
            source = op.input_value(0)
            groups.setdefault((source.get_node().get_friendly_name(), source.get_index()), []).append(op)
    return groups


def activation_ranges(core, model, feeds: Sequence[dict[str, np.ndarray]]) -> dict[tuple[str, int], np.ndarray]:
    """Each smoothable input's largest |value| per channel over `feeds`, run in f32 (reduced in the
    graph: a probe copy gets one extra output per input)."""
    import openvino.opset13 as ops

    sources = list(_smoothable(model))
    probe = model.clone()
    nodes = {op.get_friendly_name(): op for op in probe.get_ordered_ops()}
    for i, (name, index) in enumerate(sources):
        output = nodes[name].output(index)
        axes = np.arange(output.get_partial_shape().rank.get_length() - 1, dtype=np.int64)
        peak = ops.reduce_max(ops.abs(output), ops.constant(axes), keep_dims=False)
        peak.output(0).get_tensor().set_names({f"pooltriton_smoothing_{i}"})
        probe.add_results([ops.result(peak)])
    compiled = core.compile_model(probe, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    ranges: dict[tuple[str, int], np.ndarray] = {}
    for item in feeds:
        answer = compiled(item)
        for i, source in enumerate(sources):
            peak = np.asarray(answer[f"pooltriton_smoothing_{i}"])
            ranges[source] = np.maximum(ranges[source], peak) if source in ranges else peak
    return ranges


def smooth(model, ranges: dict[tuple[str, int], np.ndarray], alpha: float = SMOOTHING_ALPHA) -> int:
    """Rewrite `model` in place: each smoothable input divided by its scales on its way into the products,
    their weights multiplied by them (the same answers up to f32 rounding). Returns how many inputs were
    smoothed."""
    import openvino.opset13 as ops

    smoothed = 0
    for source, products in _smoothable(model).items():
        weights = [op.input_value(1).get_node().get_data() for op in products]
        # Input channels are the weight's rows, or its columns when the product transposes it.
        axes = [1 if op.get_attributes()["transpose_b"] else 0 for op in products]
        weight_max = np.max([np.abs(w).max(axis=1 - axis) for w, axis in zip(weights, axes, strict=True)], axis=0)
        if source not in ranges or ranges[source].shape != weight_max.shape:
            continue
        scales = smoothing_scales(ranges[source], weight_max, alpha)
        divided = ops.multiply(products[0].input_value(0), ops.constant(1 / scales))
        for op, weight, axis in zip(products, weights, axes, strict=True):
            op.input(0).replace_source_output(divided.output(0))
            shape = (-1, 1) if axis == 0 else (1, -1)
            op.input(1).replace_source_output(ops.constant(weight * scales.reshape(shape)).output(0))
        smoothed += 1
    model.validate_nodes_and_infer_types()
    return smoothed


def quantize_openvino(onnx_file: Path, target: Path, tokenizer: TextTokenizer, input_names: tuple[str, ...],
                      texts: Corpus, tolerance: float = TOLERANCES[INT8]) -> Quantized:
    """Write the int8 model to `target` (OpenVINO IR, .xml beside its .bin)."""
    import nncf
    import openvino as ov

    logging.getLogger("nncf").setLevel(logging.WARNING)
    core = ov.Core()
    properties = openvino_properties(RUNTIMES["openvino"].parameters(threads=0, precision=INT8).get)
    # One text per item, as single requests run (no padding in the measurement).
    validation = [encoder_feeds(tokenizer, [text], input_names) for text in texts.validation]
    model = core.read_model(str(onnx_file))
    # The reference in f32: int8's properties ask bf16 for what is not an int8 product (core.runtimes).
    fp32 = core.compile_model(model, "CPU", {**properties, "INFERENCE_PRECISION_HINT": "f32"})
    expected = [np.array(fp32(feeds)[0]) for feeds in validation]
    ranges = activation_ranges(core, model, validation)

    def compress(kept: Sequence[str]):  # from a fresh read: NNCF rewrites the model it is given
        ignored = nncf.IgnoredScope(names=list(kept)) if kept else None
        smoothed = core.read_model(str(onnx_file))
        if smooth(smoothed, ranges) != len(ranges):  # the same graph read again: every measured input
            raise RuntimeError(f"smoothing found other product inputs in {onnx_file} than it measured")
        return nncf.compress_weights(smoothed, mode=nncf.CompressWeightsMode.INT8_ASYM, ignored_scope=ignored)

    measured: dict[tuple, np.ndarray] = {}  # control_accuracy starts with what the group choice measured

    def measure(kept: Sequence[str], count: int | None, group: int) -> np.ndarray:
        key = (tuple(kept), count, group)
        if key not in measured:
            compiled = core.compile_model(compress(kept), "CPU", {**properties, DYNAMIC_QUANTIZATION: group})
            measured[key] = np.concatenate([row_cosines(np.array(compiled(feeds)[0]), expected[i])
                                            for i, feeds in enumerate(validation[:count])])
        return measured[key]

    group = largest_group(INT8_ACTIVATION_GROUPS, lambda group: 1 - cosine_metric(measure((), None, group)),
                          tolerance)
    products = weight_products(model)
    kept = control_accuracy(products, lambda kept, count: measure(kept, count, group), tolerance)
    target.parent.mkdir(parents=True, exist_ok=True)
    quantized = compress(kept)
    quantized.set_rt_info(str(group), ["runtime_options", DYNAMIC_QUANTIZATION])
    ov.save_model(quantized, str(target), compress_to_fp16=False)
    return Quantized(len(validation), len(products) - len(kept), len(products), kept, texts.source, group,
                     len(ranges))
