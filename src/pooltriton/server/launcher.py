"""Start, watch and stop a real `tritonserver` (the binary from the nvidia-pytriton wheel).

Follows shared/TRITON.md: the stub's Python must be this venv's (PATH), libpython and the wheel's
bundled libraries go on LD_LIBRARY_PATH, each server gets its own shared-memory prefix, and that
prefix is cleaned up when the server stops.
"""

from __future__ import annotations

import glob
import http.client
import logging
import os
import secrets
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from tritonclient.utils import InferenceServerException

from pooltriton.contract import ADMIN_HEADER, ADMIN_KEY_ENV, RESTRICTED_APIS, admin_headers, stages
from pooltriton.contract.config import parse_config, repository_models
from pooltriton.server.assemble import SERVER_ENV, server_binary, triton_home
from pooltriton.server.supervisor import CANARY_DEADLINE_S, CANARY_INTERVAL_S, Supervisor, server_stubs

log = logging.getLogger(__name__)
# A server that is not (or no longer) there: refused or reset connections, or Triton's own error.
# (geventhttpclient's closed connection is an http.client.HTTPException, not an OSError.)
ADMIN_ERRORS = (OSError, http.client.HTTPException, InferenceServerException)

# Accepted requests get this long to finish when the server stops (Kubernetes' default grace period
# is 30 s; Triton's own exit timeout follows).
DRAIN_TIMEOUT_S = 20.0
EXIT_TIMEOUT_S = 60
# Once the repository API shows every model unloaded, Triton's own stop has nothing left to do but
# exit; one still running this long after SIGTERM waits on a model it no longer lists (see stop).
UNLOADED_EXIT_S = 10.0
# After the drain no stage has requests left to finish: an unload that makes no progress this long
# never will (each stage unloads in 1-3 s here).
UNLOAD_STALL_S = 15.0
# The stages' unload after the drain (a few seconds for ~15 models here), within Kubernetes' 90 s grace
# together with the drain.
UNLOAD_TIMEOUT_S = 30.0


def _backend(repository: Path, name: str) -> str:
    config = repository / name / "config.pbtxt"
    return parse_config(config).backend if config.is_file() else ""


def _die_with_parent() -> None:
    """Linux: SIGTERM the server if whoever started it dies (a killed test run leaves no orphans)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class TritonServer:
    def __init__(
        self,
        repository: Path,
        backends: Path,
        http_port: int = 8000,
        grpc_port: int = 8001,
        metrics_port: int = 8002,
        log_file: Path | None = None,
        extra_args: tuple[str, ...] = (),
        admin_key: str | None = None,
    ) -> None:
        self.repository = Path(repository).resolve()
        self.backends = Path(backends).resolve()
        self.http_port, self.grpc_port, self.metrics_port = http_port, grpc_port, metrics_port
        self.shm_prefix = f"pooltriton{os.getpid()}p{http_port}_"
        self.log_file = log_file
        self.extra_args = extra_args
        # The key of Triton's restricted APIs (contract.RESTRICTED_APIS): given, from the environment,
        # or made up for this server (its owner reads it here).
        self.admin_key = admin_key or os.environ.get(ADMIN_KEY_ENV) or secrets.token_urlsafe(24)
        self.process: subprocess.Popen | None = None

    @property
    def http_url(self) -> str:
        return f"localhost:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"localhost:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://localhost:{self.metrics_port}/metrics"

    def admin_headers(self, protocol: str = "http") -> dict[str, str]:
        """Headers that open the restricted APIs (statistics, repository index, ...)."""
        return admin_headers(self.admin_key, protocol)

    def command(self) -> list[str]:
        models = repository_models(self.repository)
        others = sorted(p.name for p in self.repository.iterdir() if p.is_dir() and not p.name.startswith(".")
                        and p.name not in models) if self.repository.is_dir() else []
        if others:
            log.warning("not loading %s: no config.pbtxt (not a model of %s)", ", ".join(others), self.repository)
        return [
            str(server_binary()),
            f"--model-repository={self.repository}",
            f"--backend-directory={self.backends}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--allow-gpu-metrics=false",
            # p50/p90/p99 per model (nv_inference_request_summary_us), for dashboards and alerts.
            "--metrics-config=summary_latencies=true",
            "--pinned-memory-pool-byte-size=0",
            "--strict-readiness=true",
            # Every config is written whole by the export: Triton's auto-complete would only start one
            # more Python stub per model to ask (importing torch for an encoder stage), doubling the start.
            "--disable-auto-complete-config",
            # Explicit control, every model loaded at start: the supervisor reloads a dead stage over the
            # repository API (restricted to the admin key below).
            "--model-control-mode=explicit",
            *(f"--load-model={name}" for name in models),
            # Unloading ~40 stages whose stubs import torch takes over 10 s on 2 busy cores (measured:
            # "Exit timeout expired" and exit 1 at 10 s); requests were drained before this point.
            f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            f"--http-restricted-api={','.join(RESTRICTED_APIS)}:{ADMIN_HEADER}={self.admin_key}",
            f"--grpc-restricted-protocol={','.join(RESTRICTED_APIS)}:{ADMIN_HEADER}={self.admin_key}",
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        venv_bin = str(Path(sys.executable).parent)
        env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
        # The wheel's server lost its RPATH when copied; the NGC image's server finds its own libraries.
        bundled = "" if env.get(SERVER_ENV) else str(Path(triton_home()).parent.parent / "nvidia_pytriton.libs")
        libdirs = [sysconfig.get_config_var("LIBDIR"), bundled, env.get("LD_LIBRARY_PATH", "")]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(d for d in libdirs if d)
        return env

    def start(self) -> TritonServer:
        output = open(self.log_file, "ab") if self.log_file else None
        self.process = subprocess.Popen(self.command(), env=self.environment(), stdout=output,
                                        stderr=subprocess.STDOUT if output else None,
                                        preexec_fn=_die_with_parent)
        return self

    def triton(self, timeout: float = 30.0) -> Any:
        """tritonclient's HTTP client to this server (readiness and the repository API)."""
        import tritonclient.http as httpclient

        return httpclient.InferenceServerClient(self.http_url, connection_timeout=timeout, network_timeout=timeout)

    def ready(self) -> bool:
        try:
            with self.triton(2) as client:
                return bool(client.is_server_ready())
        except ADMIN_ERRORS:
            return False

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited with code {self.process.returncode} while loading")
            if self.ready():
                return
            time.sleep(0.5)
        raise TimeoutError(f"tritonserver was not ready within {timeout:.0f}s")

    def repository_index(self) -> list[dict]:
        """Triton's repository index (a restricted API: the admin key opens it)."""
        with self.triton() as client:
            return client.get_model_repository_index(headers=self.admin_headers())

    def load(self, model: str, timeout: float = 300.0) -> None:
        with self.triton(timeout) as client:
            client.load_model(model, headers=self.admin_headers())

    def unload(self, model: str, timeout: float = 300.0) -> None:
        with self.triton(timeout) as client:
            client.unload_model(model, headers=self.admin_headers())

    def drain(self, timeout: float = DRAIN_TIMEOUT_S) -> None:
        """Stop taking requests and let the accepted ones finish. Triton's own SIGTERM refuses the
        later steps of ensemble requests already running, so first the public models (plugins and
        scorers, then ensembles) are unloaded: new requests to them are refused (readiness is false),
        the ones inside finish, and each is gone once its last request answered."""
        deadline = time.monotonic() + timeout
        try:
            ready = {m["name"] for m in self.repository_index() if m.get("state") == "READY"}
            inner = {name for model in ready for name in (stages(model).tokenizer, stages(model).encoder,
                                                          stages(model).pooler)}
            public = sorted(ready - inner)
            # Callers first (scorers and plugins call an ensemble), then the ensembles they call.
            callers = [name for name in public if _backend(self.repository, name) in ("scorer", "plugin")]
            for phase in (callers, [name for name in public if name not in callers]):
                for name in phase:
                    self.unload(name, timeout=30)
                while time.monotonic() < deadline:
                    states = {m["name"]: m.get("state") for m in self.repository_index()}
                    if not any(states.get(name) in ("READY", "UNLOADING") for name in phase):
                        break
                    time.sleep(0.2)
        except ADMIN_ERRORS:
            return  # the server is already going: nothing left to drain

    def unload_all(self, timeout: float = UNLOAD_TIMEOUT_S, stall_s: float = UNLOAD_STALL_S) -> bool:
        """Unload every model still loaded (after the drain: the stages) and wait until the repository
        index shows none loaded, or until those left have stayed UNLOADING for `stall_s` with none
        finishing (a model whose stub died mid-request never does, see stop); True then, False when
        the server is gone or `timeout` passed with models still loading or ready."""
        deadline = time.monotonic() + timeout
        try:
            for name in sorted(m["name"] for m in self.repository_index() if m.get("state") == "READY"):
                self.unload(name, timeout=30)
            left, since = None, time.monotonic()
            while time.monotonic() < deadline:
                states = {m["name"]: m.get("state") for m in self.repository_index()}
                now_left = {name for name, state in states.items() if state not in ("UNAVAILABLE", None)}
                if now_left != left:
                    left, since = now_left, time.monotonic()
                if not left:
                    return True
                if all(states[name] == "UNLOADING" for name in left) and time.monotonic() - since >= stall_s:
                    log.warning("%s stayed UNLOADING for %g s with nothing finishing: stopping anyway",
                                ", ".join(sorted(left)), stall_s)
                    return True
                time.sleep(0.2)
        except ADMIN_ERRORS:
            pass  # the server is already going
        return False

    def stop(self, timeout: float = EXIT_TIMEOUT_S + 15, drain: bool = True) -> int | None:
        """Drain, unload everything, SIGTERM, and return tritonserver's exit code (-9 where it had to be
        killed). Triton 2.51 can hold a model it no longer lists (its Python backend leaks a model whose
        stub died mid-request, see supervisor): its stop then waits out the whole exit timeout and exits
        1, its other stubs orphaned. So once the index shows every model unloaded (or stuck unloading, see
        unload_all), a server still running UNLOADED_EXIT_S after SIGTERM holds only such models: its
        stubs and then the server are killed."""
        code = None
        if self.process is not None and self.process.poll() is None:
            unloaded = False
            if drain:
                self.drain()
                unloaded = self.unload_all()
            self.process.send_signal(signal.SIGTERM)
            try:
                code = self.process.wait(UNLOADED_EXIT_S if unloaded else timeout)
            except subprocess.TimeoutExpired:
                if unloaded:
                    log.warning("tritonserver still runs %g s after every model was unloaded: it holds models "
                                "whose stub died mid-request; killing it", UNLOADED_EXIT_S)
                for pid in server_stubs(self.shm_prefix):  # not left orphaned
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                self.process.kill()
                code = self.process.wait()
        elif self.process is not None:
            code = self.process.returncode
        self.cleanup_shm()
        return code

    def memory_mb(self, field: str = "VmRSS") -> float:
        """Memory of tritonserver and all its descendants (the Python stubs), summed from /proc:
        VmRSS now, VmHWM at its peak."""
        total, pids = 0, [self.process.pid]
        while pids:
            current = pids.pop()
            try:
                status = Path(f"/proc/{current}/status").read_text()
                total += int(next(line.split()[1] for line in status.splitlines() if line.startswith(f"{field}:")))
                pids += [int(c) for c in Path(f"/proc/{current}/task/{current}/children").read_text().split()]
            except (OSError, StopIteration):
                continue
        return total / 1024

    def cleanup_shm(self) -> None:
        """A crashed stub leaves its regions behind; they are ours by prefix."""
        for path in glob.glob(f"/dev/shm/{self.shm_prefix}*"):
            try:
                os.unlink(path)
            except OSError:
                pass

    def run_foreground(self, companion: list[str] | None = None, canary_interval_s: float = CANARY_INTERVAL_S,
                       canary_deadline_s: float = CANARY_DEADLINE_S) -> int:
        """Serve until Ctrl-C / SIGTERM, then stop Triton cleanly and return its exit code.

        `companion` (the HTTP gateway's command) starts once Triton is ready and stops with it.
        """
        self.start()
        stop = {"requested": False}

        def _forward(signum, _frame):
            stop["requested"] = True

        signal.signal(signal.SIGINT, _forward)
        signal.signal(signal.SIGTERM, _forward)
        log.info("tritonserver: HTTP %s, gRPC %s, metrics %s (Ctrl-C stops it)", self.http_port, self.grpc_port,
                    self.metrics_port)
        helper = None
        supervisor = None
        while not stop["requested"] and self.process.poll() is None:
            if supervisor is None and self.ready():
                supervisor = Supervisor(self, canary_interval_s=canary_interval_s,
                                        canary_deadline_s=canary_deadline_s).start()
            if companion and helper is None and self.ready():
                helper = subprocess.Popen(companion, preexec_fn=_die_with_parent,
                                          env={**os.environ, ADMIN_KEY_ENV: self.admin_key})
                log.info("gateway: %s", " ".join(companion[2:]))
            time.sleep(0.2)
        if not stop["requested"]:
            # Triton 2.51 aborts when a stub dies inside its IPC (boost lock_exception, Triton issue 8882):
            # exit with its code so the orchestrator restarts the container.
            log.error("tritonserver exited by itself with code %s; stopping", self.process.returncode)
        if supervisor is not None:
            supervisor.stop()
        if helper is not None and helper.poll() is None:
            helper.send_signal(signal.SIGTERM)
            helper.wait(15)
        code = self.stop()
        return code or 0
