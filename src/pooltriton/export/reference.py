"""What the user's own library answers, loaded independently of the export wrapper (export.encoder).

The export is verified against this, not against the module it was traced from: a wrapper that lost an
architecture detail (a sliding window, a classifier head, a position offset) would agree with itself.
- sentence-transformers models (their pooling from modules.json): the SentenceTransformer pipeline
  itself, every module up to its Normalize (the pooler stage normalises);
- otherwise transformers' own model class for the task, with its own attention masks and its default
  attention implementation, and vLLM's pooling semantics on its hidden states (CLS: the first token,
  MEAN: all tokens, LAST: the last one; token tasks: every token).
Each text runs alone, unpadded, so batching and padding in the export are checked too.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from pooltriton.contract import ACTIVATE
from pooltriton.core.resolve import SENTENCE_TRANSFORMERS, PoolerConfig
from pooltriton.core.semantics import PoolingType, Task

# What the reference computes with its module on one text's token tensors ([1, L] each) -> [W] or [L, W].
Compute = Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]


class Reference:
    """The reference in fp32 and fp64 (the same weights; fp32 against fp64 is fp32's own noise)."""

    def __init__(self, build: Callable[[], tuple[nn.Module, Compute]], description: str) -> None:
        self.description = description
        module, self._compute = build()
        self._modules = {torch.float32: module.float().eval()}

    def _module(self, dtype: torch.dtype) -> nn.Module:
        if dtype not in self._modules:
            self._modules[dtype] = copy.deepcopy(self._modules[torch.float32]).to(dtype).eval()
        return self._modules[dtype]

    def run(self, feeds: dict[str, np.ndarray], dtype: torch.dtype) -> list[np.ndarray]:
        """One answer per row of a padded batch, each computed on that row's real tokens alone."""
        mask = feeds["attention_mask"].astype(bool)
        module = self._module(dtype)
        answers = []
        for row in range(mask.shape[0]):
            # Token tensors only: the reference answers raw vectors (ACTIVATE is the export's own input).
            inputs = {name: torch.from_numpy(values[row][mask[row]][None]) for name, values in feeds.items()
                      if name != ACTIVATE}
            with torch.no_grad():
                answers.append(self._compute(module, inputs).to(torch.float64).numpy())
        return answers


def load_reference(model_dir: str | Path, config: PoolerConfig, allow_pickle: bool = False,
                   trust_remote_code: bool = False) -> Reference:
    model_dir = Path(model_dir)
    if (config.task is Task.EMBED and config.sources.get("pooling_type") == SENTENCE_TRANSFORMERS
            and (model_dir / "modules.json").is_file()):
        library = "SparseEncoder" if config.pooling_type.sparse else "SentenceTransformer"
        return Reference(lambda: _sentence_transformers(model_dir, trust_remote_code, library),
                         f"sentence-transformers ({library}: its own pipeline"
                         f"{'' if config.pooling_type.sparse else ', up to Normalize'})")
    load = {"use_safetensors": None if allow_pickle else True, "trust_remote_code": trust_remote_code}
    if config.token_head is not None:
        return Reference(lambda: _token_head(model_dir, config, load), "transformers (AutoModel) with the "
                         f"checkpoint's {config.token_head} on every token (BGE-M3's, as FlagEmbedding applies it)")
    semantics = (f"the LM head's {'yes - no' if len(config.classifier_token_ids) == 2 else 'yes'} logit at the "
                 "last token" if config.classifier_token_ids is not None
                 else f"vLLM's {config.pooling_type.value} pooling")
    return Reference(lambda: _transformers(model_dir, config, load), f"transformers ({_class_name(config)}) with "
                     f"{semantics}")


def _sentence_transformers(model_dir: Path, trust_remote_code: bool, library: str) -> tuple[nn.Module, Compute]:
    import sentence_transformers
    from sentence_transformers.sentence_transformer.modules import Normalize, StaticEmbedding

    full = getattr(sentence_transformers, library)(str(model_dir), device="cpu", trust_remote_code=trust_remote_code)
    pipeline = nn.Sequential(*(m for m in full._modules.values() if not isinstance(m, Normalize)))

    def compute(module: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        if isinstance(module[0], StaticEmbedding):  # its features: one text's ids in a row, where each starts
            inputs = {"input_ids": inputs["input_ids"][0], "offsets": torch.zeros(1, dtype=torch.int64)}
        return module(dict(inputs))["sentence_embedding"][0]

    return pipeline, compute


def _token_head(model_dir: Path, config: PoolerConfig, load: dict) -> tuple[nn.Module, Compute]:
    """BGE-M3's heads as FlagEmbedding builds them: a torch.nn.Linear from the file's state dict, on every
    token's last hidden state (which tokens are answered, and the activation, are the pooler stage's)."""
    import transformers

    state = torch.load(model_dir / str(config.token_head), map_location="cpu", weights_only=True)
    pair = nn.ModuleDict({"model": transformers.AutoModel.from_pretrained(model_dir, **load),
                          "head": nn.Linear(state["weight"].shape[1], state["weight"].shape[0])})
    pair["head"].load_state_dict(state)

    def compute(module: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return module["head"](module["model"](**inputs).last_hidden_state[0])

    return pair, compute


def _class_name(config: PoolerConfig) -> str:
    if config.pooling_type.sparse:
        return "AutoModelForMaskedLM"
    if config.classifier_token_ids is not None:
        return "AutoModelForCausalLM"
    if config.task is Task.CLASSIFY:
        return "AutoModelForSequenceClassification"
    if config.task is Task.TOKEN_CLASSIFY and config.returned_token_ids:
        return "AutoModelForCausalLM"
    if config.task is Task.TOKEN_CLASSIFY:
        return "AutoModelForTokenClassification"
    return "AutoModelForTextEncoding" if config.text_encoder else "AutoModel"


def _transformers(model_dir: Path, config: PoolerConfig, load: dict) -> tuple[nn.Module, Compute]:
    import transformers

    name = _class_name(config)
    model = getattr(transformers, name).from_pretrained(model_dir, **load)
    if name in ("AutoModel", "AutoModelForTextEncoding"):
        model = getattr(model, "base_model", model)
        return model, _pooled_hidden(config.pooling_type)
    if config.classifier_token_ids is not None:  # a reranker: the full LM head at the last token
        ids = config.classifier_token_ids

        def relevance(module: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
            last = module(**inputs).logits[0, -1]
            return last[[ids[-1]]] - last[[ids[0]]] if len(ids) == 2 else last[[ids[0]]]

        return model, relevance
    if name == "AutoModelForMaskedLM":  # SPLADE, as its paper writes it: log(1 + relu(logits)), max or sum
        def splade(module: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
            weights = torch.log1p(torch.relu(module(**inputs).logits[0]))
            return weights.sum(0) if config.pooling_type is PoolingType.SPLADE_SUM else weights.max(0).values

        return model, splade
    if name == "AutoModelForCausalLM":  # process reward: the LM head's logits of a few ids, every token
        columns = list(config.returned_token_ids or ())
        return model, lambda module, inputs: module(**inputs).logits[0][:, columns]
    return model, lambda module, inputs: module(**inputs).logits[0]


def _pooled_hidden(pooling_type: PoolingType) -> Compute:
    def compute(module: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = module(**inputs).last_hidden_state[0]
        if pooling_type is PoolingType.CLS:
            return hidden[0]
        if pooling_type is PoolingType.LAST:
            return hidden[-1]
        if pooling_type is PoolingType.MEAN:
            return hidden.mean(0)
        if pooling_type is PoolingType.MAX:
            return hidden.max(0).values
        if pooling_type is PoolingType.MEAN_SQRT_LEN:
            return hidden.sum(0) / hidden.shape[0] ** 0.5
        if pooling_type is PoolingType.WEIGHTED_MEAN:
            weights = torch.arange(1, hidden.shape[0] + 1, dtype=hidden.dtype)[:, None]
            return (hidden * weights).sum(0) / weights.sum()
        return hidden  # ALL / STEP: every token (STEP's selection is the pooler stage's)

    return compute
