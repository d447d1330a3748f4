"""Images as clients send them (vLLM's `image_url` parts, Cohere's `images`, infinity's `input`): a data URL
always; an `http(s)` URL only from a domain the operator named (`--allowed-media-domains`, vLLM's flag), never
from a private or loopback address, without redirects to another domain, under a size and time limit; a
`file://` path only under `--allowed-local-media-path`. Everything else is a 400 saying what to send instead
(docs/images.md). The image itself is decoded under limits by the image stage in Triton."""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

from pooltriton.core.images import MAX_IMAGE_BYTES
from pooltriton.gateway.errors import APIError

MEDIA_TIMEOUT_S = 10.0  # one fetch, connection to last byte
MAX_REDIRECTS = 3
MAX_IMAGES = 128  # per request (Triton's batch limit): bounds what one body can make the gateway hold
CONCURRENT_FETCHES = 4  # per request
# Addresses is_global lets through that reach others: NAT64 and 6to4 embed an IPv4 address.
EMBEDDING = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"),
             ipaddress.ip_network("2002::/16"))

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
            flag = "--allowed-local-media-path" if scheme == "file" else "--allowed-media-domains"
            raise APIError(400, f"{where}: this server does not fetch images from {scheme} URLs unless its operator "
                                f"allows them ({flag}): send the image inline as a data URL, "
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


@dataclass(frozen=True)
class MediaPolicy:
    """What the gateway may fetch for a request. `allow_private` is for tests on loopback only."""

    domains: frozenset[str] = frozenset()  # hosts taken exactly (lower case); empty: no remote media
    local_path: Path | None = None  # files under this folder; None: no local media
    max_bytes: int = MAX_IMAGE_BYTES
    timeout_s: float = MEDIA_TIMEOUT_S
    allow_private: bool = field(default=False, repr=False)

    async def load(self, url: Any, where: str) -> bytes:
        scheme = url.split(":", 1)[0].lower() if isinstance(url, str) and ":" in url else ""
        try:
            if scheme in ("http", "https") and self.domains:
                return await asyncio.wait_for(self._fetch(url, where), self.timeout_s)
            if scheme == "file" and self.local_path is not None:
                return await asyncio.to_thread(self._read, url, where)
        except asyncio.TimeoutError:  # (not the builtin before Python 3.11)
            raise APIError(400, f"{where}: the image was not fetched within {self.timeout_s:g} s", where) from None
        except ValueError:  # a URL that does not parse (a port out of range, an open bracket)
            raise APIError(400, f"{where}: not a valid URL", where) from None
        return image_bytes(url, where, self.max_bytes)

    async def load_all(self, urls: Sequence[tuple[str, str]]) -> list[bytes]:
        """Every image of a request, a few fetches at a time; the first refusal cancels the rest."""
        if len(urls) > MAX_IMAGES:
            raise APIError(400, f"at most {MAX_IMAGES} images per request, not {len(urls)}")
        gate = asyncio.Semaphore(CONCURRENT_FETCHES)

        async def one(url: str, where: str) -> bytes:
            async with gate:
                return await self.load(url, where)

        tasks = [asyncio.ensure_future(one(url, where)) for url, where in urls]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()

    def _read(self, url: str, where: str) -> bytes:
        root = self.local_path.resolve()  # type: ignore[union-attr]
        try:
            path = Path(unquote(urlsplit(url).path)).resolve()  # symlinks and '..' resolved before the check
            if not path.is_relative_to(root) or not path.is_file():
                raise APIError(400, f"{where}: no image file under the allowed local media path", where)
            if path.stat().st_size > self.max_bytes:
                raise APIError(400, f"{where}: the image is over the limit of {self.max_bytes} bytes", where)
            return path.read_bytes()
        except (OSError, ValueError):  # unreadable, or a path holding a NUL
            raise APIError(400, f"{where}: no image file under the allowed local media path", where) from None

    async def _fetch(self, url: str, where: str) -> bytes:
        import httpx

        first = (urlsplit(url).hostname or "").lower()
        async with httpx.AsyncClient(follow_redirects=False, timeout=self.timeout_s, trust_env=False) as client:
            for _ in range(MAX_REDIRECTS + 1):
                if (host := (urlsplit(url).hostname or "").lower()) != first:
                    raise APIError(400, f"{where}: {first} redirects to another domain ({host}): not followed", where)
                target, host, headers, extensions = await self._pinned(url, where)
                try:
                    async with client.stream("GET", target, headers=headers, extensions=extensions) as answer:
                        if answer.is_redirect:
                            url = urljoin(url, answer.headers.get("location", ""))
                            continue
                        if answer.status_code != 200:
                            raise APIError(400, f"{where}: fetching the image got HTTP {answer.status_code}", where)
                        return await self._body(answer, where)
                except httpx.HTTPError as error:
                    raise APIError(400, f"{where}: the image could not be fetched from {host} "
                                        f"({type(error).__name__})", where) from None
        raise APIError(400, f"{where}: more than {MAX_REDIRECTS} redirects", where)

    async def _pinned(self, url: str, where: str) -> tuple[str, str, dict, dict]:
        """The URL rewritten to the address its host resolves to, once checked (so a second lookup cannot
        lead elsewhere), with the Host header and TLS name of the host."""
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        if parts.scheme not in ("http", "https") or host not in self.domains:
            raise APIError(400, f"{where}: images are fetched only from the allowed media domains "
                                f"({', '.join(sorted(self.domains))}), not {host or url!r}", where)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            raise APIError(400, f"{where}: {host} does not resolve", where) from None
        addresses = [ipaddress.ip_address(info[4][0]) for info in found]
        if not addresses or (not self.allow_private and not all(_public(a) for a in addresses)):
            raise APIError(400, f"{where}: {host} resolves to a private, loopback or reserved address: not "
                                "fetched", where)
        address = addresses[0]
        literal = f"[{address}]" if address.version == 6 else str(address)
        target = parts._replace(netloc=f"{literal}:{port}").geturl()
        headers = {"host": host if parts.port is None else f"{host}:{parts.port}", "accept": "image/*"}
        return target, host, headers, ({"sni_hostname": host} if parts.scheme == "https" else {})

    async def _body(self, answer: Any, where: str) -> bytes:
        declared = answer.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            raise APIError(400, f"{where}: the image is over the limit of {self.max_bytes} bytes", where)
        chunks, size = [], 0
        async for chunk in answer.aiter_bytes():
            size += len(chunk)
            if size > self.max_bytes:  # a body longer than it said, or one that did not say
                raise APIError(400, f"{where}: the image is over the limit of {self.max_bytes} bytes", where)
            chunks.append(chunk)
        return b"".join(chunks)


def _public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """A global address that embeds no other (IPv4-mapped, NAT64, 6to4 forms of a private one)."""
    if address.version == 6:
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped.is_global
        if any(address in network for network in EMBEDDING):
            return False
    return address.is_global
