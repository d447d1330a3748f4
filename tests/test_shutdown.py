"""A stop is clean: tritonserver exits 0, no Python stub crashes on the way out, no shared memory stays."""

from __future__ import annotations

import glob
import signal
import subprocess
from pathlib import Path

import pytest

from pooltriton.client import PoolingClient

from conftest import REPOSITORY, start_server


def stub_segfaults() -> int | None:
    """Stub crashes the kernel has logged so far (None where the kernel log cannot be read)."""
    result = subprocess.run(["dmesg"], capture_output=True, text=True)
    if result.returncode != 0:
        return None
    return sum("segfault" in line and "triton_python_b" in line for line in result.stdout.splitlines())


def test_stop_leaves_no_crashed_stub_and_no_shared_memory(tmp_path: Path) -> None:
    before = stub_segfaults()
    server = start_server(REPOSITORY, tmp_path / "server.log")
    try:
        with PoolingClient(server.grpc_url, protocol="grpc") as client:
            client.embed(["warm every stage", "of the pipeline"])
            client.classify_tokens(["Mail john@example.com"], model="rampart")
            client.score("query", ["document"], model="minilm_tokens")
        # SIGTERM and wait, without the launcher's clean-up of leftover regions: Triton must free its own.
        server.process.send_signal(signal.SIGTERM)
        code = server.process.wait(60)
        leftovers = glob.glob(f"/dev/shm/{server.shm_prefix}*")
    finally:
        server.stop()
    assert code == 0, (tmp_path / "server.log").read_text()[-3000:]
    assert not leftovers
    if before is None:
        pytest.skip("the kernel log (dmesg) cannot be read here: stub crashes not checked")
    assert stub_segfaults() == before, "a Python stub segfaulted while the server stopped (see dmesg)"
