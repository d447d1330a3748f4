"""Cohere's embed bodies (v1 and v2) and answers."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr, model_validator

from pooltriton.gateway.media import part_url
from pooltriton.gateway.protocol import Priority

CohereType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]  # Cohere's embedding types


class CohereContent(BaseModel):
    """One part of a Cohere v2 input: {"type": "text", "text"} or {"type": "image_url", "image_url": {"url"}}."""

    type: str
    text: str | None = None
    image_url: dict[str, Any] | str | None = None


class CohereInput(BaseModel):
    content: list[CohereContent]


class CohereEmbedRequest(BaseModel):
    """Cohere's embed body: `texts`, `images` (data URIs, the model's image tower), or v2's `inputs` of one
    text or one image part each (its SDK's EmbedInput)."""

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
    _image_urls: list[tuple[str, str]] | None = PrivateAttr(None)  # (url, where) of each image sent
    _image_parts: list[tuple[dict, str]] | None = PrivateAttr(None)  # (content part, where) of v2's images

    @model_validator(mode="after")
    def _texts(self) -> CohereEmbedRequest:
        given = [name for name in ("texts", "inputs", "images") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("send one of texts, images or inputs")
        if self.images is not None:
            self._image_urls = [(url, f"images[{index}]") for index, url in enumerate(self.images)]
        kinds = set()
        for index, item in enumerate(self.inputs or []):
            part = item.content[0] if len(item.content) == 1 else None
            if part is None or (part.type, part.text is None, part.image_url is None) not in (
                    ("text", False, True), ("image_url", True, False)):
                raise ValueError(f"inputs[{index}]: one content part per input, of type \"text\" or \"image_url\"")
            kinds.add(part.type)
        if len(kinds) > 1:
            raise ValueError("inputs: all text or all images in one request")
        if self.inputs is not None and kinds == {"image_url"}:
            self._image_parts = [(item.content[0].model_dump(), f"inputs[{index}].content[0]")
                                 for index, item in enumerate(self.inputs)]
        elif self.inputs is not None:  # read as the texts they are
            self.texts = [item.content[0].text or "" for item in self.inputs]
        return self

    @property
    def image_urls(self) -> list[tuple[str, str]] | None:
        """(url, where) of each image sent; a v2 part without a URL is refused here (a 400 naming it)."""
        if self._image_parts is not None:
            return [(part_url(part, where), where) for part, where in self._image_parts]
        return self._image_urls

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
