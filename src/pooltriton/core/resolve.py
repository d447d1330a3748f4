"""Resolve a model's pooler configuration from its config files alone (no weights).

Precedence, per field, as in vLLM: explicit > sentence-transformers metadata > architecture default.
Every resolved field records where it came from, so `pooltriton inspect` can show it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pooltriton.core.families import (
    FAMILIES,
    Family,
    ResolutionError,
    family_of,
    gte,
    model_types,
    ported,
    static_embedding,
)
from pooltriton.core.semantics import Activation, PoolingType, Task, default_activation

EXPLICIT = "explicit"
SENTENCE_TRANSFORMERS = "sentence-transformers"
HF_CONFIG = "hf-config"
ARCHITECTURE = "architecture"
TASK_DEFAULT = "task-default"
MODEL_FILES = "model-files"  # a file of the model folder decided it (BGE-M3's heads)

# BGE-M3's token heads (FlagEmbedding's files beside the XLM-R weights; vLLM's BgeM3EmbeddingModel): its
# lexical weights relu(sparse_linear(h)) for every token but <s> and </s>, and its ColBERT vectors
# normalize(colbert_linear(h)) for every token but <s>. Its dense embedding is the folder's CLS pipeline.
M3_HEADS = {Task.TOKEN_CLASSIFY: "sparse_linear.pt", Task.TOKEN_EMBED: "colbert_linear.pt"}

# Model facts, decided here once from each family's module (core.families) and carried in the resolved
# configuration (the encoder wrapper reads them from there).
DECODER_MODEL_TYPES = model_types(lambda family: family.decoder)
# What an export may serve: the families the test matrix exports, serves and compares with transformers /
# sentence-transformers (docs/models.md). Anything else is refused at export, by name.
SUPPORTED_MODEL_TYPES = model_types(lambda family: family.supported)
# Of those, families the matrix proves for one use only (export.refusals.check_supported refuses the rest).
ONE_USE_MODEL_TYPES = {model_type: family.one_use for family in FAMILIES if family.one_use
                       for model_type in family.model_types}
# Image towers (export.vision); their text side is not exported through the text resolver.
VISION_MODEL_TYPES = model_types(lambda family: family.supported and family.vision)
MULTIMODAL_MODEL_TYPES = model_types(lambda family: family.vision)
FP16_OVERFLOW_MODEL_TYPES = model_types(lambda family: family.fp16_overflow)
TEXT_ENCODER_MODEL_TYPES = model_types(lambda family: family.text_encoder)
PLAIN_MASK_MODEL_TYPES = model_types(lambda family: family.plain_mask)
POSITION_OFFSET_MODEL_TYPES = model_types(lambda family: family.position_offset)
CLS_DEFAULT_MODEL_TYPES = model_types(lambda family: family.cls_default)
SELF_POOLING_HEAD_MODEL_TYPES = model_types(lambda family: family.self_pooling_head)
BIDIRECTIONAL_FLAG_MODEL_TYPES = model_types(lambda family: family.bidirectional_flag)
STATIC_EMBEDDING, STATIC_MAX_LENGTH = static_embedding.MODEL_TYPE, static_embedding.MAX_LENGTH
static_module, static_config = static_embedding.module, static_embedding.config
# Older sentence-transformers Pooling configs use one boolean per mode.
_ST_BOOLEAN_MODES = {
    "pooling_mode_cls_token": PoolingType.CLS,
    "pooling_mode_mean_tokens": PoolingType.MEAN,
    "pooling_mode_lasttoken": PoolingType.LAST,
    "pooling_mode_max_tokens": PoolingType.MAX,
    "pooling_mode_mean_sqrt_len_tokens": PoolingType.MEAN_SQRT_LEN,
    "pooling_mode_weightedmean_tokens": PoolingType.WEIGHTED_MEAN,
}
_CLASSIFIER_POOLING = {"cls": PoolingType.CLS, "mean": PoolingType.MEAN}
_ST_MODE_NAMES = {"cls": PoolingType.CLS, "mean": PoolingType.MEAN, "lasttoken": PoolingType.LAST,
                  "max": PoolingType.MAX, "mean_sqrt_len_tokens": PoolingType.MEAN_SQRT_LEN,
                  "weightedmean": PoolingType.WEIGHTED_MEAN}
# The sentence-transformers modules an export reproduces (by the class name ending the module's type).
_ST_MODULES = ("Transformer", "Pooling", "Dense", "Normalize", "MLMTransformer", "SpladePooling", "StaticEmbedding")
_SPLADE_STRATEGIES = {"max": PoolingType.SPLADE_MAX, "sum": PoolingType.SPLADE_SUM}
_PROBLEM_TYPE_ACTIVATION = {
    "regression": Activation.IDENTITY,
    "single_label_classification": Activation.SOFTMAX,
    "multi_label_classification": Activation.SIGMOID,
}
_TORCH_ACTIVATIONS = {"Sigmoid": Activation.SIGMOID, "Softmax": Activation.SOFTMAX, "Identity": Activation.IDENTITY}


def model_config(root: Path) -> dict[str, Any] | None:
    """config.json as the export reads it (as_transformers_config), a StaticEmbedding's described by
    static_config; None where the folder has neither."""
    module = static_module(root, read_json(root / "modules.json"))
    if module is not None:
        return static_config(module)
    written = read_json(root / "config.json")
    return None if written is None else as_transformers_config(written)


@dataclass(frozen=True)
class PoolerConfig:
    task: Task
    pooling_type: PoolingType
    activation: Activation
    use_activation: bool
    max_length: int
    num_labels: int | None = None
    labels: tuple[str, ...] | None = None
    step_tag_id: int | None = None
    returned_token_ids: tuple[int, ...] | None = None
    architecture: str = ""
    model_type: str = ""
    causal: bool = False  # a decoder: causal attention mask, positions over real tokens
    # A query attends keys closer than this many positions (0: no window), in every layer, or in the
    # "sliding_attention" layers where the model names layer types (Gemma 3, ModernBERT's local layers).
    sliding_window: int = 0
    plain_mask: bool = False  # the model takes the 0/1 mask and builds its own (PLAIN_MASK_MODEL_TYPES)
    dense_layers: tuple[str, ...] = ()  # sentence-transformers Dense module folders applied after pooling
    # A causal LM served as a one-label classifier from LM-head rows (vLLM's classifier_from_token): (no, yes)
    # gives the logit yes - no, so its sigmoid is the two-way softmax (Qwen3-Reranker); (yes,) that row's
    # logit alone (no_post_processing: bge-reranker-v2-gemma's "Yes").
    classifier_token_ids: tuple[int, ...] | None = None
    # sentence-transformers prompts (name -> text put before each text) and the one used when a request
    # names none (config_sentence_transformers.json); applied by the tokenizer stage.
    prompts: dict[str, str] = field(default_factory=dict, compare=False)
    default_prompt_name: str | None = None
    self_pooling_head: bool = False  # a classifier whose head pools (the graph runs it whole)
    text_encoder: bool = False  # an encoder-decoder embedding from its encoder alone (TEXT_ENCODER_MODEL_TYPES)
    # A linear head of the folder's own (a file of torch tensors, M3_HEADS) on every token's hidden state, and
    # the ids of a text's first / last token left out of the answer (PoolerParameters.drop_first / drop_last).
    token_head: str | None = None
    drop_first: int | None = None
    drop_last: int | None = None
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("task", "pooling_type", "activation"):
            data[key] = data[key].value
        return data


@dataclass
class ModelFiles:
    """The JSON files of a Hugging Face / sentence-transformers model folder."""

    root: Path
    hf: dict[str, Any]
    modules: list[dict[str, Any]] | None
    st_pooling: dict[str, Any] | None
    st_bert: dict[str, Any] | None
    tokenizer_config: dict[str, Any]
    st_config: dict[str, Any] | None = None  # config_sentence_transformers.json (prompts)

    @classmethod
    def read(cls, root: str | Path) -> ModelFiles:
        root = Path(root)
        hf = model_config(root)
        if hf is None:
            raise ResolutionError(f"{root} has no config.json: not a Hugging Face model folder")
        modules = read_json(root / "modules.json")
        pooling = None
        if modules:
            for module in modules:
                if module.get("type", "").endswith("Pooling"):
                    pooling = read_json(root / module.get("path", "") / "config.json")
        return cls(
            root=root,
            hf=hf,
            modules=modules,
            st_pooling=pooling,
            st_bert=read_json(root / "sentence_bert_config.json"),
            tokenizer_config=read_json(root / "tokenizer_config.json") or {},
            st_config=read_json(root / "config_sentence_transformers.json"),
        )

    @property
    def architecture(self) -> str:
        archs = self.hf.get("architectures") or [""]
        return archs[0]

    @property
    def static(self) -> bool:
        return self.hf.get("model_type") == STATIC_EMBEDDING

    def has_st_module(self, suffix: str) -> bool:
        return bool(self.modules) and any(m.get("type", "").endswith(suffix) for m in self.modules)


def read_json(path: Path) -> Any:
    """A JSON file of a model folder, None where there is none; one that is not JSON is refused, naming it."""
    if not path.is_file():
        return None
    try:
        with path.open(encoding="utf-8") as handle:
            return json.load(handle)
    except ValueError:
        raise ResolutionError(f"{path} is not JSON") from None


def task_from_architecture(architecture: str) -> Task:
    """vLLM's converter: the architecture name says which pooling task a model serves by default.

    `*For*Classification` / `*ClassificationModel` -> classify (token_classify for token heads);
    everything else (`*Model`, `*EmbeddingModel`, `*ForTextEncoding`, `*RewardModel`, and decoder
    LLMs such as `*ForCausalLM`) -> embed.
    """
    if ("For" in architecture and architecture.endswith("Classification")) or architecture.endswith(
        "ClassificationModel"
    ):
        return Task.TOKEN_CLASSIFY if "TokenClassification" in architecture else Task.CLASSIFY
    return Task.EMBED


def is_causal_lm(architecture: str) -> bool:
    return architecture.endswith("ForCausalLM") or architecture.endswith("LMHeadModel")


def is_decoder(files: ModelFiles) -> bool:
    return (bool(files.hf.get("is_decoder")) or is_causal_lm(files.architecture)
            or files.hf.get("model_type", "") in DECODER_MODEL_TYPES)


def bidirectional_by_flag(hf: dict[str, Any]) -> bool:
    return bool(hf.get("use_bidirectional_attention")) and hf.get("model_type") in BIDIRECTIONAL_FLAG_MODEL_TYPES


def bidirectional_by_is_causal(hf: dict[str, Any]) -> bool:
    """transformers' switch for any decoder (masking_utils: `not getattr(config, "is_causal", True)`), which
    vLLM's and TEI's Qwen models read too: gte-Qwen2 and other bidirectional conversions set it false."""
    return not hf.get("is_causal", True)


# Code on the hub that transformers ports (core.families: nomic_bert, gte): a config whose auto_map names only
# that code is read as the port, as transformers itself reads it without trust_remote_code (and
# sentence-transformers by default), TEI and vLLM with their own ports; its keys the port does not read are
# compared by unread_config_keys. Code from anywhere else (a copy in the folder may have been changed) is left
# to --trust-remote-code.
def _ported_family(hf: dict[str, Any]) -> Family | None:
    """The family whose code every auto_map entry names; Alibaba's GTE for their `new` config without one."""
    auto_map = hf.get("auto_map") or {}
    code = list(auto_map.values()) if isinstance(auto_map, dict) else [None]
    found = {ported(lambda prefix, name=name: isinstance(name, str) and name.startswith(prefix)) for name in code}
    if len(found) == 1 and None not in found:
        return found.pop()
    return gte.FAMILY if not found and hf.get("model_type") == "new" else None


def as_transformers_config(hf: dict[str, Any]) -> dict[str, Any]:
    """config.json as transformers reads it: code it ports as that port (the family's read_config), else as is."""
    family = _ported_family(hf)
    if family is None or hf.get("model_type") not in family.ported_types:
        return hf
    read = {key: value for key, value in hf.items() if key != "auto_map"}
    return family.read_config(read) if family.read_config else read


def unread_config_keys(hf: dict[str, Any]) -> list[str]:
    """`key=value (computed with ...)` for each key of config.json that would change the model's math but
    that transformers' implementation of its family does not read. BERT-like families lost their relative
    position_embedding_type in transformers 5 (its weights are then dropped too)."""
    family = family_of(hf.get("model_type"))
    unread = family.unread_keys(hf) if family.unread_keys else []
    positions = hf.get("position_embedding_type")
    if not family.own_positions and positions not in (None, "absolute"):
        unread.append(f"position_embedding_type={positions!r} (computed with 'absolute')")
    return unread


def is_causal(files: ModelFiles) -> bool:
    """A decoder attends causally unless its config says it is bidirectional (EmbeddingGemma's flag, or
    `is_causal: false`)."""
    return is_decoder(files) and not bidirectional_by_flag(files.hf) and not bidirectional_by_is_causal(files.hf)


def sliding_window(hf: dict[str, Any]) -> int:
    """The attention window as |query - key| < window, from the config's own keys: ModernBERT's
    `local_attention` (a query sees local_attention // 2 tokens each way), else `sliding_window` where
    the layers slide (layer types that name sliding layers, or no layer types and no use_sliding_window
    false: Mistral). Gemma 3 without layer types in its file gets them from sliding_window_pattern, which
    the encoder reads from the loaded config."""
    if hf.get("local_attention"):
        return int(hf["local_attention"]) // 2 + 1
    window = hf.get("sliding_window")
    if not window:
        return 0
    layer_types = hf.get("layer_types")
    if layer_types is not None and "sliding_attention" not in layer_types:
        return 0
    if layer_types is None and hf.get("use_sliding_window") is False:
        return 0
    # Gemma 3's flag makes its config keep N // 2 + 1 of a window of N (bidirectional, exclusive bounds);
    # with `is_causal: false` transformers keeps |query - key| <= the config's window
    # (create_bidirectional_sliding_window_mask), one more than the exclusive bound here.
    window = int(window) // 2 + 1 if bidirectional_by_flag(hf) else int(window)
    return window + 1 if bidirectional_by_is_causal(hf) else window


def st_pooling_type(pooling: dict[str, Any], splade: bool = False) -> PoolingType | None:
    if splade:  # a SparseEncoder's SpladePooling (its defaults where the file names none: max, relu)
        activation = pooling.get("activation_function", "relu")
        if activation != "relu":
            raise ResolutionError(f"SpladePooling activation_function {activation!r} is not supported (relu is)")
        strategy = pooling.get("pooling_strategy", "max")
        if strategy not in _SPLADE_STRATEGIES:
            raise ResolutionError(f"SpladePooling pooling_strategy {strategy!r} is not supported (max or sum)")
        return _SPLADE_STRATEGIES[strategy]
    if pooling.get("include_prompt") is False:
        raise ResolutionError("sentence-transformers pooling without the prompt's tokens (include_prompt: false) "
                              "is not supported")
    mode = pooling.get("pooling_mode")
    if isinstance(mode, list | tuple):
        if len(mode) != 1:
            raise ResolutionError(f"concatenated sentence-transformers pooling modes {list(mode)} are not supported")
        mode = mode[0]
    if isinstance(mode, str):
        if mode not in _ST_MODE_NAMES:
            raise ResolutionError(f"sentence-transformers pooling_mode {mode!r} is not supported")
        return _ST_MODE_NAMES[mode]
    chosen = [pooling_type for key, pooling_type in _ST_BOOLEAN_MODES.items() if pooling.get(key)]
    if len(chosen) > 1:
        raise ResolutionError(f"concatenated sentence-transformers pooling modes {[t.value for t in chosen]} "
                              "are not supported")
    unsupported = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v and k not in _ST_BOOLEAN_MODES]
    if unsupported:
        raise ResolutionError(f"sentence-transformers pooling modes {unsupported} are not supported")
    # A Pooling config that names no mode pools by the mean, as sentence-transformers' Pooling does.
    return chosen[0] if chosen else PoolingType.MEAN


def st_dense_layers(files: ModelFiles) -> tuple[str, ...]:
    """The folders of the Dense modules after Pooling, in order; any module the export cannot reproduce
    is refused by name."""
    dense, normalized = [], False
    for module in files.modules or ():
        kind = module.get("type", "").rsplit(".", 1)[-1]
        if kind not in _ST_MODULES:
            raise ResolutionError(f"sentence-transformers module {module.get('type')!r} ({module.get('path')}) is "
                                  f"not supported; supported modules: {', '.join(_ST_MODULES)}")
        if normalized:  # the export normalises the final vector only
            raise ResolutionError(f"a sentence-transformers Normalize before the {kind} module "
                                  f"({module.get('path')}) is not supported: only a Normalize last")
        normalized = kind == "Normalize"
        if kind == "Dense":
            dense.append(str(module.get("path", "")))
    return tuple(dense)


def resolve_max_length(files: ModelFiles, explicit: int | None = None) -> tuple[int, str]:
    """The smallest of sentence-transformers' max_seq_length, the tokenizer's limit and what the position
    table holds (less the RoBERTa-family offset); an absurd tokenizer limit (1e30) is ignored.
    tokenizer.json's own truncation settings are ignored on purpose: MiniLM's says 128 while the model
    is used at 256."""
    # nomic's own code rescales its rotary positions (dynamic NTK) past max_trained_positions where its config
    # sets rotary_scaling_factor, and transformers' port never does: the two agree up to there only.
    # (With auto_map its own code runs and is the reference: nothing to cap.)
    scaled = (files.hf.get("rotary_scaling_factor") and not files.hf.get("auto_map")
              and files.hf.get("max_trained_positions", 2048))
    if explicit and scaled and explicit > int(scaled):
        raise ResolutionError(f"max length {explicit} is past max_trained_positions ({scaled}), where the model's own "
                              "code rescales rotary positions (rotary_scaling_factor) and transformers does not")
    if explicit:
        return explicit, EXPLICIT
    if files.static:  # the library reads a text whole, unless its tokenizer.json cuts it
        module = static_module(files.root, files.modules)
        cut = (read_json(module / "tokenizer.json") or {}).get("truncation") if module is not None else None
        return (int(cut["max_length"]), "tokenizer-json") if cut else (STATIC_MAX_LENGTH, TASK_DEFAULT)
    limits: list[tuple[int, str]] = [(int(scaled), HF_CONFIG)] if scaled else []
    if files.st_bert and files.st_bert.get("max_seq_length"):
        limits.append((int(files.st_bert["max_seq_length"]), SENTENCE_TRANSFORMERS))
    tok_max = files.tokenizer_config.get("model_max_length")
    if isinstance(tok_max, int) and 0 < tok_max < 1_000_000:
        limits.append((tok_max, "tokenizer-config"))
    positions = files.hf.get("max_position_embeddings") or files.hf.get("n_positions")
    if positions:
        pad = files.hf.get("pad_token_id")
        offset = 0
        if files.hf.get("model_type") in POSITION_OFFSET_MODEL_TYPES:
            offset = (1 if pad is None else int(pad)) + 1
        limits.append((int(positions) - offset, HF_CONFIG))
    return min(limits, key=lambda limit: limit[0]) if limits else (512, TASK_DEFAULT)


def resolve(
    model_dir: str | Path,
    task: Task | str | None = None,
    pooling_type: PoolingType | str | None = None,
    use_activation: bool | None = None,
    max_length: int | None = None,
    step_tag_id: int | None = None,
    returned_token_ids: tuple[int, ...] | None = None,
    convert: str | None = None,
    classifier_tokens: tuple[tuple[str, int], ...] | None = None,
) -> PoolerConfig:
    """Resolve every field independently; arguments that are not None are the explicit layer.

    `convert` ("embed" or "classify") overrides the task family the architecture name implies.
    `classifier_tokens` ((no, id), (yes, id)), or ((yes, id),), turns a causal LM into a one-label classifier
    (a reranker).
    """
    files = ModelFiles.read(model_dir)
    sources: dict[str, str] = {}
    architecture = files.architecture
    model_type = files.hf.get("model_type", "")
    if classifier_tokens is not None:
        if not is_causal_lm(architecture):
            raise ResolutionError("classifier tokens convert a causal LM (*ForCausalLM); "
                                  f"{architecture or 'this model'} is not one")
        if task not in (None, Task.CLASSIFY, "classify") or convert not in (None, "classify"):
            raise ResolutionError("classifier tokens make a classify model; other tasks cannot be asked with them")
        convert, sources["classifier_tokens"] = "classify", EXPLICIT

    # --convert asks for the architecture's plain task family (the hidden states): no M3 head then.
    m3 = convert is None and _m3_head(files, task, pooling_type, step_tag_id, returned_token_ids)
    if m3:
        resolved_task, sources["task"] = Task(task), EXPLICIT
        sources["token_head"] = sources["drop_first"] = MODEL_FILES
        if resolved_task is Task.TOKEN_CLASSIFY:
            sources["drop_last"] = MODEL_FILES
    else:
        resolved_task = _resolve_task(architecture, task, convert, pooling_type, returned_token_ids, sources)
    resolved_pooling = _resolve_pooling(files, resolved_task, pooling_type, sources)
    if resolved_pooling is PoolingType.STEP and not (returned_token_ids or step_tag_id is not None):
        raise ResolutionError("STEP pooling needs returned_token_ids or step_tag_id")
    if m3:  # FlagEmbedding's: one weight per token (relu), ColBERT vectors normalised
        num_labels, labels = (1, ("weight",)) if resolved_task is Task.TOKEN_CLASSIFY else (None, None)
        activation = Activation.RELU if resolved_task is Task.TOKEN_CLASSIFY else Activation.NORMALIZE
        sources["activation"] = MODEL_FILES
        use_activation, sources["use_activation"] = ((True, MODEL_FILES) if use_activation is None
                                                     else (use_activation, EXPLICIT))
    else:
        num_labels, labels = _resolve_labels(files, resolved_task, classifier_tokens, returned_token_ids)
        activation, use_activation = _resolve_activation(files, resolved_task, num_labels, use_activation,
                                                         classifier_tokens is not None, resolved_pooling.sparse,
                                                         sources)
    dense_layers = st_dense_layers(files) if resolved_task is Task.EMBED else ()
    if resolved_pooling.sparse and dense_layers:
        raise ResolutionError("a Dense module after SPLADE pooling is not supported")
    if files.static and dense_layers:  # no checkpoint has one: only its Normalize is exported
        raise ResolutionError("a Dense module after a StaticEmbedding is not supported")
    length, sources["max_length"] = resolve_max_length(files, max_length)
    return PoolerConfig(
        task=resolved_task,
        pooling_type=resolved_pooling,
        activation=activation,
        use_activation=bool(use_activation),
        max_length=length,
        num_labels=num_labels,
        labels=labels,
        step_tag_id=step_tag_id,
        returned_token_ids=tuple(returned_token_ids) if returned_token_ids else None,
        architecture=architecture,
        model_type=model_type,
        causal=is_causal(files),
        sliding_window=sliding_window(files.hf),
        plain_mask=model_type in PLAIN_MASK_MODEL_TYPES,
        dense_layers=dense_layers,
        classifier_token_ids=tuple(token_id for _, token_id in classifier_tokens) if classifier_tokens else None,
        **_prompts(files, resolved_task),
        self_pooling_head=resolved_task is Task.CLASSIFY and model_type in SELF_POOLING_HEAD_MODEL_TYPES,
        text_encoder=model_type in TEXT_ENCODER_MODEL_TYPES,
        token_head=M3_HEADS[resolved_task] if m3 else None,
        drop_first=files.hf.get("bos_token_id") if m3 else None,
        drop_last=files.hf.get("eos_token_id") if m3 and resolved_task is Task.TOKEN_CLASSIFY else None,
        sources=sources,
    )


def _m3_head(files: ModelFiles, task: Task | str | None, pooling_type: PoolingType | str | None,
             step_tag_id: int | None, returned_token_ids: tuple[int, ...] | None) -> bool:
    """A BGE-M3 folder asked for a token task its own head answers (M3_HEADS): an XLM-R encoder with the file."""
    if task is None or Task(task) not in M3_HEADS or files.hf.get("model_type") != "xlm-roberta":
        return False
    if task_from_architecture(files.architecture) is not Task.EMBED:  # a classifier's folder: its own head
        return False
    if not (files.root / M3_HEADS[Task(task)]).is_file():
        return False
    if pooling_type not in (None, PoolingType.ALL, "ALL") or step_tag_id is not None or returned_token_ids:
        raise ResolutionError(f"BGE-M3's {M3_HEADS[Task(task)]} answers every token (ALL pooling): no STEP "
                              "pooling, step tag or returned token ids")
    return True


def _resolve_task(architecture: str, task: Task | str | None, convert: str | None,
                  pooling_type: PoolingType | str | None, returned_token_ids: tuple[int, ...] | None,
                  sources: dict[str, str]) -> Task:
    """Explicit task > the architecture's (or `convert`'s) family; checked against the model's head."""
    arch_task = task_from_architecture(architecture)
    if convert is not None:
        if convert not in ("embed", "classify"):
            raise ResolutionError(f"convert must be 'embed' or 'classify', not {convert!r}")
        arch_task = Task(convert)
        sources["convert"] = EXPLICIT
    if task is not None:
        resolved = Task(task)
        reward_lm = (resolved is Task.TOKEN_CLASSIFY and is_causal_lm(architecture)
                     and bool(returned_token_ids) and pooling_type == PoolingType.STEP)
        if not reward_lm:
            _check_task_supported(arch_task, resolved, architecture)
        sources["task"] = EXPLICIT
    else:
        resolved, sources["task"] = arch_task, ARCHITECTURE
    if resolved is Task.CLASSIFY and arch_task is Task.TOKEN_CLASSIFY:
        raise ResolutionError(f"{architecture} classifies tokens; use task token_classify")
    if resolved is Task.TOKEN_CLASSIFY and arch_task is Task.CLASSIFY:
        raise ResolutionError(f"{architecture} classifies sequences; use task classify")
    return resolved


def _resolve_pooling(files: ModelFiles, task: Task, pooling_type: PoolingType | str | None,
                     sources: dict[str, str]) -> PoolingType:
    """Explicit > token tasks' ALL > sentence-transformers > the classifier's config > the architecture's."""
    model_type = files.hf.get("model_type", "")
    st_type = (st_pooling_type(files.st_pooling, splade=files.has_st_module("SpladePooling"))
               if files.st_pooling is not None else None)
    if pooling_type is not None:
        resolved, sources["pooling_type"] = PoolingType(pooling_type), EXPLICIT
    elif task.per_token:
        resolved, sources["pooling_type"] = PoolingType.ALL, TASK_DEFAULT
    elif st_type is not None:
        resolved, sources["pooling_type"] = st_type, SENTENCE_TRANSFORMERS
    elif files.static:  # StaticEmbedding averages its tokens' vectors
        resolved, sources["pooling_type"] = PoolingType.MEAN, SENTENCE_TRANSFORMERS
    elif task is Task.CLASSIFY and files.hf.get("classifier_pooling") in _CLASSIFIER_POOLING:
        # ModernBERT's classifier pools as its config says before its head.
        resolved, sources["pooling_type"] = _CLASSIFIER_POOLING[files.hf["classifier_pooling"]], HF_CONFIG
    elif model_type in CLS_DEFAULT_MODEL_TYPES and not is_decoder(files):
        resolved, sources["pooling_type"] = PoolingType.CLS, ARCHITECTURE
    else:
        resolved, sources["pooling_type"] = PoolingType.LAST, ARCHITECTURE
    if resolved.per_token != task.per_token:
        raise ResolutionError(
            f"pooling type {resolved.value} does not fit task {task.value}: "
            "token tasks take ALL or STEP, sequence tasks CLS, LAST, MEAN, MAX, MEAN_SQRT_LEN, WEIGHTED_MEAN, "
            "SPLADE_MAX or SPLADE_SUM"
        )
    if resolved.sparse and task is not Task.EMBED:
        raise ResolutionError(f"pooling type {resolved.value} makes an embedding (task embed), not {task.value}")
    if resolved.sparse and (files.st_config or {}).get("max_active_dims"):
        raise ResolutionError("a SparseEncoder's max_active_dims (keeping only the largest weights) is not supported")
    return resolved


def _resolve_labels(files: ModelFiles, task: Task, classifier_tokens: tuple | None,
                    returned_token_ids: tuple[int, ...] | None) -> tuple[int | None, tuple[str, ...] | None]:
    if task.is_embedding:
        return None, None
    if classifier_tokens is not None:
        return 1, (classifier_tokens[-1][0],)
    if returned_token_ids and is_causal_lm(files.architecture):
        return len(returned_token_ids), tuple(f"token_{i}" for i in returned_token_ids)
    return _labels(files.hf)


def _resolve_activation(files: ModelFiles, task: Task, num_labels: int | None, use_activation: bool | None,
                        classifier_tokens: bool, sparse: bool, sources: dict[str, str]) -> tuple[Activation, bool]:
    """Embeddings normalise (unless sentence-transformers has no Normalize, or they are SPLADE weights, served
    raw as the library's SparseEncoder has no Normalize); classifiers follow problem_type >
    sentence-transformers > label count."""
    if task.is_embedding:
        activation = Activation.NORMALIZE
        if use_activation is not None:
            sources["use_activation"] = EXPLICIT
        elif files.st_pooling is not None or files.static:
            use_activation = files.has_st_module("Normalize")
            sources["use_activation"] = SENTENCE_TRANSFORMERS
        else:
            use_activation, sources["use_activation"] = not sparse, TASK_DEFAULT
        sources["activation"] = TASK_DEFAULT
        return activation, bool(use_activation)
    if classifier_tokens:
        activation, sources["activation"] = Activation.SIGMOID, EXPLICIT
    else:
        activation, sources["activation"] = _classifier_activation(files.hf, num_labels, files.st_config)
    if use_activation is None:
        use_activation, sources["use_activation"] = True, TASK_DEFAULT
    else:
        sources["use_activation"] = EXPLICIT
    return activation, bool(use_activation)


def _prompts(files: ModelFiles, task: Task) -> dict[str, Any]:
    """Embedding prompts as sentence-transformers keeps them; a default must name one of them."""
    st = files.st_config or {}
    if task.is_embedding and st.get("truncate_dim") is not None:
        # sentence-transformers cuts every vector to it (after Normalize, without re-normalising).
        raise ResolutionError(f"truncate_dim {st['truncate_dim']} in config_sentence_transformers.json is not "
                              "supported: remove it and export with --matryoshka-dimensions to serve the cut "
                              "vectors on request (dimensions), re-normalised")
    prompts = {str(k): str(v) for k, v in (st.get("prompts") or {}).items()} if task.is_embedding else {}
    default = st.get("default_prompt_name") if prompts else None
    if default is not None and default not in prompts:
        raise ResolutionError(f"default_prompt_name {default!r} is not one of the model's prompts {sorted(prompts)}")
    return {"prompts": prompts, "default_prompt_name": default}


def _check_task_supported(arch_task: Task, task: Task, architecture: str) -> None:
    classifier = arch_task in (Task.CLASSIFY, Task.TOKEN_CLASSIFY)
    if task.is_embedding and classifier:
        raise ResolutionError(
            f"{architecture} is a classification model; it serves classify/token_classify, not {task.value} "
            "(pass --convert embed to serve its encoder's hidden states)"
        )
    if not task.is_embedding and not classifier:
        raise ResolutionError(
            f"{architecture or 'this model'} has no classification head, so it cannot serve "
            f"{task.value}; export a *ForSequenceClassification / *ForTokenClassification model"
        )


def _labels(hf: dict[str, Any]) -> tuple[int, tuple[str, ...]]:
    id2label = hf.get("id2label") or {}
    num = int(hf.get("num_labels") or len(id2label) or 2)
    names = tuple(str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(num))
    return num, names


def _classifier_activation(hf: dict[str, Any], num_labels: int | None,
                           st_config: dict[str, Any] | None = None) -> tuple[Activation, str]:
    # A CrossEncoder saved by sentence-transformers 6 runs the library's order, which never reads
    # problem_type: its own file's activation_fn > config.json's > Sigmoid for one label, else Identity.
    cross_encoder = (st_config or {}).get("model_type") == "CrossEncoder"
    problem = hf.get("problem_type")
    if problem in _PROBLEM_TYPE_ACTIVATION and not cross_encoder:
        return _PROBLEM_TYPE_ACTIVATION[problem], HF_CONFIG
    saved = (st_config or {}).get("activation_fn") if cross_encoder else None
    st = saved or (hf.get("sentence_transformers") or {}).get("activation_fn") or hf.get(
        "sbert_ce_default_activation_function"
    )
    if not st and cross_encoder:
        return (Activation.SIGMOID if num_labels == 1 else Activation.IDENTITY), SENTENCE_TRANSFORMERS
    if st:
        # Only torch.nn.modules classes are trusted, as sentence-transformers does.
        if not st.startswith("torch.nn.modules."):
            raise ResolutionError(f"refusing activation_fn {st!r}: only torch.nn.modules classes are allowed")
        name = st.rsplit(".", 1)[-1]
        if name not in _TORCH_ACTIVATIONS:
            raise ResolutionError(f"activation_fn {st!r} is not supported")
        return _TORCH_ACTIVATIONS[name], SENTENCE_TRANSFORMERS
    return default_activation(Task.CLASSIFY, num_labels), TASK_DEFAULT
