"""Image-text dual encoders (vLLM's CLIPModel and SiglipModel): a vision tower with its projection, served as
an image ensemble (export.vision), and the multimodal architectures not served yet, refused by name."""

from pooltriton.core.families.family import Family

CLIP = Family(("clip",), vision=True)
SIGLIP = Family(("siglip",), vision=True)
# Multimodal models whose image path is not built here (VLM-based embedders, audio-text, NaFlex SigLIP 2):
# refused by name at export, never exported as their text side alone.
MULTIMODAL_UNSUPPORTED = Family(
    ("llava", "llava_next", "phi3_v", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "idefics3", "clap", "siglip2",
     "chinese_clip", "altclip", "blip", "blip-2", "owlvit", "owlv2", "x_clip", "flava", "llama_nemotron_vl"),
    supported=False, vision=True)
