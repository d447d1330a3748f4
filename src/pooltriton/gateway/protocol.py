"""The gateway's request bodies (vLLM's, OpenAI's and Cohere's names) and its error shape (OpenAI's)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, model_validator


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.retry_after = status, message, param, retry_after
        self.kind = kind or {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                             413: "invalid_request_error",
                             429: "rate_limit_error", 503: "service_unavailable"}.get(status, "server_error")


def error_body(status: int, message: str, kind: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


# error_body's shape, for the OpenAPI document.
ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "code": {"type": "integer"}}}}}


# text-embeddings-inference's error shape (its routes here), for the OpenAPI document.
TEI_ERROR_SCHEMA = {"type": "object", "required": ["error", "error_type"], "properties": {
    "error": {"type": "string"},
    "error_type": {"enum": ["Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"]}}}


# text-embeddings-inference's side to cut an over-long text from (its --auto-truncate default: the end).
TruncationDirection = Literal["Right", "right", "Left", "left"]


class Options(BaseModel):
    """Options every route shares (vLLM's names)."""

    model: str | None = None
    truncate_prompt_tokens: int | None = Field(None, ge=-1, le=1_000_000)
    truncation_side: Literal["left", "right"] | None = None
    use_activation: bool | None = None
    # vLLM's; false is refused for text (the stages add them), the default of the chat form (ChatForm)
    add_special_tokens: bool | None = None
    priority: int = Field(0, ge=-1000, le=1000)
    user: str | None = None
    # Older vLLM's names for use_activation that a route's bodies declare (embeddings: normalize; classifiers:
    # softmax, activation): honoured where use_activation is not given (raw vectors asked for must not
    # come back normalised).
    ACTIVATION_ALIASES: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="after")
    def _legacy(self) -> Options:
        if self.add_special_tokens is False and getattr(self, "messages", None) is None:
            raise ValueError("add_special_tokens false is not supported for pooling: the model reads its "
                             "special tokens")
        if self.use_activation is None:
            self.use_activation = next((getattr(self, name) for name in self.ACTIVATION_ALIASES
                                        if getattr(self, name) is not None), None)
        return self

    def parameters(self) -> dict[str, Any]:
        """vLLM: truncate_prompt_tokens k keeps the first k tokens (the last with truncation_side left: vLLM
        loads a pooling model's tokenizer with truncation_side right); -1 means the model's own limit."""
        parameters: dict[str, Any] = {}
        if self.truncate_prompt_tokens is not None:
            parameters["truncate"] = "START" if self.truncation_side == "left" else "END"
            if self.truncate_prompt_tokens > 0:
                parameters["max_tokens"] = self.truncate_prompt_tokens
        if self.use_activation is not None:
            parameters["use_activation"] = self.use_activation
        return parameters


UNTRUSTED_TEMPLATE = ("Chat template is passed with request, but this server does not take chat templates from "
                      "requests (vLLM's --trust-request-chat-template): the model's own is used. Refused request "
                      "with untrusted chat template.")


class ChatForm(BaseModel):
    """vLLM's chat form of a body: `messages` in place of `input`, rendered by the model's own chat template and
    tokenized without special tokens unless `add_special_tokens` (PoolingService.chat)."""

    messages: list[dict[str, Any]] | None = Field(None, max_length=10_000)
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template: str | None = None  # refused: a template is code the server would run
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None  # accepted and unused: these models read text only

    @model_validator(mode="after")
    def _one_form(self) -> ChatForm:
        if self.chat_template is not None:
            raise ValueError(UNTRUSTED_TEMPLATE)
        if (getattr(self, self.TEXT_FIELD, None) is None) == (self.messages is None):
            raise ValueError(f"send one of {self.TEXT_FIELD} and messages (vLLM's chat form)")
        if self.messages is not None and getattr(self, "prompt_name", None) is not None:
            raise ValueError("prompt_name applies to `input`: a chat template formats `messages`")
        return self

    TEXT_FIELD: ClassVar[str] = "input"

    def chat(self) -> dict[str, Any]:
        """PoolingService.chat's options."""
        return {"add_special_tokens": bool(getattr(self, "add_special_tokens", None)),
                "add_generation_prompt": self.add_generation_prompt,
                "continue_final_message": self.continue_final_message,
                "chat_template_kwargs": self.chat_template_kwargs}


class EmbedAliases(Options):
    normalize: bool | None = None
    ACTIVATION_ALIASES: ClassVar[tuple[str, ...]] = ("normalize",)


class ClassifyAliases(Options):
    softmax: bool | None = None
    activation: bool | None = None
    ACTIVATION_ALIASES: ClassVar[tuple[str, ...]] = ("softmax", "activation")


BYTES_FORMATS = ("bytes", "bytes_only")


class Encoding(BaseModel):
    """vLLM's answer encoding of /v1/embeddings and /pooling: float lists, or base64 of each answer's values
    (a token task's flattened row by row) as `embed_dtype` (bfloat16 rounded from float32 as torch rounds
    it) in `endianness` byte order, or vLLM's binary body (`bytes`: with a `metadata` header; `bytes_only`)."""

    encoding_format: Literal["float", "base64", "bytes", "bytes_only"] = "float"
    embed_dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    endianness: Literal["native", "big", "little"] = "native"


class EmbeddingRequest(EmbedAliases, Encoding, ChatForm):
    input: str | list[str] | list[int] | list[list[int]] | None = None
    dimensions: int | None = Field(None, gt=0)
    # One of the model's sentence-transformers prompts (text-embeddings-inference's name).
    prompt_name: str | None = Field(None, max_length=200)

    def parameters(self) -> dict[str, Any]:
        parameters = super().parameters()
        if self.prompt_name is not None:
            parameters["prompt_name"] = self.prompt_name
        return parameters


CohereType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]  # Cohere's embedding types


class CohereContent(BaseModel):
    """One part of a Cohere v2 input: {"type": "text", "text"} (or "image_url", which is refused)."""

    type: str
    text: str | None = None


class CohereInput(BaseModel):
    content: list[CohereContent]


class CohereEmbedRequest(BaseModel):
    """Cohere's embed body: `texts`, or v2's `inputs` of one text part each (its SDK's EmbedInput with a
    TextEmbedContent); `images` and image parts are refused (these models embed text)."""

    model: str | None = None
    texts: list[str] | None = None
    inputs: list[CohereInput] | None = None
    images: list[str] | None = None
    # Picks one of the model's prompts by name (gateway.serving.cohere_prompt); else not used.
    input_type: str | None = Field(None, max_length=200)
    embedding_types: list[CohereType] = ["float"]
    output_dimension: int | None = Field(None, gt=0)
    truncate: Literal["NONE", "START", "END"] = "END"
    max_tokens: int | None = Field(None, gt=0)  # NONE: longer texts refused; START/END: cut to it
    priority: int = Field(0, ge=-1000, le=1000)

    @model_validator(mode="after")
    def _texts(self) -> CohereEmbedRequest:
        given = [name for name in ("texts", "inputs", "images") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("send one of texts or inputs")
        if self.images is not None:
            raise ValueError("images: this server's models embed text; send texts, or inputs of text content")
        for index, item in enumerate(self.inputs or []):
            if len(item.content) != 1 or item.content[0].type != "text" or item.content[0].text is None:
                raise ValueError(f"inputs[{index}]: this server's models embed text: one content part of type "
                                 '"text" per input')
        if self.inputs is not None:  # read as the texts they are
            self.texts = [item.content[0].text or "" for item in self.inputs]
        return self

    def parameters(self) -> dict[str, Any]:
        parameters: dict[str, Any] = {} if self.truncate == "NONE" else {"truncate": self.truncate}
        if self.max_tokens is not None:
            parameters["max_tokens"] = self.max_tokens
        return parameters


class CohereEmbedV1Request(CohereEmbedRequest):
    """Cohere's v1 body: without `embedding_types`, the answer is v1's plain float vectors."""

    embedding_types: list[CohereType] | None = None  # type: ignore[assignment]


class ClassifyRequest(ClassifyAliases, ChatForm):
    input: str | list[str] | list[int] | list[list[int]] | None = None


class Cuts(ClassifyAliases):
    """vLLM's (Cohere's, Jina's) per-side limits of /score and /rerank: each query and each document cut to
    its first that many tokens before it is scored; 0: no cut. truncation_side is not theirs: as in vLLM, it
    is truncate_prompt_tokens' side, of the pair or template as a whole."""

    max_tokens_per_query: int = Field(0, ge=0, le=1_000_000)
    max_tokens_per_doc: int = Field(0, ge=0, le=1_000_000)

    def parameters(self) -> dict[str, Any]:
        return {**super().parameters(), **self.cuts()}

    def cuts(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ("max_tokens_per_query", "max_tokens_per_doc")
                if getattr(self, name)}


class ScoreRequest(Cuts):
    """vLLM's pairs of fields, any one of them: queries/documents (its canonical names), queries/items,
    data_1/data_2, text_1/text_2."""

    queries: str | list[str] | None = None
    documents: str | list[str] | None = None
    items: str | list[str] | None = None
    data_1: str | list[str] | None = None
    data_2: str | list[str] | None = None
    text_1: str | list[str] | None = None
    text_2: str | list[str] | None = None

    def _given(self) -> list[tuple[str, str]]:
        return [(a, b) for a, b in SCORE_PAIRS if getattr(self, a) is not None and getattr(self, b) is not None]

    @model_validator(mode="after")
    def _one_pair(self) -> ScoreRequest:
        given = self._given()
        sent = {name for pair in SCORE_PAIRS for name in pair if getattr(self, name) is not None}
        if len(given) != 1 or sent != set(given[0]):  # a stray half of another pair is not ignored
            raise ValueError(f"send exactly one pair of {', '.join(f'{a}/{b}' for a, b in SCORE_PAIRS)}")
        return self

    def pair(self) -> tuple[tuple[str, Any], tuple[str, Any]]:
        """(name, value) of the two sides given."""
        first, second = self._given()[0]
        return (first, getattr(self, first)), (second, getattr(self, second))


SCORE_PAIRS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2"))


class CohereDocument(BaseModel):
    """Cohere's v1 rerank takes a document as an object; its `text` is what is ranked."""

    text: str


class RerankRequest(Cuts):
    """vLLM's (Cohere's, Jina's) body, or on the same path text-embeddings-inference's: `texts` instead of
    `documents` (with `raw_scores`, `return_text`, `truncate`, `truncation_direction`), answered in its shape."""

    query: str
    documents: str | list[str | CohereDocument] | None = None  # one text: vLLM wraps it in a list
    top_n: int | None = Field(None, ge=0)  # vLLM's default 0: every document
    return_documents: bool = True
    texts: list[str] | None = None
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool | None = None
    truncation_direction: TruncationDirection = "Right"

    @model_validator(mode="after")
    def _one_list(self) -> RerankRequest:
        if (self.documents is None) == (self.texts is None):
            raise ValueError("send documents (or texts, text-embeddings-inference's name), not both")
        return self

    @property
    def tei(self) -> bool:
        return self.texts is not None

    def candidates(self) -> list[str]:
        if self.texts is not None:
            return self.texts
        if isinstance(self.documents, str):
            return [self.documents]
        return [document if isinstance(document, str) else document.text for document in self.documents or []]

    def parameters(self) -> dict[str, Any]:
        if not self.tei:
            return super().parameters()
        # A cross-encoder's route asks for logits instead and applies TEI's activation (serving.tei_activation).
        options = TEIOptions(truncate=self.truncate, truncation_direction=self.truncation_direction)
        return {**options.parameters(), "use_activation": not self.raw_scores, **self.cuts()}


class PoolingRequest(EmbedAliases, ClassifyAliases, Encoding, ChatForm):
    ACTIVATION_ALIASES: ClassVar[tuple[str, ...]] = ("normalize", "softmax", "activation")  # any task
    input: str | list[str] | list[int] | list[list[int]] | None = None
    # vLLM's: the task the caller expects of the model (refused with 400 where the model serves another).
    task: Literal["embed", "classify", "token_embed", "token_classify"] | None = None
    dimensions: int | None = None  # vLLM's /pooling refuses it (400): /v1/embeddings cuts

    @model_validator(mode="after")
    def _no_dimensions(self) -> PoolingRequest:
        if self.dimensions is not None:
            raise ValueError("dimensions is currently not supported on /pooling (vLLM's answer): use /v1/embeddings")
        return self


class TEIOptions(BaseModel):
    """What text-embeddings-inference's bodies share (`model` added: this gateway serves several)."""

    model: str | None = None
    # TEI truncates where a request does not say (its --auto-truncate default), at the end (Right) or start.
    truncate: bool | None = None
    truncation_direction: TruncationDirection = "Right"
    priority: int = Field(0, ge=-1000, le=1000)

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
    priority: int = Field(0, ge=-1000, le=1000)


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
    priority: int = Field(0, ge=-1000, le=1000)

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
    route asks for logits and applies it: serving.tei_activation)."""

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


class TokenizeRequest(BaseModel):
    """vLLM's body (`prompt`), or on the same path text-embeddings-inference's (`inputs`, a text or a list,
    with `prompt_name`), answered in its shape."""

    model: str | None = None
    prompt: str | None = None
    add_special_tokens: bool | None = None  # vLLM's default: true for a prompt, false for messages
    return_token_strs: bool = False  # vLLM's: each token's string in the vocabulary too
    inputs: str | list[str] | None = None
    prompt_name: str | None = Field(None, max_length=200)
    # vLLM's chat form (ChatForm's fields; a generation prompt by default here, as vLLM's /tokenize)
    messages: list[dict[str, Any]] | None = Field(None, max_length=10_000)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None  # passed to the template, as vLLM's /tokenize passes them

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if self.chat_template is not None:
            raise ValueError(UNTRUSTED_TEMPLATE)
        if sum(field is not None for field in (self.prompt, self.inputs, self.messages)) != 1:
            raise ValueError("send one of prompt (vLLM's), messages (its chat form) and inputs "
                             "(text-embeddings-inference's)")
        return self

    @property
    def special_tokens(self) -> bool:
        return self.add_special_tokens if self.add_special_tokens is not None else self.messages is None

    def chat(self) -> dict[str, Any]:
        chat_kwargs = {**(self.chat_template_kwargs or {}), **({"tools": self.tools} if self.tools else {})}
        return {"add_special_tokens": self.special_tokens, "add_generation_prompt": self.add_generation_prompt,
                "continue_final_message": self.continue_final_message, "chat_template_kwargs": chat_kwargs or None}


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: list[int]
    skip_special_tokens: bool = False  # vLLM keeps them by default
