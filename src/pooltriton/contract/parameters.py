"""Each stage's parameters as one typed object (as each sentence-transformers module owns its config):
the export writes it into the stage's `config.pbtxt` (`to_parameters`), the stage's `initialize` reads
it back (`from_parameters`); no key is spelled twice. Strings are written as they are, everything else
as JSON, and each field is read back as the type it is declared with.

The encoder's runtime keys (intra_op_thread_count, INFERENCE_NUM_THREADS, ...) are the native backends'
own names and stay in `core.runtimes`, which writes and reads them.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

S = TypeVar("S", bound="StageParameters")


def _is_text(hint: Any) -> bool:
    """str, or str | None."""
    if hint is str:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return set(typing.get_args(hint)) == {str, type(None)}
    return False


def _sequence(hint: Any) -> bool:
    if typing.get_origin(hint) is tuple:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(typing.get_origin(arg) is tuple for arg in typing.get_args(hint))
    return False


class StageParameters:
    """Base of the frozen dataclasses below."""

    def to_parameters(self) -> dict[str, str]:
        """config.pbtxt parameters (string values); None fields are left out (their default applies)."""
        out = {}
        for item in fields(self):  # type: ignore[arg-type]
            value = getattr(self, item.name)
            if value is not None:
                out[item.name] = value if isinstance(value, str) else json.dumps(value)
        return out

    @classmethod
    def from_parameters(cls: type[S], parameters: dict[str, str]) -> S:
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for item in fields(cls):  # type: ignore[arg-type]
            if item.name not in parameters:
                continue
            raw = parameters[item.name]
            value = raw if _is_text(hints[item.name]) else json.loads(raw)
            values[item.name] = tuple(value) if _sequence(hints[item.name]) and isinstance(value, list) else value
        return cls(**values)


@dataclass(frozen=True)
class TokenizerParameters(StageParameters):
    max_length: int
    pad_token_id: int
    outputs: tuple[str, ...]  # the token tensors the encoder (and the pooler) read
    tokenizer_file: str = "tokenizer.json"
    pad_to_buckets: tuple[int, ...] | None = None  # batching "buckets": pad to these lengths
    prompts: dict[str, str] = field(default_factory=dict)  # sentence-transformers prompts by name
    default_prompt_name: str | None = None
    use_activation: bool = True  # ACTIVATE where a request does not say (embed: the model's Normalize)
    # The encoder stage it feeds: admission by work shares that encoder's board (backends.workboard).
    encoder: str | None = None


@dataclass(frozen=True)
class EncoderParameters(StageParameters):
    """What the ragged shims read beside the runtime's native keys."""

    pad_token_id: int
    max_length: int
    ragged_token_budget: int | None = None  # None: batching "buckets" (no ragged planner)
    memory_per_token: int | None = None  # bytes of one row per token at a layer's peak (export.memory)
    memory_per_attention_cell: int | None = None  # ... and per query-key pair
    memory_budget: int = 0  # bytes the encoder may hold at once; 0: half the machine's
    # What the export verified (a stage warns when this CPU runs something else); None: exported before
    # this was written (the native HINT_BF16 key says then).
    precision: str | None = None


@dataclass(frozen=True)
class PoolerParameters(StageParameters):
    task: str
    activation: str
    use_activation: bool = True
    step_tag_id: int | None = None
    # A text's first real token is not answered where it is this id, nor its last where it is drop_last
    # (BGE-M3's token outputs leave out <s>, and its lexical weights </s> too).
    drop_first: int | None = None
    drop_last: int | None = None


@dataclass(frozen=True)
class ScorerParameters(StageParameters):
    mode: str  # cross_encoder, bi_encoder or late_interaction
    model: str  # the ensemble it calls
    output: str  # that ensemble's output it reads
    template: str | None = None  # a decoder reranker's prompt ({query}, {document})


@dataclass(frozen=True)
class PluginParameters(StageParameters):
    plugin: str  # the name the plugin class is registered under
    model: str  # the exported model it wraps
    outputs: tuple[str, ...]  # that model's outputs it reads
    module: str | None = None  # imported so the plugin registers


@dataclass(frozen=True)
class EnsembleParameters(StageParameters):
    """What clients read from a served model's config (contract.requests.model_info)."""

    task: str
    max_length: int | None = None
    labels: tuple[str, ...] | None = None
    matryoshka_dimensions: tuple[int, ...] | None = None
    # Whether the model activates (embed: normalises) where a request does not say: a vector cut to a
    # Matryoshka size is re-normalised only then (vLLM). None: exported before this was written.
    use_activation: bool | None = None
    prompts: tuple[str, ...] | None = None  # the names of the model's prompts (Cohere's input_type picks one)
    sparse: bool | None = None  # a vocabulary-wide SPLADE vector (text-embeddings-inference's /embed_sparse)
    pooling: str | None = None  # the pooling type (PoolingType's value), for text-embeddings-inference's /info
    precision: str | None = None  # the encoder's (fp32, bf16, fp16, int8)
    # One weight per token (BGE-M3's lexical weights): answered [tokens], as vLLM squeezes them, not [tokens, 1].
    token_weights: bool | None = None
    # Other names the model answers to (vLLM's and TEI's --served-model-name); models that share one are told
    # apart by the task a request asks for (BGE-M3's three exports under one name, as vLLM serves it).
    served_names: tuple[str, ...] | None = None
    # The tokenizer's chat template and the special tokens it reads (bos_token, ...): vLLM's chat-form bodies
    # (`messages`) are rendered with them (client.chat). None: the model has none, or an older export.
    chat_template: str | None = None
    chat_tokens: dict[str, str] | None = None
    # What the model embeds: None or "text" (TEXT), "image" (IMAGE: an image tower's ensemble). A text
    # ensemble with an image tower names its image ensemble (image_model), which names it back (text_model).
    modality: str | None = None
    image_model: str | None = None
    text_model: str | None = None


@dataclass(frozen=True)
class ImageParameters(StageParameters):
    """The image processor stage: its processor file (core.images.read_processor) and decoding limits."""

    processor_file: str = "preprocessor_config.json"
    max_image_bytes: int | None = None  # None: core.images' defaults
    max_image_pixels: int | None = None
    use_activation: bool = True  # ACTIVATE where a request does not say (the model's normalisation)


STAGE_PARAMETERS = (TokenizerParameters, ImageParameters, EncoderParameters, PoolerParameters, ScorerParameters,
                    PluginParameters, EnsembleParameters)
