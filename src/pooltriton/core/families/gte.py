"""Alibaba's GTE (gte-base/large-en-v1.5, gte-multilingual-base and -reranker-base: model_type `new`;
snowflake-arctic-embed-m-v2.0: `gte`), which transformers ports as `gte`: its weight conversion reads their
names (`new.` prefix, packed qkv_proj, up_gate_proj); TEI reads `new` as its GTE, vLLM as GteNewModel. Such a
config is read as the GteConfig it describes: architectures renamed, NewConfig's defaults where they differ
from GteConfig's, and their fixed NTK rope as the linear rope_parameters that give the same frequencies."""

from __future__ import annotations

from typing import Any

from pooltriton.core.families.family import Config, Family, unread_against

CODE = "Alibaba-NLP/new-impl--"
ARCHITECTURES = {"NewModel": "GteModel", "NewForSequenceClassification": "GteForSequenceClassification",
                 "NewForTokenClassification": "GteForTokenClassification", "NewForMaskedLM": "GteForMaskedLM"}
DEFAULTS = {"vocab_size": 30528, "max_position_embeddings": 2048, "rope_theta": 10000.0}
# NewConfig's keys that transformers' GteConfig does not read.
UNREAD = {
    "logn_attention_scale": (None, False), "logn_attention_clip1": (None, False),
    "layer_norm_type": (None, "layer_norm"), "position_embedding_type": (None, "rope"),
    "pack_qkv": (None, True),  # transformers converts their packed qkv_proj only
}


def read_config(hf: Config) -> Config:
    gte = {**DEFAULTS, **hf, "model_type": "gte"}
    # gte-multilingual-base names NewForTokenClassification without labels while its checkpoint holds no
    # classifier: TEI skips that name there (their discussion 7), and so does this.
    labelled = bool(hf.get("id2label")) and bool(hf.get("label2id"))
    gte["architectures"] = [ARCHITECTURES.get(name, name) for name in hf.get("architectures") or []
                            if name != "NewForTokenClassification" or labelled] or ["GteModel"]
    # their rope_scaling, or the rope_parameters transformers 5 writes it into when it saves their config again
    key = "rope_scaling" if gte.get("rope_scaling") else "rope_parameters"
    scaling = gte.get(key) or {}
    ntk = ntk_parameters(gte, scaling) if scaling.get("type", scaling.get("rope_type")) == "ntk" else None
    if ntk is not None:
        gte.pop(key)
        gte.pop("rope_theta", None)
        gte["rope_parameters"] = ntk
    return gte


def ntk_parameters(hf: Config, scaling: dict[str, Any]) -> dict[str, Any] | None:
    """Alibaba's fixed NTK rope (base x factor, frequencies / factor^(2/d), applied at every length once the
    factor is over 1) in the terms transformers reads: its linear scaling of factor^(2/d) on a theta of base x
    factor, the same frequencies exactly. None for their mixed NTK (mixed_b) or a factor under 1."""
    factor = float(scaling.get("factor") or 0)
    if scaling.get("mixed_b") or factor < 1:
        return None
    dim = int(hf.get("head_dim") or hf.get("hidden_size", 768) // hf.get("num_attention_heads", 12))
    theta = float(scaling.get("rope_theta", hf.get("rope_theta", 160000.0)))
    return {"rope_type": "linear", "factor": factor ** (2 / dim), "rope_theta": theta * factor}


def unread_keys(hf: Config) -> list[str]:
    unread = unread_against(hf, UNREAD)
    scaling = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) == "ntk":
        parameters = ntk_parameters(hf, scaling)
        why = ("transformers has no 'ntk' rope, nor an equivalent of this one" if parameters is None else
               f"transformers has no 'ntk' rope; the same frequencies are rope_parameters {parameters!r}")
        unread.append(f"rope scaling {scaling!r} ({why})")
    return unread


FAMILY = Family(("gte",), cls_default=True, self_pooling_head=True, ported_code=CODE, ported_types=("new", "gte"),
                read_config=read_config, unread_keys=unread_keys, own_positions=True)
