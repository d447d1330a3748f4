"""Tiny seeded CLIP and SigLIP checkpoints built from configs (no model hub here), with the processor
files real checkpoints carry: several heads and layers, hidden 64, weights at a realistic scale."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from tokenizers.pre_tokenizers import ByteLevel
from transformers import CLIPConfig, CLIPModel, CLIPTokenizer, PreTrainedTokenizerFast, SiglipConfig, SiglipModel

VISION = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
          "patch_size": 8}
TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}


def _seeded(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Weights drawn at 0.05 (what trained transformers hold), biases and norms too: nothing near zero."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                parameter.copy_(1 + 0.1 * torch.randn(parameter.shape, generator=generator))
            elif name.endswith("logit_scale") or name.endswith("logit_bias"):
                continue
            else:
                parameter.copy_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model


def build_clip(root: Path, image_size: int = 32, seed: int = 0) -> Path:
    """openai/clip-vit-base-patch32's layout in small: preprocessor_config.json alone (as the hub's)."""
    folder = root / "tiny-clip"
    config = CLIPConfig(vision_config={**VISION, "image_size": image_size},
                        text_config={**TEXT, "vocab_size": 520, "max_position_embeddings": 77, "bos_token_id": 512,
                                     "eos_token_id": 513, "pad_token_id": 513},
                        projection_dim=48)
    _seeded(CLIPModel(config).eval(), seed).save_pretrained(folder)
    crop = {"height": image_size, "width": image_size}
    processor = {"image_processor_type": "CLIPImageProcessor", "do_resize": True,
                 "size": {"shortest_edge": image_size}, "resample": 3, "do_center_crop": True, "crop_size": crop,
                 "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                 "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
                 "do_convert_rgb": True}
    (folder / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))
    clip_tokenizer().save_pretrained(folder)
    return folder


def clip_tokenizer() -> CLIPTokenizer:
    """CLIP's tokenizer offline: a character-level byte BPE (GPT-2's 256 byte characters, each also with
    </w>, no merges) with CLIP's start and end tokens (ids 512, 513; the end token pads, as openai's)."""
    characters = sorted(ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(characters)} | {c + "</w>": 256 + i for i, c in enumerate(characters)}
    vocab |= {"<|startoftext|>": 512, "<|endoftext|>": 513}
    return CLIPTokenizer(vocab=vocab, merges=[])


def siglip_tokenizer(length: int) -> PreTrainedTokenizerFast:
    """A fast tokenizer in SigLIP's manner: byte-level pieces, </s> (id 1) ending every text and padding it."""
    characters = sorted(ByteLevel.alphabet())
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2} | {c: 3 + i for i, c in enumerate(characters)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="</s>", pad_token="</s>",
                                   unk_token="<unk>", model_max_length=length)


def build_siglip(root: Path, image_size: int = 32, seed: int = 1) -> Path:
    """google/siglip-base-patch16-224's layout in small: a processor_config.json holding the image processor."""
    folder = root / "tiny-siglip"
    config = SiglipConfig(vision_config={**VISION, "image_size": image_size},
                          text_config={**TEXT, "vocab_size": 520, "max_position_embeddings": 64,
                                       "pad_token_id": 1, "eos_token_id": 1, "bos_token_id": 1})
    _seeded(SiglipModel(config).eval(), seed).save_pretrained(folder)
    processor = {"image_processor": {"image_processor_type": "SiglipImageProcessor", "do_resize": True,
                                     "size": {"height": image_size, "width": image_size}, "resample": 3,
                                     "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                                     "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
                 "processor_class": "SiglipProcessor"}
    (folder / "processor_config.json").write_text(json.dumps(processor, indent=2))
    siglip_tokenizer(64).save_pretrained(folder)
    return folder


def build_st_clip(root: Path) -> Path:
    """sentence-transformers' clip-ViT-B-32 layout in small: modules.json naming a CLIPModel module in
    0_CLIPModel/ and nothing after it (no Normalize: its users get raw vectors)."""
    import shutil

    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import CLIPModel as CLIPModule

    folder = root / "tiny-st-clip"
    SentenceTransformer(modules=[CLIPModule(str(build_clip(root / "tower", seed=3)))]).save(str(folder))
    module = folder / "0_CLIPModel"
    module.mkdir()
    for entry in list(folder.iterdir()):
        if entry.name not in ("modules.json", "0_CLIPModel", "README.md", "config_sentence_transformers.json"):
            shutil.move(entry, module / entry.name)
    modules = json.loads((folder / "modules.json").read_text())
    modules[0]["path"] = "0_CLIPModel"
    (folder / "modules.json").write_text(json.dumps(modules))
    return folder
