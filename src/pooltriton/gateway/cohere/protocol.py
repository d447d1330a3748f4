"""Cohere's embed bodies (v1 and v2) and answers."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from pooltriton.gateway.protocol import Priority

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
    # Picks one of the model's prompts by name (cohere.serving.prompt); else not used.
    input_type: str | None = Field(None, max_length=200)
    embedding_types: list[CohereType] = ["float"]
    output_dimension: int | None = Field(None, gt=0)
    truncate: Literal["NONE", "START", "END"] = "END"
    max_tokens: int | None = Field(None, gt=0)  # NONE: longer texts refused; START/END: cut to it
    priority: Priority = 0

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


class BilledUnits(BaseModel):
    input_tokens: int


class APIVersion(BaseModel):
    version: str


class Meta(BaseModel):
    api_version: APIVersion
    billed_units: BilledUnits


class CohereEmbedResponse(BaseModel):
    """v2's (and v1's with embedding_types) embeddings by type, or v1's plain float vectors."""

    id: str
    embeddings: dict[str, list[Any]] | list[list[float]]
    texts: list[str] | None
    meta: Meta
    response_type: Literal["embeddings_by_type", "embeddings_floats"]
