"""Alibaba's own GTE (model_type `new`: gte-base/large-en-v1.5, gte-multilingual-base and -reranker-base): a
tiny checkpoint in their layout, and their model's math written here from their modeling code
(Alibaba-NLP/new-impl, which runs from the hub and so cannot run here), in float64 torch, independent of
transformers' port and of the export's reading of their config.

Their layout: one packed qkv_proj, up_gate_proj (up first, then the gate), post-norm layers (attn_ln,
mlp_ln), rotary positions from rope_theta, with NTKScalingRotaryEmbedding where rope_scaling says ntk
(base x factor, every frequency / factor^(2/d)); classifiers under `new.` with BERT's pooler (tanh) before
the classifier.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tiny_models import _tokenizer

# head -> (tokenizer kind, config): gte-base-en-v1.5's kind (BERT's vocabulary, no token types, NTK x2) as a
# sentence-transformers CLS pipeline; gte-multilingual-reranker-base's (XLM-R's vocabulary, one token type,
# NTK x8, one label, read with pairs).
KINDS = {
    "embed": ("bert", {"architectures": ["NewModel"], "type_vocab_size": 0, "rope_theta": 500000.0,
                       "rope_scaling": {"type": "ntk", "factor": 2.0}}),
    "classify": ("xlmr", {"architectures": ["NewForSequenceClassification"], "type_vocab_size": 1,
                          "rope_theta": 160000.0, "rope_scaling": {"type": "ntk", "factor": 8.0}, "num_labels": 1,
                          "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}),
}
SIZE = {"hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 256}


def build_alibaba_gte(root: Path, head: str) -> Path:
    from transformers import PreTrainedTokenizerFast

    folder = root / f"alibaba-gte-{head}"
    if (folder / "config.json").is_file():
        return folder
    kind, extra = KINDS[head]
    tokenizer, info = _tokenizer(kind)
    pad = info["vocab"][info["tokens"]["pad_token"]]
    config = {
        "model_type": "new", "auto_map": {
            "AutoConfig": "Alibaba-NLP/new-impl--configuration.NewConfig",
            "AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel",
            "AutoModelForSequenceClassification": "Alibaba-NLP/new-impl--modeling.NewForSequenceClassification"},
        "vocab_size": len(info["vocab"]), **SIZE, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.0, "max_position_embeddings": 128, "initializer_range": 0.02,
        "layer_norm_type": "layer_norm", "layer_norm_eps": 1e-12, "position_embedding_type": "rope",
        "pack_qkv": True, "unpad_inputs": True, "use_memory_efficient_attention": True,
        "logn_attention_scale": False, "logn_attention_clip1": False, "pad_token_id": pad,
        "torch_dtype": "float32", "transformers_version": "4.39.1", **extra}
    hidden, inner = SIZE["hidden_size"], SIZE["intermediate_size"]
    generator = torch.Generator().manual_seed(11)

    def matrix(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.05

    def norm(name: str) -> dict[str, torch.Tensor]:
        return {f"{name}.weight": 1 + 0.1 * torch.randn(hidden, generator=generator),
                f"{name}.bias": 0.05 * torch.randn(hidden, generator=generator)}

    weights = {"embeddings.word_embeddings.weight": matrix(len(info["vocab"]), hidden) * 10,
               **norm("embeddings.LayerNorm")}
    if config["type_vocab_size"]:
        weights["embeddings.token_type_embeddings.weight"] = matrix(config["type_vocab_size"], hidden) * 10
    for layer in range(SIZE["num_hidden_layers"]):
        at = f"encoder.layer.{layer}"
        weights |= {f"{at}.attention.qkv_proj.weight": matrix(3 * hidden, hidden) * 4,
                    f"{at}.attention.qkv_proj.bias": matrix(3 * hidden),
                    f"{at}.attention.o_proj.weight": matrix(hidden, hidden),
                    f"{at}.attention.o_proj.bias": matrix(hidden),
                    f"{at}.mlp.up_gate_proj.weight": matrix(2 * inner, hidden) * 2,
                    f"{at}.mlp.down_proj.weight": matrix(hidden, inner), f"{at}.mlp.down_proj.bias": matrix(hidden),
                    **norm(f"{at}.attn_ln"), **norm(f"{at}.mlp_ln")}
    if head == "classify":
        weights = {f"new.{name}": tensor for name, tensor in weights.items()}
        weights |= {"new.pooler.dense.weight": matrix(hidden, hidden) * 4, "new.pooler.dense.bias": matrix(hidden),
                    "classifier.weight": matrix(1, hidden) * 10, "classifier.bias": matrix(1)}
    folder.mkdir(parents=True)
    save_file({name: tensor.contiguous() for name, tensor in weights.items()}, folder / "model.safetensors",
              metadata={"format": "pt"})
    inputs = ["input_ids", "token_type_ids", "attention_mask"] if kind == "bert" else ["input_ids", "attention_mask"]
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=128, model_input_names=inputs,
                            **info["tokens"]).save_pretrained(folder)
    if head == "embed":  # gte-base-en-v1.5's sentence-transformers files: CLS (and a Normalize here)
        (folder / "1_Pooling").mkdir()
        (folder / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(
            {"word_embedding_dimension": hidden, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": False}))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def _layer_norm(x: torch.Tensor, weights: dict, name: str, eps: float) -> torch.Tensor:
    centred = x - x.mean(-1, keepdim=True)
    return centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + eps) * weights[f"{name}.weight"] + \
        weights[f"{name}.bias"]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def alibaba_gte(folder: Path, ids: list[int], ntk: bool = True) -> torch.Tensor:
    """One text's last hidden states [L, hidden] as their NewModel computes them (float64); `ntk=False`
    leaves the rope unscaled (to show the scaling matters)."""
    config = json.loads((folder / "config.json").read_text())
    stored = load_file(folder / "model.safetensors")
    prefix = "new." if any(name.startswith("new.") for name in stored) else ""
    w = {name[len(prefix):]: tensor.double() for name, tensor in stored.items() if name.startswith(prefix)}
    hidden, heads, inner = config["hidden_size"], config["num_attention_heads"], config["intermediate_size"]
    eps, dim, length = config["layer_norm_eps"], hidden // heads, len(ids)
    x = w["embeddings.word_embeddings.weight"][torch.tensor(ids)]
    if config["type_vocab_size"] > 0:
        x = x + w["embeddings.token_type_embeddings.weight"][torch.zeros(length, dtype=torch.long)]
    x = _layer_norm(x, w, "embeddings.LayerNorm", eps)
    base, exponents = float(config["rope_theta"]), torch.arange(0, dim, 2, dtype=torch.float64) / dim
    scaling = config.get("rope_scaling") if ntk else None
    if scaling and scaling["factor"] > 1:  # the cache is built past max_position_embeddings: scaled from the start
        frequencies = 1.0 / (base * scaling["factor"]) ** exponents / scaling["factor"] ** (2 / dim)
    else:
        frequencies = 1.0 / base ** exponents
    angles = torch.outer(torch.arange(length, dtype=torch.float64), frequencies)
    cos, sin = torch.cat((angles, angles), -1).cos()[:, None], torch.cat((angles, angles), -1).sin()[:, None]
    for layer in range(config["num_hidden_layers"]):
        at = f"encoder.layer.{layer}"
        qkv = x @ w[f"{at}.attention.qkv_proj.weight"].T + w[f"{at}.attention.qkv_proj.bias"]
        q, k, v = (part.reshape(length, heads, dim) for part in qkv.split(hidden, dim=-1))
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(dim)
        context = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(length, hidden)
        attended = context @ w[f"{at}.attention.o_proj.weight"].T + w[f"{at}.attention.o_proj.bias"]
        x = _layer_norm(x + attended, w, f"{at}.attn_ln", eps)
        up, gate = (x @ w[f"{at}.mlp.up_gate_proj.weight"].T).split(inner, dim=-1)
        gelu = 0.5 * gate * (1 + torch.erf(gate / math.sqrt(2)))
        x = _layer_norm(x + (gelu * up) @ w[f"{at}.mlp.down_proj.weight"].T + w[f"{at}.mlp.down_proj.bias"], w,
                        f"{at}.mlp_ln", eps)
    return x


def alibaba_gte_logits(folder: Path, ids: list[int]) -> torch.Tensor:
    """NewForSequenceClassification: BERT's pooler (dense, tanh) on the first token, then the classifier."""
    stored = {name: tensor.double() for name, tensor in load_file(folder / "model.safetensors").items()}
    first = alibaba_gte(folder, ids)[0]
    pooled = torch.tanh(first @ stored["new.pooler.dense.weight"].T + stored["new.pooler.dense.bias"])
    return pooled @ stored["classifier.weight"].T + stored["classifier.bias"]
