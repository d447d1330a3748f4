"""The decoder LLM families: a causal mask and LAST pooling by default. Gemma 3's transformers code builds
its masks from `use_bidirectional_attention` (EmbeddingGemma); Gemma 1 and 2 read it only as SDPA's flag,
and Qwen, Llama and Mistral ignore it (export.refusals.check_architecture refuses it on those)."""

from pooltriton.core.families.family import Family

GPT2 = Family(("gpt2",), decoder=True)
QWEN = Family(("qwen2", "qwen3"), decoder=True)
LLAMA = Family(("llama",), decoder=True)
MISTRAL = Family(("mistral",), decoder=True)
GEMMA = Family(("gemma", "gemma2"), decoder=True)
GEMMA3 = Family(("gemma3_text",), decoder=True, bidirectional_flag=True)
# Known decoders the matrix does not export (gemma3: the multimodal config; its text model is gemma3_text).
UNPROVEN = Family(("phi3", "gpt_neox", "opt"), supported=False, decoder=True)
GEMMA3_MULTIMODAL = Family(("gemma3",), supported=False, decoder=True, bidirectional_flag=True)
