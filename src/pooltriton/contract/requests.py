"""The one request path between Python values and Triton's tensors, without I/O.

Inputs -> BYTES tensors, big inputs -> requests of at most MAX_BATCH_SIZE texts, results -> one answer
in order (token tasks split back per text), and a Triton error -> an HTTP status and whether to retry,
classified by its status code, never by its message. The blocking client, the asyncio client, the
gateway and the benchmark all build their requests here and differ only in how they send them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pooltriton.contract import (
    ATTENTION_MASK,
    DOCUMENTS,
    INPUT_IDS,
    MAX_BATCH_SIZE,
    PROMPT_TOKENS,
    QUERY,
    TEXT,
    TEXT_PAIR,
    TOKEN_COUNTS,
    triton_priority,
)
from pooltriton.contract.admission import is_short, retry_after_in
from pooltriton.contract.config import read_parameters
from pooltriton.contract.parameters import EnsembleParameters
from pooltriton.core.activation import normalize
from pooltriton.core.scoring import split_tokens

# Attempts on UNAVAILABLE (server starting or restarting, queue full), with exponential backoff capped
# at MAX_BACKOFF_S: ~16 s in all, enough to carry a request across a restart of a small repository.
RETRIES = 8
BACKOFF_S, MAX_BACKOFF_S = 0.25, 4.0

# KServe over gRPC reports a status code name, over HTTP the HTTP status itself.
RESTRICTED = "This protocol is restricted"  # Triton's answer to a restricted API without its header
_GRPC_TO_HTTP = {"INVALID_ARGUMENT": 400, "UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403, "NOT_FOUND": 404,
                 "ALREADY_EXISTS": 409, "RESOURCE_EXHAUSTED": 429, "CANCELLED": 499, "UNKNOWN": 500,
                 "INTERNAL": 500, "UNIMPLEMENTED": 501, "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504}


@dataclass(frozen=True)
class TritonRequest:
    """One inference request: the model, its BYTES inputs and the outputs to read."""

    model: str
    inputs: dict[str, list[str]]
    outputs: tuple[str, ...]
    parameters: dict[str, Any]
    batched: bool  # inputs are [n, 1] (batched models) rather than [n]
    priority: int = 0

    def arrays(self) -> dict[str, np.ndarray]:
        """The inputs as numpy BYTES arrays in the shape the model declares."""
        return {name: text_array(texts, self.batched) for name, texts in self.inputs.items()}

    @property
    def rows(self) -> int:
        """Texts in this request (every input has one entry per text)."""
        return len(next(iter(self.inputs.values()), ()))

    def merge_key(self) -> tuple:
        """Requests with equal keys may travel as one (`merge`): same model, inputs, outputs, options
        and priority; they differ only in their texts."""
        return (self.model, tuple(sorted(self.inputs)), self.outputs, tuple(sorted(self.parameters.items())),
                self.batched, self.priority)


def merge(requests: Sequence[TritonRequest]) -> TritonRequest:
    """Requests of one `merge_key` as one request: their texts concatenated in order."""
    first = requests[0]
    if any(r.merge_key() != first.merge_key() for r in requests):
        raise ValueError("only requests with the same merge_key travel as one")
    return replace(first, inputs={name: [t for r in requests for t in r.inputs[name]] for name in first.inputs})


def split(outputs: Sequence[str], result: dict[str, np.ndarray], rows: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """A merged request's answer as the answers of the requests it merged (`rows` texts each): every
    output has one row per text, except a token task's first output, whose rows per text TOKEN_COUNTS says."""
    bounds = np.cumsum(rows)[:-1]
    cuts = dict.fromkeys(result, bounds)
    if TOKEN_COUNTS in result:
        per_request = [int(c.sum()) for c in np.split(result[TOKEN_COUNTS].reshape(-1), bounds)]
        cuts[outputs[0]] = np.cumsum(per_request)[:-1]
    parts: list[dict[str, np.ndarray]] = [{} for _ in rows]
    for name, array in result.items():
        expected = sum(rows) if cuts[name] is bounds else int(result[TOKEN_COUNTS].sum())
        if len(array) != expected:
            raise ValueError(f"{name} has {len(array)} rows where the merged request needs {expected}")
        for part, piece in zip(parts, np.split(array, cuts[name])):
            part[name] = piece
    return parts


@dataclass(frozen=True)
class ModelInfo:
    """What a served ensemble's config says: its task, outputs, label names and limits."""

    name: str
    task: str
    outputs: tuple[str, ...]
    labels: tuple[str, ...]
    max_length: int | None = None
    dimensions: tuple[int, ...] = ()  # Matryoshka sizes the model declares; empty: none
    use_activation: bool | None = None  # what a request that does not say gets (None: not in the config)
    prompts: tuple[str, ...] = ()  # the names of the model's prompts
    width: int | None = None  # the first output's last dimension (an embedding's size), where fixed
    sparse: bool = False  # SPLADE's vocabulary-wide weights (False where an older export does not say)
    pooling: str | None = None  # the pooling type, the encoder's precision (None: an older export)
    precision: str | None = None
    token_weights: bool = False  # one weight per token, answered [tokens] (False where an export does not say)
    served_names: tuple[str, ...] = ()  # other names it answers to (--served-model-name)
    chat_template: str | None = None  # its tokenizer's (vLLM's chat-form bodies), and the special tokens it reads
    chat_tokens: dict[str, str] | None = field(default=None, compare=False, hash=False)  # (infos stay hashable)
    modality: str = "text"  # "image": an image tower's ensemble (IMAGE in)
    image_model: str | None = None  # a text model's image ensemble, an image model's text one
    text_model: str | None = None

    @property
    def per_token(self) -> bool:
        return TOKEN_COUNTS in self.outputs


def model_info(name: str, config: dict) -> ModelInfo:
    """A served ensemble's config (its EnsembleParameters); a model that is not one has no task."""
    outputs = tuple(o["name"] for o in config["output"])
    dims = [int(d) for d in config["output"][0].get("dims", [])] if config["output"] else []
    width = dims[-1] if dims and dims[-1] > 0 else None
    parameters = read_parameters(config)
    if "task" not in parameters:
        return ModelInfo(name=name, task="", outputs=outputs, labels=(), width=width)
    ensemble = EnsembleParameters.from_parameters(parameters)
    return ModelInfo(name=name, task=ensemble.task, outputs=outputs, labels=ensemble.labels or (),
                     max_length=ensemble.max_length, dimensions=ensemble.matryoshka_dimensions or (),
                     use_activation=ensemble.use_activation, prompts=ensemble.prompts or (), width=width,
                     sparse=bool(ensemble.sparse), pooling=ensemble.pooling, precision=ensemble.precision,
                     token_weights=bool(ensemble.token_weights), served_names=ensemble.served_names or (),
                     chat_template=ensemble.chat_template, chat_tokens=ensemble.chat_tokens,
                     modality=ensemble.modality or "text", image_model=ensemble.image_model,
                     text_model=ensemble.text_model)


def text_array(texts: Sequence[str | bytes], batched: bool) -> np.ndarray:
    data = np.array([t.encode("utf-8") if isinstance(t, str) else t for t in texts], dtype=object)
    return data.reshape(-1, 1) if batched else data


def as_texts(value: str | Sequence[str], what: str = "texts") -> list[str]:
    batch = [value] if isinstance(value, str) else list(value)
    if not batch:
        raise ValueError(f"{what} is empty: pass at least one text")
    return batch


def parameters(options: dict[str, Any]) -> dict[str, Any]:
    """KServe request parameters are scalars: lists and dicts travel as JSON; None means unset."""
    return {k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in options.items() if v is not None}


def encode_requests(model: str, outputs: Sequence[str], texts: Sequence[str], pairs: Sequence[str] | None,
                    options: dict[str, Any], priority: int = 0,
                    max_batch: int = MAX_BATCH_SIZE) -> list[TritonRequest]:
    """Texts (and their pairs) in requests of at most `max_batch`, to be sent in any order; `priority` is
    vLLM's, and a short request at the default one runs ahead of long ones (triton_priority)."""
    if not texts:
        raise ValueError("texts is empty: pass at least one text")
    if pairs is not None and len(pairs) != len(texts):
        raise ValueError(f"{len(pairs)} pairs for {len(texts)} texts: they pair up one to one")
    requests = []
    for start in range(0, len(texts), max_batch):
        inputs = {TEXT: list(texts[start : start + max_batch])}
        if pairs is not None:
            inputs[TEXT_PAIR] = list(pairs[start : start + max_batch])
        characters = sum(len(text) for text in (*inputs[TEXT], *inputs.get(TEXT_PAIR, ())))
        short = is_short(characters, len(inputs[TEXT]) * (1 if pairs is None else 2))
        requests.append(TritonRequest(model, inputs, tuple(outputs), parameters(options), True,
                                      triton_priority(priority, short)))
    return requests


def check_dimensions(model: ModelInfo, dimensions: int | None, width: int | None = None) -> None:
    """ValueError unless `dimensions` is None, the full width or one of the model's Matryoshka sizes. Checked
    before a request is sent where the width is known (the ensemble's output dims), else on the answer."""
    width = width or model.width
    if dimensions is None or dimensions == width or dimensions in model.dimensions or width is None:
        return
    declared = f"only {list(model.dimensions)}" if model.dimensions else "no Matryoshka dimensions"
    raise ValueError(f"model {model.name!r} does not support {dimensions} dimensions: it has {width} and declares "
                     f"{declared}")


def matryoshka(model: ModelInfo, vectors: np.ndarray, dimensions: int | None,
               use_activation: bool | None = None) -> np.ndarray:
    """Embeddings cut to one of the model's Matryoshka `dimensions` (None or the full width: as they are),
    re-normalised where they were normalised (vLLM: the request's use_activation, else the model's);
    ValueError for a size the model does not declare."""
    check_dimensions(model, dimensions, vectors.shape[1])
    if dimensions is None or dimensions == vectors.shape[1]:
        return vectors
    cut = vectors[:, :dimensions]
    activated = model.use_activation if use_activation is None else use_activation
    if activated is None:  # a repository exported before its config said: were they unit vectors?
        activated = bool(np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3))
    if not activated:
        return cut
    return normalize(cut)


def reassemble(outputs: Sequence[str], results: Sequence[dict[str, np.ndarray]],
               token_weights: bool = False) -> np.ndarray | list[np.ndarray]:
    """The answers of encode_requests' requests, in their order: [n, C], or per text [tokens_i, C]
    ([tokens_i] for `token_weights`, ModelInfo's)."""
    if TOKEN_COUNTS in outputs:
        return [rows[:, 0] if token_weights else rows
                for r in results for rows in split_tokens(r[outputs[0]], r[TOKEN_COUNTS])]
    return np.concatenate([r[outputs[0]] for r in results], axis=0)


def prompt_tokens(results: Sequence[dict[str, np.ndarray]]) -> int:
    """The tokens the model read for these results (usage), as the served models count them."""
    return sum(int(r[PROMPT_TOKENS].sum()) for r in results if PROMPT_TOKENS in r)


def token_lists(result: dict[str, np.ndarray]) -> list[list[int]]:
    """A tokenizer stage's answer as one list of real token ids per text."""
    return [row[mask.astype(bool)].tolist() for row, mask in zip(result[INPUT_IDS], result[ATTENTION_MASK])]


@dataclass(frozen=True)
class TokenPieces:
    """One text as the tokenizer stage split it (mode pieces): the text it read (the prompt included), and
    per token its id, its string in the vocabulary, whether it is special, and its span in that text in
    characters ([start, stop); a special token has none)."""

    text: str
    ids: list[int]
    tokens: list[str]
    special: list[bool]
    spans: list[tuple[int, int] | None]

    def to_json(self) -> str:
        return json.dumps({"text": self.text, "ids": self.ids, "tokens": self.tokens, "special": self.special,
                           "spans": self.spans})

    @classmethod
    def from_json(cls, raw: str | bytes) -> TokenPieces:
        value = json.loads(raw)
        return cls(value["text"], value["ids"], value["tokens"], value["special"],
                   [tuple(span) if span is not None else None for span in value["spans"]])


def score_inputs(query: str | Sequence[str], documents: str | Sequence[str]) -> dict[str, list[str]]:
    return {QUERY: as_texts(query, "query"), DOCUMENTS: as_texts(documents, "documents")}


@dataclass(frozen=True)
class Failure:
    """A Triton error, classified: the HTTP status it means and whether a retry may succeed."""

    status: int
    message: str

    @property
    def retryable(self) -> bool:
        return self.status == 503

    @property
    def retry_after_s(self) -> int | None:
        """When to retry, where the server said (the tokenizer stage's admission by work)."""
        return retry_after_in(self.message)


def classify(error: Exception) -> Failure:
    """By status code: gRPC's name (`StatusCode.UNAVAILABLE`) or the HTTP status (`503`). A refused or
    broken connection (the HTTP client raises it as such) is UNAVAILABLE too: the server is not there."""
    if isinstance(error, ConnectionError):
        return Failure(503, str(error) or type(error).__name__)
    raw = getattr(error, "status", None)
    code = str(raw() if callable(raw) else raw or "").removeprefix("StatusCode.")
    status = int(code) if code.isdigit() else _GRPC_TO_HTTP.get(code, 500)
    message = getattr(error, "message", None)
    text = message() if callable(message) else None
    if RESTRICTED in (text or ""):  # gRPC says UNAVAILABLE for a restricted API, which no retry opens
        status = 403
    return Failure(status, text or str(error))


def retry_delay(attempt: int, error: Exception, retries: int = RETRIES) -> float | None:
    """Seconds to wait before retrying a failed attempt (0-based), or None: give up and raise.
    Only UNAVAILABLE (server starting or restarting, queue full) is retried, with exponential backoff,
    `retries` attempts in all. A refusal by admission by work says when to retry: not sooner (it would be
    refused again), and not at all when that is past MAX_BACKOFF_S (the caller gets the refusal at once)."""
    failure = classify(error)
    if attempt >= retries - 1 or not failure.retryable:
        return None
    backoff = min(BACKOFF_S * 2**attempt, MAX_BACKOFF_S)
    hint = failure.retry_after_s
    if hint is None:
        return backoff
    return max(backoff, hint) if hint <= MAX_BACKOFF_S else None
