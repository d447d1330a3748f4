"""What every dialect's bodies and answers share."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

# A request's priority, as vLLM reads it (lower first): passed to Triton.
Priority = Annotated[int, Field(ge=-1000, le=1000)]


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class Answer(BaseModel):
    """The id, created and model block of vLLM's answers (serving.header)."""

    id: str
    created: int
    model: str


class Health(BaseModel):
    status: str
