"""What the gateway fetches for an image URL (gateway.media): data URLs always; http(s) only from the allowed
domains, never a private or loopback address, no redirect to another domain, under a size limit; files only
under the allowed folder. A real HTTP server on loopback stands in for a remote one (allow_private, the
tests' switch, lets the fetch reach it; the default policy refuses it)."""

from __future__ import annotations

import asyncio
import base64
import http.server
import io
import threading
from pathlib import Path

import pytest
from PIL import Image

from pooltriton.gateway.errors import APIError
from pooltriton.gateway.media import MediaPolicy


def _png() -> bytes:
    out = io.BytesIO()
    Image.linear_gradient("L").resize((20, 10)).save(out, format="PNG")
    return out.getvalue()


PNG = _png()


@pytest.fixture(scope="module")
def origin():
    """A loopback HTTP server: /cat.png, /big (over 1 KiB, declared or not), redirects, a 404."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            port = self.server.server_address[1]
            routes = {"/cat.png": (200, {"content-length": str(len(PNG))}, PNG),
                      "/big": (200, {"content-length": "5000"}, b"x" * 5000),
                      "/big-undeclared": (200, {}, b"x" * 5000),
                      "/same": (302, {"location": "/cat.png"}, b""),
                      "/other": (302, {"location": f"http://localhost:{port}/cat.png"}, b""),
                      "/loop": (302, {"location": "/loop"}, b"")}
            status, headers, body = routes.get(self.path, (404, {}, b"no"))
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join(10)


def load(policy: MediaPolicy, url: str) -> bytes:
    return asyncio.run(policy.load(url, "input[0]"))


def refused(policy: MediaPolicy, url: str) -> str:
    with pytest.raises(APIError) as error:
        load(policy, url)
    assert error.value.status == 400 and error.value.param == "input[0]"
    return error.value.message


def test_data_urls_always_and_nothing_else_by_default(origin: str, tmp_path: Path) -> None:
    policy = MediaPolicy()
    assert load(policy, "data:image/png;base64," + base64.b64encode(PNG).decode()) == PNG
    assert "unless its operator allows them (--allowed-media-domains)" in refused(policy, f"{origin}/cat.png")
    (tmp_path / "cat.png").write_bytes(PNG)
    assert "(--allowed-local-media-path)" in refused(policy, f"file://{tmp_path}/cat.png")


def test_allowed_domains_are_fetched_but_never_from_a_loopback_address(origin: str) -> None:
    assert "private, loopback or reserved" in refused(MediaPolicy(frozenset({"127.0.0.1"})), f"{origin}/cat.png")
    assert "not 'localhost'" in refused(MediaPolicy(frozenset({"example.org"})),
                                        origin.replace("127.0.0.1", "localhost") + "/cat.png")


def test_a_fetch_keeps_its_domain_its_size_limit_and_its_status(origin: str) -> None:
    policy = MediaPolicy(frozenset({"127.0.0.1"}), max_bytes=1024, allow_private=True)
    assert load(policy, f"{origin}/cat.png") == PNG
    assert load(policy, f"{origin}/same") == PNG  # a redirect within the domain is followed
    assert "redirects to another domain (localhost)" in refused(policy, f"{origin}/other")
    assert "more than 3 redirects" in refused(policy, f"{origin}/loop")
    assert "over the limit of 1024 bytes" in refused(policy, f"{origin}/big")
    assert "over the limit of 1024 bytes" in refused(policy, f"{origin}/big-undeclared")
    assert "HTTP 404" in refused(policy, f"{origin}/missing")


def test_local_files_only_under_the_allowed_folder(tmp_path: Path) -> None:
    allowed = tmp_path / "media"
    allowed.mkdir()
    (allowed / "cat.png").write_bytes(PNG)
    (tmp_path / "secret.png").write_bytes(PNG)
    (allowed / "link.png").symlink_to(tmp_path / "secret.png")
    policy = MediaPolicy(local_path=allowed)
    assert load(policy, f"file://{allowed}/cat.png") == PNG
    for outside in (f"file://{tmp_path}/secret.png", f"file://{allowed}/../secret.png", f"file://{allowed}/link.png",
                    f"file://{allowed}/missing.png", f"file://{allowed}"):
        assert "no image file under the allowed local media path" in refused(policy, outside)
    assert "over the limit of 10 bytes" in refused(MediaPolicy(local_path=allowed, max_bytes=10),
                                                   f"file://{allowed}/cat.png")


def test_urls_that_do_not_parse_or_lead_to_embedded_private_addresses_are_400s(tmp_path: Path) -> None:
    import ipaddress

    from pooltriton.gateway.media import _public

    policy = MediaPolicy(frozenset({"example.org"}))
    assert "not a valid URL" in refused(policy, "http://example.org:99999/cat.png")
    assert "not a valid URL" in refused(policy, "http://[::1/cat.png")
    assert "no image file" in refused(MediaPolicy(local_path=tmp_path), f"file://{tmp_path}/a%00b.png")
    for address in ("127.0.0.1", "10.1.2.3", "169.254.169.254", "::1", "::ffff:127.0.0.1", "64:ff9b::7f00:1",
                    "2002:7f00:1::", "fd00::1"):
        assert not _public(ipaddress.ip_address(address)), address
    assert _public(ipaddress.ip_address("93.184.215.14")) and _public(ipaddress.ip_address("2606:4700::1111"))
