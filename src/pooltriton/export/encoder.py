"""The torch encoder with the task's pooling (and head) baked in, and its ONNX / TorchScript export.

One module serves every task: backbone -> pooling -> head. The attention mask is built here as a
4-D additive mask (and decoders get position ids from the mask), so the traced graph has no
shape-specialised mask code from transformers, and left- and right-padded rows give the same answers.
"""

from __future__ import annotations

import inspect
import json
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from safetensors import SafetensorError
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoModelForTextEncoding,
    AutoModelForTokenClassification,
)
from transformers.modeling_outputs import BaseModelOutput

from pooltriton.contract import ACTIVATE, ENCODER_OUTPUT
from pooltriton.core.resolve import STATIC_EMBEDDING, PoolerConfig, ResolutionError, static_module
from pooltriton.core.semantics import Activation, PoolingType, Task
from pooltriton.export.pooling import get_pooler
from pooltriton.export.refusals import check_weights

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class PoolingEncoder(nn.Module):
    def __init__(self, network: nn.Module, config: PoolerConfig, input_names: tuple[str, ...], causal: bool,
                 head: nn.Module | None, returns_logits: bool, hf_config: object) -> None:
        super().__init__()
        self.network = network
        self.pool = get_pooler(config.pooling_type) if not returns_logits or config.task.per_token else None
        self.sparse = config.pooling_type.sparse  # pools the masked-LM head's logits (SPLADE)
        self.head = head
        # Embed normalises inside the graph, per text as ACTIVATE says (the ensemble needs no pooler).
        self.activates = config.task is Task.EMBED and config.activation is Activation.NORMALIZE
        self.input_names = (*input_names, ACTIVATE) if self.activates else input_names
        self.causal = causal
        self.sliding_window = config.sliding_window
        self.plain_mask = config.plain_mask
        # Models that name layer types (full / sliding attention) take a mask per type.
        self.layer_types = sorted(set(getattr(hf_config, "layer_types", None) or ()))
        self.takes_use_cache = "use_cache" in inspect.signature(network.forward).parameters
        self.returns_logits = returns_logits
        self.config = hf_config
        self.compute_dtype = torch.float32

    def masks(self, attention_mask: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        """The attention the model's config asks for, built here from tensor ops (traceable, no
        shape-specialised transformers mask code): padding, causality, and the sliding window, as one
        additive mask or, for models with layer types, one per type."""
        if self.plain_mask:
            return attention_mask
        keep = attention_mask[:, None, None, :].to(torch.bool)
        length = attention_mask.shape[1]
        positions = torch.arange(length, device=attention_mask.device)
        if self.causal:
            keep = keep & (positions[:, None] >= positions[None, :])[None, None]
        full = self._additive(keep)
        if not self.sliding_window:
            return {kind: full for kind in self.layer_types} if self.layer_types else full
        near = (positions[:, None] - positions[None, :]).abs() < self.sliding_window
        windowed = self._additive(keep & near[None, None])
        if not self.layer_types:
            return windowed  # every layer slides (Mistral)
        return {kind: windowed if kind == "sliding_attention" else full for kind in self.layer_types}

    def _additive(self, keep: torch.Tensor) -> torch.Tensor:
        additive = torch.zeros(keep.shape, dtype=self.compute_dtype, device=keep.device)
        # Half the dtype's minimum: score + mask must stay finite in fp16 (a -inf row gives NaN).
        return additive.masked_fill(~keep, torch.finfo(self.compute_dtype).min / 2)

    def to_precision(self, precision: str, device: str = "cpu") -> PoolingEncoder:
        """Weights and mask in `precision` on `device`; the output stays fp32 (the configs say FP32)."""
        self.compute_dtype = DTYPES[precision]
        return self.to(device=device, dtype=self.compute_dtype)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        """`extra`: token_type_ids and ACTIVATE where `input_names` has them, in that order (without
        ACTIVATE: raw vectors)."""
        named = dict(zip(self.input_names[2:], extra))
        token_type_ids = named.get("token_type_ids")
        kwargs: dict[str, object] = {"input_ids": input_ids, "attention_mask": self.masks(attention_mask)}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        if self.causal:
            # Positions count real tokens only, so left padding does not shift them.
            kwargs["position_ids"] = (attention_mask.cumsum(1) - 1).clamp(min=0)
        if self.takes_use_cache:
            kwargs["use_cache"] = False
        output = self.network(**kwargs)
        if self.returns_logits:
            return output.logits.float()
        states = output.logits if self.sparse else output.last_hidden_state
        pooled = self.pool(states, attention_mask) if self.pool is not None else states
        vectors = (self.head(pooled) if self.head is not None else pooled).float()
        if ACTIVATE not in named:
            return vectors
        # torch's normalize (sentence-transformers' Normalize, eps 1e-12), where the text asks for it.
        return torch.where(named[ACTIVATE] > 0, nn.functional.normalize(vectors, dim=-1), vectors)


def load_encoder(model_dir: str | Path, config: PoolerConfig, allow_pickle: bool = False,
                 trust_remote_code: bool = False) -> PoolingEncoder:
    """The model as a pooling module. Weights load from safetensors unless `allow_pickle`, and custom
    model code runs only with `trust_remote_code` (export.refusals.check_model_files says why first).
    Files that transformers cannot load (a truncated weight file, a config it does not know) are a
    ResolutionError naming the folder and transformers' own first line."""
    try:
        return _load_encoder(model_dir, config, allow_pickle, trust_remote_code)
    except ResolutionError:
        raise
    # AttributeError / ImportError: custom model code written for another transformers (nomic's, for one).
    except (OSError, ValueError, RuntimeError, KeyError, AttributeError, ImportError, SafetensorError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ResolutionError(f"{model_dir}: the model cannot be loaded by transformers "
                              f"({type(error).__name__}: {first})") from error


def _load_encoder(model_dir: str | Path, config: PoolerConfig, allow_pickle: bool,
                  trust_remote_code: bool) -> PoolingEncoder:
    if config.model_type == STATIC_EMBEDDING:
        return _static_encoder(Path(model_dir), config)
    hf_config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    load = {"config": hf_config, "use_safetensors": None if allow_pickle else True,
            "trust_remote_code": trust_remote_code}
    # Eager attention: plain ops that both exporters handle; the mask is ours (see forward).
    hf_config._attn_implementation = "eager"
    head: nn.Module | None = None
    returns_logits = False
    if config.token_head is not None:  # BGE-M3: its own linear head on every token's hidden state
        network = _complete(AutoModel, model_dir, load)
        network = getattr(network, "base_model", network)
        head = token_head(Path(model_dir) / config.token_head, allow_pickle)
    elif config.pooling_type.sparse:  # SPLADE: the masked-LM head's logits, pooled in the graph
        network = _complete(AutoModelForMaskedLM, model_dir, load)
    elif config.task.is_embedding and config.pooling_type is not PoolingType.STEP:
        # T5's AutoModel is the whole encoder-decoder; its embeddings come from the encoder (T5EncoderModel).
        network = _complete(AutoModelForTextEncoding if config.text_encoder else AutoModel, model_dir, load)
        network = getattr(network, "base_model", network)
        if config.dense_layers:
            head = nn.Sequential(*(_st_dense(Path(model_dir) / path, allow_pickle) for path in config.dense_layers))
    elif config.classifier_token_ids is not None:
        # A decoder reranker: the LM head's (yes - no) row difference (vLLM's from_2_way_softmax), or its yes
        # row alone (no_post_processing: bge-reranker-v2-gemma's "Yes"), as a one-label classifier.
        from transformers import AutoModelForCausalLM

        full = _complete(AutoModelForCausalLM, model_dir, load)
        ids = config.classifier_token_ids
        head = LMHeadRows(full, ids, difference=len(ids) == 2)
        network = full.base_model
    elif config.task is Task.CLASSIFY:
        full = _complete(AutoModelForSequenceClassification, model_dir, load)
        if config.self_pooling_head:
            if config.sources.get("pooling_type") == "explicit" and config.pooling_type is not PoolingType.CLS:
                raise ResolutionError(f"{config.architecture} pools inside its classification head (CLS); "
                                      f"{config.pooling_type.value} pooling cannot be applied")
            network, returns_logits = full, True
        else:
            head = _score_head(full)
            network = full.base_model
    elif config.pooling_type is PoolingType.STEP and config.returned_token_ids:
        # Process reward models read the LM head's logits of a few vocabulary ids at step tags.
        from transformers import AutoModelForCausalLM

        full = _complete(AutoModelForCausalLM, model_dir, load)
        head = LMHeadRows(full, config.returned_token_ids)
        network = full.base_model
    elif config.task is Task.TOKEN_CLASSIFY:
        network = _complete(AutoModelForTokenClassification, model_dir, load)
        returns_logits = True
    else:  # token_embed with STEP pooling and only a step tag: hidden states at the tags
        network = _complete(AutoModel, model_dir, load)
        network = getattr(network, "base_model", network)
    network.eval()
    encoder = PoolingEncoder(network, config, encoder_input_names(network, hf_config), config.causal, head,
                             returns_logits, hf_config)
    return encoder.eval()


class StaticTable(nn.Module):
    """A StaticEmbedding's table as a network: each token's vector is its hidden state (the pooling averages
    them, as the library's EmbeddingBag does; there is no attention, so the mask is not read)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.embeddings = nn.Embedding.from_pretrained(weight.float(), freeze=True)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> BaseModelOutput:
        return BaseModelOutput(last_hidden_state=self.embeddings(input_ids))


def _static_encoder(model_dir: Path, config: PoolerConfig) -> PoolingEncoder:
    """The table as sentence-transformers loads it (model2vec's vocabulary-quantized tables folded into one
    row per token: each token's row of `embeddings` by `mapping`, times its `weights`)."""
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding

    module = static_module(model_dir, json.loads((model_dir / "modules.json").read_text()))
    table = StaticEmbedding.load(str(module)).embedding.weight.detach()
    shape = SimpleNamespace(hidden_size=table.shape[1], vocab_size=table.shape[0])
    return PoolingEncoder(StaticTable(table).eval(), config, ("input_ids", "attention_mask"), False, None, False,
                          shape).eval()


def _complete(auto: Any, model_dir: str | Path, load: dict[str, Any]) -> nn.Module:
    """`auto`'s model of the folder, refused where its weights and its layers disagree (check_weights)."""
    loaded = auto.from_pretrained(model_dir, output_loading_info=True, **load)
    # Custom model code (trust_remote_code) may override from_pretrained and return the model alone.
    network, info = loaded if isinstance(loaded, tuple) else (loaded, {})
    check_weights(model_dir, network, info, bare=auto in (AutoModel, AutoModelForTextEncoding))
    return network


class LMHeadRows(nn.Module):
    """A causal LM's logits of a few vocabulary ids (a process reward's), as the model gives them: its LM
    head's rows, soft-capped where the model caps its logits (Gemma 2's final_logit_softcapping); with
    `difference`, of two ids (no, yes), the reranker's one logit yes - no."""

    def __init__(self, model: nn.Module, ids: tuple[int, ...], difference: bool = False) -> None:
        super().__init__()
        lm_head = model.get_output_embeddings()
        self.rows = nn.Linear(lm_head.in_features, len(ids), bias=lm_head.bias is not None)
        with torch.no_grad():
            self.rows.weight.copy_(lm_head.weight[list(ids)])
            if lm_head.bias is not None:
                self.rows.bias.copy_(lm_head.bias[list(ids)])
        self.cap = getattr(model.config, "final_logit_softcapping", None)
        self.difference = difference
        self.width = 1 if difference else len(ids)  # the outputs

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.rows(hidden)
        if self.cap:
            logits = torch.tanh(logits / self.cap) * self.cap
        return logits[..., 1:] - logits[..., :1] if self.difference else logits


class _Dense(nn.Module):
    """sentence-transformers' Dense laid out as the library lays it out (linear, activation_function,
    residual), so that its weights load strictly, an activation's own (PReLU's) included:
    activation(linear(x)), plus x with use_residual, through a bias-free projection where sizes differ."""

    def __init__(self, settings: dict[str, Any], activation: nn.Module) -> None:
        super().__init__()
        sizes = settings["in_features"], settings["out_features"]
        self.linear = nn.Linear(*sizes, bias=settings.get("bias", True))
        self.activation_function = activation
        self.use_residual = bool(settings.get("use_residual", False))
        if self.use_residual and sizes[0] != sizes[1]:
            self.residual = nn.Linear(*sizes, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.activation_function(self.linear(x))
        if self.use_residual:
            out = out + (self.residual(x) if hasattr(self, "residual") else x)
        return out


def _st_dense(folder: Path, allow_pickle: bool) -> nn.Module:
    """A sentence-transformers Dense module from its own folder's files, with the library's defaults for the
    keys a config leaves out (Tanh, no residual) and its strict load (a weight it has no place for fails)."""
    settings = json.loads((folder / "config.json").read_text())
    for key in ("module_input_name", "module_output_name"):  # a Dense over another feature than the vector
        if settings.get(key) not in (None, "sentence_embedding"):
            raise ResolutionError(f"refusing the Dense in {folder}: its {key} is {settings[key]!r}; only a Dense "
                                  "on the pooled sentence_embedding is supported")
    # sentence-transformers' default where the key is absent; only torch's own classes, as it trusts them
    # (torch.nn.modules.activation.Tanh as it saves them, or torch.nn.Tanh as a hand-written config may).
    activation = settings.get("activation_function", "torch.nn.modules.activation.Tanh")
    kind = getattr(nn, activation.rsplit(".", 1)[-1], None) if isinstance(activation, str) else None
    if not (isinstance(kind, type) and issubclass(kind, nn.Module) and activation.startswith("torch.nn.")):
        raise ResolutionError(f"refusing Dense activation_function {activation!r} in {folder}: only torch.nn "
                              "activation classes are supported")
    dense = _Dense(settings, kind())
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        state = load_file(folder / "model.safetensors")
    elif allow_pickle and (folder / "pytorch_model.bin").is_file():
        state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise ResolutionError(f"{folder} has no model.safetensors (pytorch_model.bin needs --allow-pickle)")
    try:
        dense.load_state_dict(state)
    except RuntimeError as error:
        raise ResolutionError(f"the Dense weights in {folder} do not match its config.json: "
                              f"{str(error).strip().splitlines()[-1].strip()}") from error
    return dense


def token_head(path: Path, allow_pickle: bool) -> nn.Linear:
    """A linear layer saved as torch's state dict (BGE-M3's sparse_linear.pt, colbert_linear.pt), read by
    torch's tensors-only unpickler; still pickle, so only with `allow_pickle`, as pytorch_model.bin."""
    if not allow_pickle:
        raise ResolutionError(f"{path.name} is a pickle file (torch.save): export with --allow-pickle to load it")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or getattr(state.get("weight"), "ndim", 0) != 2:
        raise ResolutionError(f"{path} is not a linear layer's state dict (weight [out, in], bias [out])")
    weight = state["weight"]
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in state)
    linear.load_state_dict(state)
    return linear


def _score_head(model: nn.Module) -> nn.Module:
    """The layers a sequence classifier applies after pooling: its linear score/classifier, behind the
    prediction head some models put first (ModernBERT: dense, activation, norm), or its whole
    classification head where that is a module of its own after pooling (BART: dense, tanh, out_proj)."""
    if isinstance(getattr(model, "classification_head", None), nn.Module):
        return model.classification_head
    for name in ("score", "classifier"):
        head = getattr(model, name, None)
        if isinstance(head, nn.Linear):
            before = [getattr(model, n) for n in ("head", "drop") if isinstance(getattr(model, n, None), nn.Module)]
            return nn.Sequential(*before, head) if before else head
    raise ResolutionError(f"{type(model).__name__} has no linear score/classifier head to apply after pooling")


def encoder_input_names(model: nn.Module, hf_config: object) -> tuple[str, ...]:
    """token_type_ids only where the model takes them and has more than one segment type."""
    accepted = inspect.signature(model.forward).parameters
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in accepted and getattr(hf_config, "type_vocab_size", 0) > 1:
        names.append("token_type_ids")
    return tuple(names)


def output_width(encoder: PoolingEncoder, config: PoolerConfig) -> int:
    if isinstance(encoder.head, LMHeadRows):
        return encoder.head.width
    if encoder.head is not None:
        linears = [m for m in encoder.head.modules() if isinstance(m, nn.Linear)]
        return linears[-1].out_features
    if encoder.returns_logits:
        return int(encoder.config.num_labels)
    if encoder.sparse:  # the masked-LM head's own width (the vocabulary's)
        return int(encoder.network.get_output_embeddings().out_features)
    return int(encoder.config.hidden_size)


def sample_inputs(encoder: PoolingEncoder, batch: int = 2, length: int = 8,
                  device: str = "cpu") -> tuple[torch.Tensor, ...]:
    ids = torch.full((batch, length), 5, dtype=torch.int64, device=device)
    mask = torch.ones_like(ids)
    mask[-1, length // 2 :] = 0
    by_name = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
               ACTIVATE: torch.arange(batch, dtype=torch.int64, device=device).remainder(2).reshape(batch, 1)}
    return tuple(by_name[name] for name in encoder.input_names)


def export_onnx(encoder: PoolingEncoder, path: Path, max_length: int) -> None:
    """torch.export-based ONNX export with dynamic batch and sequence axes.

    The legacy TorchScript-based ONNX exporter baked transformers 5.x mask logic into constants
    (errors of ~0.5 measured on MiniLM); the dynamo exporter is exact to ~1e-6.
    """
    batch = torch.export.Dim("batch", min=1, max=4096)
    sequence = torch.export.Dim("sequence", min=1, max=max(max_length, 2))
    # forward's structure: (input_ids, attention_mask, (the extra inputs)); ACTIVATE has no sequence axis.
    specs = [{0: batch} if name == ACTIVATE else {0: batch, 1: sequence} for name in encoder.input_names]
    dynamic = (specs[0], specs[1], tuple(specs[2:])) if len(specs) > 2 else (specs[0], specs[1])
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            encoder,
            sample_inputs(encoder),
            input_names=list(encoder.input_names),
            output_names=[ENCODER_OUTPUT],
            dynamic_shapes=dynamic,
            opset_version=18,
            dynamo=True,
            verbose=False,
        )
    program.save(str(path))


class NamedInputs(nn.Module):
    """The encoder with forward's arguments named as its config's inputs. Triton's native libtorch
    backend binds inputs by those names (else by `<name>__<index>`); a traced `*extra` gets made-up ones
    (`input`, `argument_4`), which it would refuse. Traced with keyword inputs, so only the encoder's own
    inputs become arguments, in this order (the config's)."""

    def __init__(self, encoder: PoolingEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                activate: torch.Tensor | None = None) -> torch.Tensor:
        return self.encoder(input_ids, attention_mask, *(t for t in (token_type_ids, activate) if t is not None))


def export_torchscript(encoder: PoolingEncoder, path: Path, device: str = "cpu") -> None:
    """torch.jit.trace on the serving device (a trace bakes in the device of the tensors it creates);
    the mask is built from tensor ops in forward, so the trace is shape-generic."""
    names = list(inspect.signature(NamedInputs.forward).parameters)[1:]
    if [n for n in names if n in encoder.input_names] != list(encoder.input_names):
        raise ResolutionError(f"TorchScript export names its inputs {names}, not {list(encoder.input_names)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    inputs = dict(zip(encoder.input_names, sample_inputs(encoder, device=device)))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(NamedInputs(encoder), example_kwarg_inputs=inputs, check_trace=False, strict=False)
    traced.save(str(path))
