"""text-embeddings-inference's bodies and answers (`model` added to each: this gateway serves several)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, RootModel

from pooltriton.gateway.errors import APIError
from pooltriton.gateway.protocol import Priority, Usage

# text-embeddings-inference's side to cut an over-long text from (its --auto-truncate default: the end).
TruncationDirection = Literal["Right", "right", "Left", "left"]

# text-embeddings-inference's error shape, for the OpenAPI document.
ERROR_SCHEMA = {"type": "object", "required": ["error", "error_type"], "properties": {
    "error": {"type": "string"},
    "error_type": {"enum": ["Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"]}}}


class TEIOptions(BaseModel):
    """What text-embeddings-inference's bodies share (`model` added: this gateway serves several)."""

    model: str | None = None
    # TEI truncates where a request does not say (its --auto-truncate default), at the end (Right) or start.
    truncate: bool | None = None
    truncation_direction: TruncationDirection = "Right"
    priority: Priority = 0

    def parameters(self) -> dict[str, Any]:
        if self.truncate is False:
            return {}
        return {"truncate": "END" if self.truncation_direction.lower() == "right" else "START"}


class TEIEmbedSparseRequest(TEIOptions):
    """text-embeddings-inference's /embed_sparse body."""

    # A batch may mix texts and rows of token ids, as TEI's Input reads it.
    inputs: str | list[int] | list[str | list[int]]
    prompt_name: str | None = Field(None, max_length=200)

    def parameters(self) -> dict[str, Any]:
        parameters: dict[str, Any] = {"use_activation": False, **super().parameters()}  # SPLADE's weights, raw
        if self.prompt_name is not None:
            parameters["prompt_name"] = self.prompt_name
        return parameters


class TEIEmbedRequest(TEIEmbedSparseRequest):
    """text-embeddings-inference's /embed body: `normalize` (default true) L2-normalises after the cut to
    `dimensions`, whatever the model's own Normalize says; false gives the pooled vector raw."""

    normalize: bool = True
    dimensions: int | None = Field(None, gt=0)

    def parameters(self) -> dict[str, Any]:
        return {**super().parameters(), "use_activation": self.normalize}


class TEIOpenAIRequest(BaseModel):
    """text-embeddings-inference's OpenAI body (its /embeddings): no options beyond OpenAI's; `priority` ours."""

    input: str | list[int] | list[str | list[int]]  # TEI's Input, as /embed's `inputs`
    model: str | None = None
    user: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, gt=0)
    priority: Priority = 0


class TEISimilarityInput(BaseModel):
    source_sentence: str
    sentences: list[str]


class TEISimilarityParameters(BaseModel):
    truncate: bool | None = None
    truncation_direction: TruncationDirection = "Right"
    prompt_name: str | None = Field(None, max_length=200)


class TEISimilarityRequest(BaseModel):
    """text-embeddings-inference's /similarity body (Hugging Face's sentence-similarity task): the cosine of
    `source_sentence`'s embedding to each of `sentences`'."""

    model: str | None = None
    inputs: TEISimilarityInput
    parameters: TEISimilarityParameters | None = None
    priority: Priority = 0

    def options(self) -> dict[str, Any]:
        given = self.parameters or TEISimilarityParameters()
        options = TEIOptions(truncate=given.truncate, truncation_direction=given.truncation_direction).parameters()
        return {**options, **({"prompt_name": given.prompt_name} if given.prompt_name is not None else {})}


class TEIDecodeRequest(BaseModel):
    """text-embeddings-inference's /decode body: one row of token ids or a batch of rows."""

    model: str | None = None
    ids: list[int] | list[list[int]]
    skip_special_tokens: bool = True  # TEI's default (vLLM's /detokenize keeps them)

    def rows(self) -> list[list[int]]:
        return [self.ids] if not self.ids or isinstance(self.ids[0], int) else self.ids  # type: ignore[list-item]


class TEIPredictRequest(TEIOptions):
    """text-embeddings-inference's /predict body: one text, one pair `[a, b]`, or a batch of either
    (`[[a], [a, b], ...]`, or a list of other than two texts); `raw_scores` skips TEI's activation (the
    route asks for logits and applies it: serving.activation)."""

    inputs: str | list[str] | list[list[str]]
    raw_scores: bool = False

    def parameters(self) -> dict[str, Any]:
        return {**super().parameters(), "use_activation": False}

    def sequences(self) -> tuple[list[tuple[str, str | None]], bool]:
        """(text, its pair's second text or None) per input, and whether the body was a batch. As TEI reads
        them, a list of texts is one input: one text, or a pair of two."""
        value = self.inputs
        if isinstance(value, str):
            return [(value, None)], False
        if not value:  # TEI's reader refuses an empty list before anything (422), where an empty text is 400 Empty
            raise APIError(400, "inputs: invalid length 0, expected a text, a pair of texts or a batch of them",
                           "inputs")
        if all(isinstance(text, str) for text in value):
            if len(value) > 2:
                raise APIError(400, "inputs: a list of texts is one input, of one text or a pair of two; send "
                               "a batch as [[a], [a, b], ...]", "inputs")
            return [(value[0], value[1] if len(value) == 2 else None)], False
        if any(len(sequence) not in (1, 2) for sequence in value):
            raise APIError(400, "inputs: each input is one text or a pair of two", "inputs")
        return [(sequence[0], sequence[1] if len(sequence) == 2 else None) for sequence in value], True


class TEIRerankRequest(TEIOptions):
    """text-embeddings-inference's /rerank body: `texts` ranked against `query`; `raw_scores` skips TEI's
    activation of a cross-encoder's logit. vLLM's per-side cuts are taken too."""

    query: str
    texts: list[str]
    raw_scores: bool = False
    return_text: bool = False
    top_n: int | None = Field(None, ge=0)
    max_tokens_per_query: int = Field(0, ge=0, le=1_000_000)
    max_tokens_per_doc: int = Field(0, ge=0, le=1_000_000)

    def parameters(self) -> dict[str, Any]:
        cuts = {name: getattr(self, name) for name in ("max_tokens_per_query", "max_tokens_per_doc")
                if getattr(self, name)}
        return {**super().parameters(), "use_activation": not self.raw_scores, **cuts}


class TEITokenizeRequest(BaseModel):
    """text-embeddings-inference's /tokenize body: a text or a list of them, untruncated."""

    model: str | None = None
    inputs: str | list[str]
    add_special_tokens: bool = True
    prompt_name: str | None = Field(None, max_length=200)


# ---- answers (documented in the OpenAPI schema; the routes write them as JSON directly) -------------------
class SparseValue(BaseModel):
    index: int
    value: float


class Prediction(BaseModel):
    score: float
    label: str


class Rank(BaseModel):
    index: int
    score: float
    text: str | None = None  # with return_text


class SimpleToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class Embeddings(RootModel[list[list[float]]]):
    pass


class SparseEmbeddings(RootModel[list[list[SparseValue]]]):
    pass


class TokenEmbeddings(RootModel[list[list[list[float]]]]):
    pass


class Predictions(RootModel[list[Prediction] | list[list[Prediction]]]):
    pass


class Ranks(RootModel[list[Rank]]):
    pass


class Similarities(RootModel[list[float]]):
    pass


class Decoded(RootModel[list[str]]):
    pass


class Tokens(RootModel[list[list[SimpleToken]]]):
    pass


class Info(BaseModel):
    model_id: str
    model_sha: str | None
    model_dtype: str | None
    served_model_name: str
    model_type: dict[str, Any]
    task: str
    max_input_length: int | None
    max_batch_requests: int | None
    max_client_batch_size: int
    auto_truncate: bool
    max_concurrent_requests: int | None = None
    max_batch_tokens: int | None = None
    tokenization_workers: int | None = None
    version: str
    sha: str | None
    docker_label: str | None


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class OpenAIResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: Usage
