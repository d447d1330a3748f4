"""The rules that refuse a model for what it is, in one place: what its files say (pickled weights, custom
code), what its config says that transformers would not compute (unread keys, foreign architectures,
bidirectional flags), families not proven here, multimodal models whose image path is not built, and, once
loaded, weights the network lacks or would drop. (What an export asks of a model it serves, a tokenizer.json,
a precision, an image size, is checked where that step runs.) Each refusal is one paragraph that says why and what to do
(docs/serving-your-model.md); the export raises them as ResolutionError, the CLI exits 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pooltriton.core.resolve import (
    BIDIRECTIONAL_FLAG_MODEL_TYPES,
    ONE_USE_MODEL_TYPES,
    SENTENCE_TRANSFORMERS,
    STATIC_EMBEDDING,
    SUPPORTED_MODEL_TYPES,
    VISION_MODEL_TYPES,
    PoolerConfig,
    ResolutionError,
    unread_config_keys,
)
from pooltriton.core.semantics import Task


def check_supported(config: PoolerConfig) -> None:
    """Only the families the test matrix proves are exported (docs/models.md's architecture table)."""
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ResolutionError(
            f"{config.architecture or 'this model'} (model_type {config.model_type!r}) is not a supported "
            f"architecture: its attention and heads have not been checked against transformers here. "
            f"Supported model types: {', '.join(sorted(SUPPORTED_MODEL_TYPES))}")
    use = ONE_USE_MODEL_TYPES.get(config.model_type)
    proven = {"classify": config.task is Task.CLASSIFY and config.classifier_token_ids is None,
              "embed": (config.task is Task.EMBED and config.classifier_token_ids is None
                        and not config.pooling_type.sparse
                        and config.sources.get("pooling_type") == SENTENCE_TRANSFORMERS)}
    if use is not None and not proven[use]:
        raise ResolutionError(
            f"{config.architecture or 'this model'} (model_type {config.model_type!r}) is supported as "
            f"{_ONE_USE_WORDS[use]} only: its other heads have not been checked against transformers here")


_ONE_USE_WORDS = {"classify": "a sequence classifier (its own classification head, task classify)",
                  "embed": "the encoder of a sentence-transformers embedding (its Pooling, task embed)"}


def check_architecture(model_dir: Path, config: dict) -> None:
    """What config.json says that transformers, the reference here, would not do: such a model would be
    verified against a reference that differs from what its users run, so it is refused, saying why.
    Families that are not supported at all are left to check_supported's message."""
    import transformers

    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES or model_type == STATIC_EMBEDDING:  # no transformers model
        return
    # A name that is no transformers class (vLLM's GritLM, a *Bidirectional* model re-saved without its code)
    # would load as the family's plain model; with auto_map its own code runs (--trust-remote-code).
    foreign = [name for name in config.get("architectures") or [] if not _transformers_class(transformers, name)]
    if foreign and not config.get("auto_map"):
        raise ResolutionError(
            f"{model_dir}'s config.json names the architecture {foreign[0]}, which is neither a transformers class "
            f"nor custom code in the folder (auto_map): it would load as transformers' plain {model_type} model, "
            f"while the code its users run (and vLLM's, where it has one) may attend or pool otherwise. If it is "
            f"that plain model, name its transformers class in `architectures`; if it attends both ways, also set "
            f'"is_causal": false; its pooling comes from its sentence-transformers files or --pooling-type')
    unread = [] if config.get("auto_map") else unread_config_keys(config)
    if unread:  # with auto_map, the model's own code reads them (--trust-remote-code)
        raise ResolutionError(
            f"{model_dir}'s config.json sets {'; '.join(unread)}: transformers' {model_type} does not read these "
            "keys and would compute as each parenthesis says, unlike the code the model was trained with, and no "
            "verification against transformers could tell. Where a parenthesis names a key, set that key to match "
            "(gelu for geglu); otherwise transformers does not implement this variant")
    bidirectional = config.get("use_bidirectional_attention") and config.get("is_causal", True)
    if bidirectional and model_type not in BIDIRECTIONAL_FLAG_MODEL_TYPES:
        raise ResolutionError(
            f"{model_dir}'s config.json sets use_bidirectional_attention, which transformers' {model_type} does "
            f"not apply (it attends causally, at least in a padded batch) while TEI and vLLM's bidirectional "
            f"models attend both ways: no reference here agrees with either. If the model is bidirectional, set "
            f'"is_causal": false in config.json too (transformers\' switch for every decoder) and export again')


def _transformers_class(transformers: object, name: str) -> bool:
    try:
        return hasattr(transformers, name)
    except Exception:  # a lazy import that fails: not a class this transformers can load
        return False


def check_model_files(model_dir: Path, config: dict, allow_pickle: bool, trust_remote_code: bool) -> None:
    """Safe by default: weights from safetensors only, and no model that brings its own code."""
    if config.get("auto_map") and not trust_remote_code:
        raise ResolutionError(f"{model_dir} names custom code in config.json (auto_map), which would run at "
                              "export; pass --trust-remote-code if you trust it")
    if any(model_dir.glob("*.safetensors")) or allow_pickle:
        return
    pickled = sorted(p.name for p in model_dir.glob("*.bin")) + sorted(p.name for p in model_dir.glob("*.pt"))
    if pickled:
        raise ResolutionError(f"{model_dir} has only pickled weights ({', '.join(pickled)}), which can run code "
                              "when loaded; convert them to safetensors, or pass --allow-pickle if you trust them")


def multimodal_refusal(hf: dict) -> str:
    """Why a model that takes images is not exported (its image path is not built here)."""
    architecture = (hf.get("architectures") or [hf.get("model_type") or "this model"])[0]
    return (f"{architecture} (model_type {hf.get('model_type')!r}) takes images, and its image path is not "
            f"supported here; image models served: {', '.join(sorted(VISION_MODEL_TYPES))} (CLIPModel, "
            f"SiglipModel). It is not exported as its text side alone")


def check_weights(model_dir: str | Path, network: Any, info: dict, bare: bool) -> None:
    """A loaded network refused where the checkpoint lacks weights it computes with: transformers
    initialises those at random (a classifier asked of an embedding checkpoint, SPLADE of one without its
    masked-LM head), and the answers would be noise that no verification names; or where it holds weights
    inside the layers that the network would drop. A bare encoder's pooler (BERT's pooler_output) is the one
    part that may be missing: the pooling here never reads it."""
    missing = sorted(key for key in info.get("missing_keys", ())
                     if not (bare and "pooler" in key.split(".")))
    if missing:
        shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        raise ResolutionError(
            f"{model_dir}: the checkpoint has no weights for {len(missing)} of {type(network).__name__}'s "
            f"parameters ({shown}); transformers would initialise them at random and every answer would be "
            "noise. " + ("The weights do not match the architecture config.json names" if bare else
                         "The folder does not carry the head this task needs: export it for the task it was "
                         "trained for (--task, --pooling-type)"))
    stray = stray_weights(network, info.get("unexpected_keys", ()))
    if stray:
        shown = ", ".join(stray[:3]) + (", ..." if len(stray) > 3 else "")
        raise ResolutionError(
            f"{model_dir}: the checkpoint has {len(stray)} weights inside {type(network).__name__}'s layers that it "
            f"does not compute with ({shown}); transformers would drop them, but the code that trained them (an "
            "option of config.json this transformers no longer reads, or custom code) computes with them, and "
            "every answer would differ from the model's own")


def stray_weights(network: Any, unexpected: Any) -> list[str]:
    """Checkpoint weights the network has no place for, where it runs: a module that lacks that weight (a
    bias the config turns off), or a part of one of its layers (BERT's relative-position
    distance_embedding). Heads the task does not use (classifier, pooler, lm_head, BERT's next-sentence
    head beside its masked-LM one) and layers past the config's num_hidden_layers (a model cut short on
    purpose) are left, as are buffers an older transformers saved."""
    from torch import nn

    modules = dict(network.named_modules())
    base = getattr(network, "base_model", network)
    prefix = getattr(network, "base_model_prefix", "")
    layers = {f"{name}.{index}" for name, module in modules.items() if isinstance(module, nn.ModuleList)
              for index in range(len(module))}
    stray = []
    for key in unexpected:
        parts = key.split(".")
        if parts[0] == prefix and prefix not in modules:
            parts = parts[1:]
        if parts[-1] not in ("weight", "bias"):  # a buffer (token_type_ids, masked_bias)
            continue
        parent = modules.get(".".join(parts[:-1]))
        in_layer = any(".".join(parts[:end]) in layers for end in range(1, len(parts)))
        if (parent is not None and parent not in (network, base)) or in_layer:
            stray.append(key)
    return sorted(stray)
