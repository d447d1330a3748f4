"""A stop is clean: tritonserver exits 0, no Python stub crashes on the way out, no shared memory stays."""

from __future__ import annotations

import glob
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from pooltriton.client import PoolingClient

from conftest import REPOSITORY, edit_config, start_server, stop_without_exit_timeout, stub_segfaults


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


def test_a_stage_that_died_mid_request_and_was_not_reloaded_does_not_hold_the_stop(tmp_path: Path) -> None:
    """No supervisor: one of the tokenizer's two stubs stops while requests reach it, then is killed.
    Triton 2.51 can never finish unloading that model (its Python backend keeps the failed request's
    response factory), so its own stop would wait out the exit timeout and exit 1. The launcher's stop
    sees the unload make no progress and ends it: no stub, no shared memory, no crash left."""
    import threading

    from pooltriton.server.supervisor import server_stubs

    server = start_server(_minilm_repository(tmp_path / "repository", 2), tmp_path / "server.log")
    failed = threading.Event()
    try:
        victim = next(pid for pid, instance in server_stubs(server.shm_prefix).items()
                      if instance == "minilm_tokenizer_0_0")
        os.kill(victim, signal.SIGSTOP)

        def load() -> None:  # until a request met the stopped stub (Triton: INTERNAL, "not healthy")
            with PoolingClient(server.grpc_url, protocol="grpc", retries=0) as client:
                for _ in range(50):
                    if failed.is_set():
                        return
                    try:
                        client.embed(["one text"])
                    except InferenceServerException:
                        failed.set()

        workers = [threading.Thread(target=load) for _ in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(120)
        os.kill(victim, signal.SIGKILL)
        assert failed.is_set(), "no request reached the stopped stub"
        stop_without_exit_timeout(server, "with a stage that died mid-request")
    finally:
        server.stop()


def _minilm_repository(folder: Path, threads: int) -> Path:
    """The default minilm pipeline alone, its encoder on `threads` threads (a slow and a fast server)."""
    import shutil

    for stage in ("minilm", "minilm_tokenizer", "minilm_encoder"):
        shutil.copytree(REPOSITORY / stage, folder / stage)
    def threaded(message) -> None:
        assert message.parameters["INFERENCE_NUM_THREADS"].string_value == "2"
        message.parameters["INFERENCE_NUM_THREADS"].string_value = str(threads)

    edit_config(folder / "minilm_encoder" / "config.pbtxt", threaded)
    return folder


def _executed(server, model: str) -> int:
    """Requests `model` has answered successfully so far (Triton's statistics)."""
    import httpx

    stats = httpx.get(f"http://{server.http_url}/v2/models/{model}/stats", headers=server.admin_headers(),
                      timeout=5).json()
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


@pytest.mark.parametrize("threads", [1, os.cpu_count() or 2], ids=["slow", "fast"])
def test_sigterm_under_load_finishes_in_flight_requests(tmp_path: Path, minilm_st, threads: int) -> None:
    """Requests accepted before SIGTERM are answered (exactly) before the server exits cleanly, and a
    request sent once the drain began is refused. Ordered by what the server shows (requests held by
    the encoder, the ensemble no longer ready), not by sleeping, so a fast and a slow server agree."""
    import asyncio

    from bench.bench import corpus
    from pooltriton.client import AsyncPoolingClient

    texts = corpus(32, seed=9)
    expected = minilm_st.encode(texts, normalize_embeddings=True, batch_size=32)
    repository = _minilm_repository(tmp_path / "repository", threads)
    server = start_server(repository, tmp_path / "server.log")

    async def until(condition, what: str, timeout: float = 60.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not await asyncio.to_thread(condition):
            assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.005)

    async def run() -> list:
        async with AsyncPoolingClient(server.grpc_url, retries=1) as client:
            await client.info("minilm")
            pending = [asyncio.ensure_future(client.embed(texts)) for _ in range(6)]
            # Accepted: every request has passed the tokenizer stage (and so is inside the ensemble).
            await until(lambda: _executed(server, "minilm_tokenizer") >= 6, "six requests inside the ensemble")
            # What SIGTERM to `pooltriton serve` does: drain (refuse new, finish accepted), then stop.
            stopping = asyncio.get_running_loop().run_in_executor(None, server.stop)
            await until(lambda: not _model_ready(server, "minilm"), "the drain to start")
            unfinished_at_drain = sum(not future.done() for future in pending)
            try:
                await client.embed(["sent while stopping"])
                late = None
            except Exception as error:
                late = error
            results = await asyncio.gather(*pending, return_exceptions=True)
            return [results, unfinished_at_drain, late, await stopping]

    try:
        results, unfinished_at_drain, late, code = asyncio.run(run())
    finally:
        server.stop()
    assert unfinished_at_drain >= 1  # the drain really met requests in flight
    assert all(not isinstance(r, BaseException) for r in results), results
    assert all(np.abs(r - expected).max() <= 1e-5 for r in results)
    assert isinstance(late, InferenceServerException), late  # refused with a definite error, not left hanging
    assert code == 0


def _model_ready(server, model: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/ready", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def test_client_retries_carry_a_request_across_a_restart(tmp_path: Path) -> None:
    """The server stops and comes back on the same ports; a request sent while it is down is answered."""
    import threading

    from tiny_models import build

    from pooltriton.export.build import ExportOptions, export_model
    from pooltriton.server.assemble import assemble
    from pooltriton.server.launcher import TritonServer

    from conftest import BACKENDS, free_port

    folder = build(tmp_path / "models", "bert", "embed", sentence_transformers_pooling="mean_tokens")
    repository = tmp_path / "repository"
    export_model(folder, ExportOptions(name="tiny", out=repository, runtime="openvino"))
    ports = {"http_port": free_port(), "grpc_port": free_port(), "metrics_port": free_port()}
    first = TritonServer(repository, assemble(BACKENDS), log_file=tmp_path / "first.log", **ports).start()
    first.wait_ready()
    for protocol, url in (("grpc", first.grpc_url), ("http", first.http_url)):
        with PoolingClient(url, protocol=protocol, model="tiny") as client:
            before = client.embed(["one two three"])
    assert first.stop() == 0
    answers: dict[str, object] = {}

    def ask(protocol: str, url: str) -> None:
        with PoolingClient(url, protocol=protocol, model="tiny") as client:
            try:
                answers[protocol] = client.embed(["one two three"])
            except Exception as error:
                answers[protocol] = error

    askers = [threading.Thread(target=ask, args=("grpc", first.grpc_url)),
              threading.Thread(target=ask, args=("http", first.http_url))]
    for asker in askers:
        asker.start()  # the server is down: these wait in the client's retries
    second = TritonServer(repository, assemble(BACKENDS), log_file=tmp_path / "second.log", **ports).start()
    try:
        for asker in askers:
            asker.join(60)
    finally:
        second.stop()
    for protocol in ("grpc", "http"):
        assert isinstance(answers[protocol], np.ndarray), (protocol, answers[protocol])
        assert np.abs(answers[protocol] - before).max() <= 1e-6
