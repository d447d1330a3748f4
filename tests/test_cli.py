"""The command lines: --help everywhere, and the client CLI printing JSON against the real server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["pooltriton.cli", "pooltriton.client"])
def test_help(module: str) -> None:
    out = subprocess.run([sys.executable, "-m", module, "--help"], check=True, capture_output=True, text=True)
    assert "usage" in out.stdout


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_client_cli_prints_json(server, protocol: str) -> None:
    url = server.http_url if protocol == "http" else server.grpc_url
    out = subprocess.run(
        [sys.executable, "-m", "pooltriton.client", "--url", url, "--protocol", protocol,
         "embed", "A man is eating food.", "hello"],
        check=True, capture_output=True, text=True,
    ).stdout
    data = json.loads(out)["data"]
    assert len(data) == 2 and len(data[0]["embedding"]) == 384
    assert abs(data[0]["embedding"][0] - 0.0332) < 1e-4
