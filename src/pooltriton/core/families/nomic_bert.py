"""nomic-embed-text v1/v1.5 (NomicBERT): nomic's own code on the hub, which transformers ports; a config
naming only that code is read as the port. Keys of nomic's config the port does not read are compared
with what it computes with (v2-moe's experts, which the port has none of, are refused)."""

from __future__ import annotations

from typing import Any

from pooltriton.core.families.family import Config, Family, unread_against

# nomic's NomicBertConfig keys -> what transformers' port computes with (a key of its config, or a constant).
UNREAD = {
    "rotary_emb_base": ("rope_theta", 1000.0), "n_head": ("num_attention_heads", 12),
    "n_embd": ("hidden_size", 768), "n_inner": ("intermediate_size", 3072), "n_layer": ("num_hidden_layers", 12),
    "layer_norm_epsilon": ("layer_norm_eps", 1e-12), "activation_function": ("hidden_act", "silu"),
    "rotary_emb_fraction": (None, 1.0), "rotary_emb_interleaved": (None, False),
    "rotary_emb_scale_base": (None, None), "use_rms_norm": (None, False),
    "prenorm": (None, False), "parallel_block": (None, False), "qkv_proj_bias": (None, False),
    "mlp_fc1_bias": (None, False), "mlp_fc2_bias": (None, False), "causal": (None, False),
    "moe_every_n_layers": (None, 0),
}
# nomic's gated MLP names (activation_function) as transformers' NomicBERT runs them: hidden_act gating.
GATES = {"swiglu": "silu", "geglu": "gelu", "glu": "sigmoid"}


def _as_read(key: str, value: Any) -> Any:
    return GATES.get(value, f"{value} (ungated)") if key == "activation_function" else value


def unread_keys(hf: Config) -> list[str]:
    return unread_against(hf, UNREAD, _as_read)


FAMILY = Family(("nomic_bert",), cls_default=True, self_pooling_head=True, ported_code="nomic-ai/nomic-bert-2048--",
                ported_types=("nomic_bert",), unread_keys=unread_keys)
