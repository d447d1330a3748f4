"""Shared fixtures: one real tritonserver per test session, on free ports, over the default repository.

The repository and backend directory are the ones `make test` just built (override with
POOLTRITON_REPOSITORY / POOLTRITON_BACKENDS).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from pooltriton.client import PoolingClient
from pooltriton.export.build import ExportOptions, export_model
from pooltriton.export.defaults import minilm_path
from pooltriton.server.assemble import assemble
from pooltriton.server.launcher import TritonServer

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = Path(os.environ.get("POOLTRITON_REPOSITORY", ROOT / "model_repository"))
BACKENDS = Path(os.environ.get("POOLTRITON_BACKENDS", ROOT / "build" / "backends"))


def edit_config(path: Path, edit) -> None:
    """Change a generated config.pbtxt as Triton's own message (`edit(message)`), written back by text_format."""
    from google.protobuf import text_format

    from pooltriton.contract.config import parse_config

    config = parse_config(path)
    edit(config)
    path.write_text(text_format.MessageToString(config))


# One graph cache (export.graphs) for the suite's matrices: a model the ONNX server's fixture traced is
# copied, not traced again, for the OpenVINO server's (verification still runs on each copy).
_graph_cache: list[str] = []  # made by the first export_all (not at import: spawned workers import this)


def export_all(jobs: Sequence[tuple[Path, ExportOptions]], workers: int = 2) -> None:
    """`export_model` over (model folder, options) in `workers` processes of one thread each. An ONNX export
    is ~10 s of single-threaded tracing; the fixtures that export dozens of models take half the time on
    two cores. Exports of different names into one repository are safe together (export.publish)."""
    context = multiprocessing.get_context("spawn")  # no fork of a process that holds torch's threads
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_export_worker,
                             initargs=(graph_cache(),)) as pool:
        for future in [pool.submit(export_model, folder, options) for folder, options in jobs]:
            future.result()


def graph_cache() -> str:
    """The suite's graph cache folder (made on first use, removed when the session ends)."""
    if not _graph_cache:
        _graph_cache.append(tempfile.mkdtemp(prefix="pooltriton-graphs-"))
    return _graph_cache[0]


def _export_worker(graph_cache: str) -> None:
    import torch

    from pooltriton.export.graphs import CACHE_ENV

    torch.set_num_threads(1)
    os.environ[CACHE_ENV] = graph_cache


def pytest_sessionfinish(session: pytest.Session) -> None:
    for folder in _graph_cache:
        shutil.rmtree(folder, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stub_segfaults() -> int | None:
    """Stub crashes the kernel has logged so far (None where the kernel log cannot be read)."""
    result = subprocess.run(["dmesg"], capture_output=True, text=True)
    if result.returncode != 0:
        return None
    return sum("segfault" in line and "triton_python_b" in line for line in result.stdout.splitlines())


def stop_without_exit_timeout(server: TritonServer, what: str) -> None:
    """Stop `server` (the launcher's stop) and check it did not wait out Triton's exit timeout and left
    no stub, no shared memory and no stub crash (a server that held a model whose stub died mid-request
    is killed once everything else is unloaded: -9)."""
    import glob
    import signal

    from pooltriton.server.launcher import EXIT_TIMEOUT_S
    from pooltriton.server.supervisor import server_stubs

    segfaults = stub_segfaults()
    stopping = time.monotonic()
    code = server.stop()
    stopped_in = time.monotonic() - stopping
    assert stopped_in < EXIT_TIMEOUT_S, f"the stop waited out Triton's exit timeout ({stopped_in:.0f} s)"
    assert code in (0, -signal.SIGKILL), code
    assert not server_stubs(server.shm_prefix), "a stub outlived its server"
    assert not glob.glob(f"/dev/shm/{server.shm_prefix}*")
    if segfaults is not None:
        assert stub_segfaults() == segfaults, "a Python stub segfaulted while the server stopped (see dmesg)"
    print(f"\nstop {what}: {stopped_in:.1f} s, exit code {code}")


def start_server(repository: Path, log_file: Path, **kwargs) -> TritonServer:
    server = TritonServer(repository, assemble(BACKENDS), http_port=free_port(), grpc_port=free_port(),
                          metrics_port=free_port(), log_file=log_file, **kwargs)
    server.start()
    try:
        server.wait_ready(timeout=300)
    except Exception:
        server.stop()
        raise RuntimeError(f"server failed to start; log:\n{log_file.read_text()[-4000:]}") from None
    return server


@contextmanager
def running_gateway(grpc_url: str, api_key: str | None = None, client=None, admin_key: str | None = None,
                    **options):
    """The HTTP gateway in a thread of this process (uvicorn), on a free port; yields its base URL."""
    import uvicorn

    from pooltriton.gateway.app import create_app

    port = free_port()
    app = create_app(grpc_url, api_key=api_key, client=client, admin_key=admin_key, **options)
    gateway = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=gateway.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not gateway.started and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        gateway.should_exit = True
        thread.join(10)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory):
    if not (REPOSITORY / "minilm" / "config.pbtxt").is_file():
        pytest.fail(f"{REPOSITORY} has no minilm model: run `make test` (it exports the defaults first)")
    log_file = tmp_path_factory.mktemp("triton") / "server.log"
    server = start_server(REPOSITORY, log_file)
    yield server
    code = server.stop()
    assert code == 0, f"tritonserver exited with {code}; log: {log_file}"


@pytest.fixture(scope="session")
def http_client(server: TritonServer):
    with PoolingClient(server.http_url, protocol="http") as client:
        yield client


@pytest.fixture(scope="session")
def grpc_client(server: TritonServer):
    with PoolingClient(server.grpc_url, protocol="grpc") as client:
        yield client


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, http_client: PoolingClient, grpc_client: PoolingClient):
    return http_client if request.param == "http" else grpc_client


@pytest.fixture(scope="session")
def minilm_st():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path()), device="cpu")


# What starts a real server (tritonserver, the gateway, a container); tests reaching one through their
# fixtures or their own body are marked `server`, so `make test-fast` (-m "not server") runs the rest.
_STARTS_A_SERVER = ("start_server(", "running_gateway(", "TritonServer(", "dockerd", "pooltriton.cli\", \"serve")


def _starts_a_server(function) -> bool:
    import inspect

    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return False
    return any(needle in source for needle in _STARTS_A_SERVER)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        fixtures = [d.func for defs in (info.name2fixturedefs.values() if info else ()) for d in defs]
        if any(_starts_a_server(f) for f in [getattr(item, "function", None), *fixtures] if f is not None):
            item.add_marker(pytest.mark.server)


# The gateway's route tests (test_gateway_*.py but test_gateway.py, which serves a real Triton): a fake client.
@pytest.fixture
def fake():
    from gateway_fake import FakeClient

    return FakeClient()


@pytest.fixture
def http(fake):
    from fastapi.testclient import TestClient

    from pooltriton.gateway import create_app

    with TestClient(create_app("unused:0", client=fake)) as client:
        yield client
