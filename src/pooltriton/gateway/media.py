"""Images as clients send them (vLLM's `image_url` parts, Cohere's `images`, infinity's `input`): the bytes of
a data URL. The server fetches nothing a request names: a remote URL or a local file is refused with a 400
that says what to send instead (docs/security.md), so no request makes the server reach an address the
operator did not allow. The image itself is decoded under limits by the image stage in Triton."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from typing import Any

from pooltriton.core.images import MAX_IMAGE_BYTES
from pooltriton.gateway.errors import APIError

_DATA_URL = re.compile(r"data:(?P<type>[^;,]*)(?P<parameters>(;[^;,]*)*),", re.IGNORECASE)
IMAGE_PARTS = ("image_url", "input_image", "image")  # vLLM's / OpenAI's part types that carry an image


def image_bytes(url: Any, where: str, max_bytes: int = MAX_IMAGE_BYTES) -> bytes:
    """The bytes a data URL holds (base64), refused with a 400 naming `where` for anything else."""
    if not isinstance(url, str) or not url:
        raise APIError(400, f"{where}: an image is a data URL (data:image/png;base64,...)", where)
    head = _DATA_URL.match(url)
    if head is None:
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if scheme in ("http", "https", "file"):
            raise APIError(400, f"{where}: this server does not fetch images from {scheme} URLs (no remote or local "
                                "media is allowed): send the image inline as a data URL, "
                                "data:image/<format>;base64,<bytes>", where)
        raise APIError(400, f"{where}: not an image URL: send a data URL, data:image/<format>;base64,<bytes>", where)
    if ";base64" not in head["parameters"].lower():
        raise APIError(400, f"{where}: a data URL of an image must be base64 (data:image/png;base64,...)", where)
    if head["type"] and not head["type"].lower().startswith("image/"):
        raise APIError(400, f"{where}: the data URL holds {head['type']}, not an image", where)
    encoded = url[head.end():]
    if len(encoded) // 4 * 3 > max_bytes + 3:  # refused before decoding
        raise APIError(400, f"{where}: the image is over the limit of {max_bytes} bytes", where)
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, f"{where}: the data URL's base64 is not valid", where) from None


def part_url(part: dict, where: str) -> str:
    """The URL of an image part: {"image_url": {"url": ...}} (OpenAI's, vLLM's) or {"image_url": "..."}."""
    kind = part.get("type")
    value = part.get(kind) if kind in part else part.get("image_url")
    if isinstance(value, dict):
        value = value.get("url")
    if not isinstance(value, str):
        raise APIError(400, f"{where}: an image part holds its data URL under {kind}.url", where)
    return value


def message_images(messages: Sequence[dict]) -> list[tuple[str, str]] | None:
    """(url, where) of each image part of vLLM's chat form, or None where the messages hold no image."""
    found = []
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for number, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") in IMAGE_PARTS:
                where = f"messages[{index}].content[{number}]"
                found.append((part_url(part, where), where))
    return found or None


def content_images(documents: Any, field: str) -> list[tuple[str, str]] | None:
    """(url, where) of each image of vLLM's multimodal documents ({"content": [parts]}, or a list of them),
    None for texts; a document part that is not an image is refused (one kind per request)."""
    groups = documents if isinstance(documents, list) else [documents]
    if not any(hasattr(group, "content") for group in groups):
        return None
    found = []
    for number, group in enumerate(groups):
        if not hasattr(group, "content"):
            raise APIError(400, f"{field}: texts, or image content parts, not both in one request", field)
        for index, part in enumerate(group.content):
            where = f"{field}[{number}]" if isinstance(documents, list) else field
            where += f".content[{index}]"
            if not isinstance(part, dict) or part.get("type") not in IMAGE_PARTS:
                raise APIError(400, f"{where}: scored against a text query, a document is an image_url part", where)
            found.append((part_url(part, where), where))
    if not found:
        raise APIError(400, f"{field}: no image", field)
    return found
