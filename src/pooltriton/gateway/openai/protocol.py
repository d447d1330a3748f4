"""vLLM's (and OpenAI's) bodies and answers: /v1/embeddings, /classify, /score, /rerank, /pooling,
/tokenize and /detokenize."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, model_validator

from pooltriton.gateway.protocol import Answer, Priority, Usage


class Options(BaseModel):
    """Options every route shares (vLLM's names)."""

    model: str | None = None
    truncate_prompt_tokens: int | None = Field(None, ge=-1, le=1_000_000)
    truncation_side: Literal["left", "right"] | None = None
    use_activation: bool | None = None
    # vLLM's; false is refused for text (the stages add them), the default of the chat form (ChatForm)
    add_special_tokens: bool | None = None
    priority: Priority = 0
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
    # infinity's: "image" reads `input` as data URLs of images (the model's image tower)
    modality: Literal["text", "image"] = "text"
    # One of the model's sentence-transformers prompts (text-embeddings-inference's name).
    prompt_name: str | None = Field(None, max_length=200)

    def parameters(self) -> dict[str, Any]:
        parameters = super().parameters()
        if self.prompt_name is not None:
            parameters["prompt_name"] = self.prompt_name
        return parameters


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


class MultiModal(BaseModel):
    """vLLM's ScoreMultiModalParam: documents as content parts (image_url parts: the model's image tower)."""

    content: list[dict[str, Any]] = Field(max_length=1024)


Documents = str | list[str] | MultiModal | list[MultiModal]


class ScoreRequest(Cuts):
    """vLLM's pairs of fields, any one of them: queries/documents (its canonical names), queries/items,
    data_1/data_2, text_1/text_2."""

    queries: str | list[str] | None = None
    documents: Documents | None = None
    items: Documents | None = None
    data_1: str | list[str] | None = None
    data_2: Documents | None = None
    text_1: str | list[str] | None = None
    text_2: Documents | None = None

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
    """vLLM's (Cohere's, Jina's) body."""

    query: str
    documents: str | MultiModal | list[str | CohereDocument | MultiModal]  # one text: vLLM wraps it in a list
    top_n: int | None = Field(None, ge=0)  # vLLM's default 0: every document
    return_documents: bool = True

    def candidates(self) -> list[str]:
        if isinstance(self.documents, str):
            return [self.documents]
        if isinstance(self.documents, MultiModal) or any(isinstance(d, MultiModal) for d in self.documents):
            raise ValueError("documents: texts, or image content parts (the model's image tower), not both")
        return [document if isinstance(document, str) else document.text for document in self.documents]


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


class TokenizeRequest(BaseModel):
    """vLLM's body: `prompt`, or its chat form (`messages`)."""

    model: str | None = None
    prompt: str | None = None
    add_special_tokens: bool | None = None  # vLLM's default: true for a prompt, false for messages
    return_token_strs: bool = False  # vLLM's: each token's string in the vocabulary too
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
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send one of prompt and messages (vLLM's chat form)")
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


# ---- answers (documented in the OpenAPI schema; the routes write them as JSON directly) -------------------
class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # float, or base64 of embed_dtype


class EmbeddingResponse(Answer):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    usage: Usage


class ClassifyData(BaseModel):
    index: int
    label: str | int
    probs: list[float]
    num_classes: int


class ClassifyResponse(Answer):
    object: Literal["list"] = "list"
    data: list[ClassifyData]
    usage: Usage


class ScoreData(BaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(Answer):
    object: Literal["list"] = "list"
    data: list[ScoreData]
    usage: Usage


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None  # with return_documents


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    usage: Usage


class PoolingData(BaseModel):
    index: int
    object: Literal["pooling"] = "pooling"
    data: list[Any] | str  # a vector, a row per token, or base64 of embed_dtype


class PoolingResponse(Answer):
    object: Literal["list"] = "list"
    data: list[PoolingData]
    usage: Usage


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int | None
    token_strs: list[str] | None


class DetokenizeResponse(BaseModel):
    prompt: str
