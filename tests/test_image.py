"""The CPU image, built by a real Docker engine from the wheelhouse, run by the compose `cpu` profile:
embeddings over KServe HTTP, gRPC and the gateway equal sentence-transformers; `down` leaves no
container, volume or shared-memory region. Where no engine can run, the tests say so and skip.

Costs a few minutes (the image is built from scratch: torch and the exports live in its build stage);
loopback only (host networking); everything made here is removed, the daemon stopped if started here."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from pooltriton.client import PoolingClient

from conftest import free_port

ROOT = Path(__file__).resolve().parent.parent
IMAGE = f"pooltriton:test-{os.getpid()}"
BASE = "debian:bookworm-slim"
TEXTS = ["A man is eating food.", "The new movie is awesome.", "Ein Hund läuft über die Wiese."]


def _run(*command: str, timeout: float = 120, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} -> {result.returncode}\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def _engine_up() -> bool:
    return shutil.which("docker") is not None and _run("docker", "info", check=False, timeout=30).returncode == 0


def _images() -> set[str]:
    """Every image the engine holds, intermediate ones included."""
    return set(_run("docker", "images", "-a", "-q", "--no-trunc").stdout.split())


@pytest.fixture(scope="module")
def docker(tmp_path_factory: pytest.TempPathFactory):
    """A running Docker engine: the one there is, or one started here (and stopped after)."""
    daemon = None
    if not _engine_up():
        if shutil.which("dockerd") is None or os.geteuid() != 0:
            pytest.skip("no Docker engine here (dockerd missing or not root; `make deploy-tools` installs it)")
        log = tmp_path_factory.mktemp("dockerd") / "dockerd.log"
        # Host networking only: no bridge, no iptables (../shared/DOCKER.md).
        daemon = subprocess.Popen(["dockerd", "--iptables=false", "--ip6tables=false", "--bridge=none"],
                                  stdout=log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not _engine_up() and time.monotonic() < deadline and daemon.poll() is None:
            time.sleep(1)
        if not _engine_up():
            daemon.terminate()
            pytest.skip(f"the Docker engine did not start here: {log.read_text()[-500:]}")
    made_base = False
    if _run("docker", "image", "inspect", BASE, check=False).returncode != 0:
        if shutil.which("mmdebstrap") is None:
            pytest.skip(f"no {BASE} image and no mmdebstrap to make one (no registry here)")
        rootfs = tmp_path_factory.mktemp("base") / "rootfs.tar"
        _run("mmdebstrap", "--variant=minbase", "--include=ca-certificates", "bookworm", str(rootfs), timeout=600)
        _run("docker", "import", str(rootfs), BASE, timeout=300)
        made_base = True
    before = _images()
    yield
    _run("docker", "rmi", "-f", IMAGE, check=False)
    # The legacy builder keeps each stage's image: the export stage (torch, the exports: ~4 GiB) is no
    # parent of the final image, so removing that leaves it dangling, and every run filled the disk more.
    made = _images() - before
    if made:
        _run("docker", "rmi", "-f", *made, check=False)
    left = _images() & made
    if made_base:
        _run("docker", "rmi", BASE, check=False)
    if daemon is not None:
        daemon.terminate()
        daemon.wait(60)
    assert not left, f"images this test built are still there: {sorted(left)}"


@pytest.fixture(scope="module")
def image(docker) -> str:
    started = time.monotonic()
    _run("make", "image-wheelhouse", cwd=ROOT, timeout=900)
    built = _run("docker", "build", "--force-rm", "--network", "host", "--target", "cpu", "-t", IMAGE, ".", cwd=ROOT,
                 timeout=1800, env={**os.environ, "DOCKER_BUILDKIT": "0"})
    size = int(_run("docker", "image", "inspect", "--format", "{{.Size}}", IMAGE).stdout)
    print(f"\nimage {IMAGE}: {size / 2**20:.0f} MiB, wheelhouse + build {time.monotonic() - started:.0f} s")
    assert "Successfully tagged" in built.stdout
    return IMAGE


def _compose(project: str, env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return _run("docker-compose", "-p", project, "--profile", "cpu", *args, cwd=ROOT, env=env, timeout=timeout)


def test_compose_cpu_profile_serves_exact_embeddings(image: str, minilm_st) -> None:
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose is not installed (`make deploy-tools`)")
    ports = {name: free_port() for name in ("HTTP", "GRPC", "METRICS", "GATEWAY")}
    project = f"pooltritontest{os.getpid()}"
    env = {**os.environ, "POOLTRITON_IMAGE": image, "POOLTRITON_ADMIN_KEY": secrets.token_urlsafe(16),
           **{f"POOLTRITON_{name}_PORT": str(port) for name, port in ports.items()}}
    shm_before = set(os.listdir("/dev/shm"))
    _compose(project, env, "up", "-d")
    up = time.monotonic()
    try:
        container = _compose(project, env, "ps", "-q").stdout.split()
        assert len(container) == 1
        deadline, health = time.monotonic() + 300, ""
        while time.monotonic() < deadline and health != "healthy":
            health = _run("docker", "inspect", "--format", "{{.State.Health.Status}}", container[0]).stdout.strip()
            assert health in ("starting", "healthy"), _compose(project, env, "logs").stdout[-4000:]
            time.sleep(2)
        assert health == "healthy", _compose(project, env, "logs").stdout[-4000:]
        print(f"\ncompose cpu profile: healthy {time.monotonic() - up:.0f} s after `up`")
        user = _run("docker", "exec", container[0], "id", "-u").stdout.strip()
        assert user == "1000"
        expected = minilm_st.encode(TEXTS, normalize_embeddings=True)
        for protocol, port in (("http", ports["HTTP"]), ("grpc", ports["GRPC"])):
            with PoolingClient(f"localhost:{port}", protocol=protocol) as client:
                _assert_same(client.embed(TEXTS), expected, protocol)
        deadline = time.monotonic() + 60
        while httpx.get(f"http://127.0.0.1:{ports['GATEWAY']}/health", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "the gateway never became healthy"
            time.sleep(1)
        answer = httpx.post(f"http://127.0.0.1:{ports['GATEWAY']}/v1/embeddings",
                            json={"model": "minilm", "input": TEXTS}, timeout=60)
        assert answer.status_code == 200, answer.text
        _assert_same(np.array([d["embedding"] for d in answer.json()["data"]]), expected, "gateway")
    finally:
        down = _compose(project, env, "down", "-v", "--remove-orphans", timeout=180)
    assert down.returncode == 0
    left = _run("docker", "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={project}").stdout.split()
    volumes = _run("docker", "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={project}").stdout
    assert not left and not volumes.split(), (left, volumes)
    assert not {n for n in set(os.listdir("/dev/shm")) - shm_before if "pooltriton" in n}


def _assert_same(vectors: np.ndarray, expected: np.ndarray, where: str) -> None:
    cosine = np.sum(vectors * expected, axis=1) / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(expected, axis=1))
    assert vectors.shape == expected.shape and cosine.min() >= 0.99999, (where, cosine)
