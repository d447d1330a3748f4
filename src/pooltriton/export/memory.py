"""What one row of the encoder holds in memory, from the model's config (read by the ragged shims).

Eager attention materialises a [heads, L, L] score matrix per row in every layer (the ONNX and
TorchScript exports keep transformers' eager attention), so a long text costs the square of its length:
measured on a 4-head, hidden-128 ModernBERT at 8,192 tokens, one row peaks at 4.0 GB over the session's
baseline in ONNX Runtime (3.7 score-sized copies) and 2.4 GB in TorchScript (2.3 copies), two rows at
6.8 and 4.8 GB. Layers run one after the other and free what they made, so the peak is one layer's.
"""

from __future__ import annotations

from pathlib import Path

FLOAT = 4  # bytes: activations are fp32 in the ONNX graph (OpenVINO's bf16 only makes them smaller)
# Score-sized copies alive at once per head (scores, masked, softmax, the next matmul's input): 4 is
# above the 3.7 measured; plus 2 [L, L] masks built per row (ModernBERT builds a global and a local one).
ATTENTION_COPIES = 4
MASK_COPIES = 2
# Hidden-sized copies alive at once in a layer (input, q, k, v, context, projections, residuals, norms)
# and two feed-forward-sized ones (the up projection and its activation).
HIDDEN_COPIES = 16
FEED_FORWARD_COPIES = 2
# SPLADE's vocabulary-wide logits per token: the head's output, the masked product and log1p(relu(.)).
LOGIT_COPIES = 3


def encoder_memory(model_dir: Path, vocabulary_logits: bool = False) -> tuple[int, int]:
    """(bytes per token, bytes per attention cell) of one row at a layer's peak; `vocabulary_logits`: the
    graph keeps the masked-LM head's logits of every token (SPLADE), which outweigh a layer's activations."""
    from transformers import AutoConfig

    from pooltriton.core.resolve import STATIC_EMBEDDING, model_config

    described = model_config(Path(model_dir)) or {}
    if described.get("model_type") == STATIC_EMBEDDING:  # a table lookup: its vectors and their sum, no attention
        return FLOAT * HIDDEN_COPIES * int(described["hidden_size"]), 0
    config = AutoConfig.from_pretrained(model_dir)
    config = getattr(config, "text_config", None) or config
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    widths = ("intermediate_size", "hidden_dim", "n_inner", "encoder_ffn_dim", "d_ff")  # the families' names
    feed_forward = next((getattr(config, name) for name in widths if getattr(config, name, None)), 4 * hidden)
    token_bytes = FLOAT * (HIDDEN_COPIES * hidden + FEED_FORWARD_COPIES * int(feed_forward))
    if vocabulary_logits:
        token_bytes = max(token_bytes, FLOAT * LOGIT_COPIES * int(config.vocab_size))
    cell_bytes = FLOAT * (ATTENTION_COPIES * heads + MASK_COPIES)
    return token_bytes, cell_bytes
