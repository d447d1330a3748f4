"""A fake Triton client for the gateway's route tests: tritonclient's metadata calls as a served repository
answers them, and inferences that answer like the served models."""

from __future__ import annotations

import json
import re

import numpy as np
from tritonclient.utils import InferenceServerException

from pooltriton.contract import (
    ATTENTION_MASK,
    DETOKENIZED,
    DOCUMENTS,
    INPUT_IDS,
    PROMPT_TOKENS,
    QUERY,
    SCORES,
    TEXT,
    TOKEN_PIECES,
)
from pooltriton.contract.requests import TokenPieces, TritonRequest, text_array

WIDTH = 4


def served_config(name: str, task: str, outputs: list[str], **parameters) -> dict:
    values = {"task": task, "max_length": "16", **{k: json.dumps(v) for k, v in parameters.items()}}
    # Triton's JSON config writes dims as strings; the first output is WIDTH wide.
    return {"name": name, "platform": "ensemble", "output": [{"name": o, "dims": [str(WIDTH)]} for o in outputs],
            "parameters": {k: {"string_value": v} for k, v in values.items()}}


class FakeServer:
    """tritonclient's metadata calls, as a served repository would answer them."""

    def __init__(self) -> None:
        self.configs = {
            "emb": served_config("emb", "embed", ["EMBEDDING", PROMPT_TOKENS], matryoshka_dimensions=[2],
                           use_activation=True, prompts=["query", "document"]),
            "cls": served_config("cls", "classify", ["PROBABILITIES", PROMPT_TOKENS], labels=["no", "yes"]),
            "emb_score": {"name": "emb_score", "backend": "scorer", "output": [{"name": SCORES}]},
            "emb_tokenizer": {"name": "emb_tokenizer", "backend": "tokenizer", "output": []},
        }

    async def get_model_repository_index(self, headers: dict | None = None, as_json: bool = True) -> dict:
        return {"models": [{"name": name, "state": "READY"} for name in self.configs]}

    async def get_model_config(self, name: str, as_json: bool = True) -> dict:
        if name not in self.configs:  # as Triton answers over gRPC
            raise InferenceServerException(f"Request for unknown model: '{name}' is not found",
                                           status="StatusCode.NOT_FOUND")
        return {"config": self.configs[name]}

    ready = True

    async def is_server_ready(self) -> bool:
        return self.ready


def word_tokens(text: str) -> int:
    return len(text.split()) + 2  # like [CLS] ... [SEP]


def word_pieces(text: str, parameters: dict) -> TokenPieces:
    """A word per token, spans in characters; [CLS] and [SEP] around them unless asked not to."""
    prompted = parameters.get("prompt_name") == "query" and parameters.get("with_prompt", True)
    text = ("query: " if prompted else "") + text
    words = [(match.start(), match.end()) for match in re.finditer(r"\S+", text)]
    special = bool(parameters["add_special_tokens"])
    spans = [None] * special + words + [None] * special
    tokens = ["[CLS]"] * special + [text[a:b] for a, b in words] + ["[SEP]"] * special
    return TokenPieces(text, list(range(len(tokens))), tokens, [span is None for span in spans], spans)


class FakeClient:
    """Answers like the served models (an embedding is a function of its text), records every request."""

    def __init__(self) -> None:
        self.server = FakeServer()
        self.requests: list[TritonRequest] = []

    async def infer(self, request: TritonRequest) -> dict[str, np.ndarray]:
        self.requests.append(request)
        texts = request.inputs.get(TEXT, [])
        if any(t == "bad" for t in texts):
            raise InferenceServerException("text 0 is bad", status="StatusCode.INVALID_ARGUMENT")
        if any(t == "busy" for t in texts):
            raise InferenceServerException("queue full", status="StatusCode.UNAVAILABLE")
        if request.model in ("emb", "cls", "raw", "spl", "rr"):
            width = 2 if request.model == "cls" else WIDTH
            values = np.array([[len(t) + i for i in range(width)] for t in texts], dtype=np.float32)
            if request.model == "spl":  # SPLADE: most of the vocabulary at zero
                values[:, ::2] = 0
            return {request.outputs[0]: values, PROMPT_TOKENS: np.array([[word_tokens(t)] for t in texts])}
        if request.model in ("emb_score", "rr_score"):
            query, documents = request.inputs[QUERY], request.inputs[DOCUMENTS]
            scores = np.array([1.0 / (1 + len(d)) for d in documents], dtype=np.float32)
            return {SCORES: scores, PROMPT_TOKENS: np.array([sum(map(word_tokens, query + documents))])}
        if request.model == "emb_tokenizer" and request.parameters.get("mode") == "pieces":
            return {TOKEN_PIECES: text_array([word_pieces(text, request.parameters).to_json() for text in texts],
                                             batched=True)}
        if request.model == "emb_tokenizer" and request.parameters.get("mode") == "detokenize":
            rows = [json.loads(text) for text in texts]
            return {DETOKENIZED: text_array([" ".join(f"t{i}" for i in ids) for ids in rows], batched=True)}
        if request.model == "emb_tokenizer":
            ids = np.array([[101, 7, 8, 102, 0]]) if request.parameters.get("add_special_tokens") else \
                np.array([[7, 8, 0, 0, 0]])
            return {INPUT_IDS: ids, ATTENTION_MASK: (ids != 0).astype(np.int64)}
        raise InferenceServerException(f"unknown model {request.model}", status="StatusCode.NOT_FOUND")
