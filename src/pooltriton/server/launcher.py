"""Start, watch and stop a real `tritonserver` (the binary from the nvidia-pytriton wheel).

Follows shared/TRITON.md: the stub's Python must be this venv's (PATH), libpython and the wheel's
bundled libraries go on LD_LIBRARY_PATH, each server gets its own shared-memory prefix, and that
prefix is cleaned up when the server stops.
"""

from __future__ import annotations

import glob
import os
import secrets
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

from pooltriton.contract import ADMIN_HEADER, ADMIN_KEY_ENV, RESTRICTED_APIS, admin_headers
from pooltriton.server.assemble import triton_home
from pooltriton.server.supervisor import Supervisor


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

    def admin_headers(self, protocol: str = "http") -> dict[str, str]:
        """Headers that open the restricted APIs (statistics, repository index, ...)."""
        return admin_headers(self.admin_key, protocol)

    def command(self) -> list[str]:
        return [
            str(triton_home() / "bin" / "tritonserver"),
            f"--model-repository={self.repository}",
            f"--backend-directory={self.backends}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--allow-gpu-metrics=false",
            "--pinned-memory-pool-byte-size=0",
            "--strict-readiness=true",
            # Explicit control, every model loaded at start: the supervisor reloads a dead stage over the
            # repository API (restricted to the admin key below).
            "--model-control-mode=explicit",
            "--load-model=*",
            "--exit-timeout-secs=10",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            f"--http-restricted-api={','.join(RESTRICTED_APIS)}:{ADMIN_HEADER}={self.admin_key}",
            f"--grpc-restricted-protocol={','.join(RESTRICTED_APIS)}:{ADMIN_HEADER}={self.admin_key}",
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        venv_bin = str(Path(sys.executable).parent)
        env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
        bundled = Path(triton_home()).parent.parent / "nvidia_pytriton.libs"
        libdirs = [sysconfig.get_config_var("LIBDIR"), str(bundled), env.get("LD_LIBRARY_PATH", "")]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(d for d in libdirs if d)
        return env

    def start(self) -> TritonServer:
        output = open(self.log_file, "ab") if self.log_file else None
        self.process = subprocess.Popen(self.command(), env=self.environment(), stdout=output,
                                        stderr=subprocess.STDOUT if output else None,
                                        preexec_fn=_die_with_parent)
        return self

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
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

    def stop(self, timeout: float = 30.0) -> int | None:
        code = None
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                code = self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                code = self.process.wait()
        elif self.process is not None:
            code = self.process.returncode
        self.cleanup_shm()
        return code

    def cleanup_shm(self) -> None:
        """A crashed stub leaves its regions behind; they are ours by prefix."""
        for path in glob.glob(f"/dev/shm/{self.shm_prefix}*"):
            try:
                os.unlink(path)
            except OSError:
                pass

    def run_foreground(self, companion: list[str] | None = None) -> int:
        """Serve until Ctrl-C / SIGTERM, then stop Triton cleanly and return its exit code.

        `companion` (the HTTP gateway's command) starts once Triton is ready and stops with it.
        """
        self.start()
        stop = {"requested": False}

        def _forward(signum, _frame):
            stop["requested"] = True

        signal.signal(signal.SIGINT, _forward)
        signal.signal(signal.SIGTERM, _forward)
        print(f"tritonserver: HTTP {self.http_port}, gRPC {self.grpc_port}, metrics {self.metrics_port} "
              f"(Ctrl-C stops it)", file=sys.stderr, flush=True)
        helper = None
        supervisor = None
        while not stop["requested"] and self.process.poll() is None:
            if supervisor is None and self.ready():
                supervisor = Supervisor(self).start()
            if companion and helper is None and self.ready():
                helper = subprocess.Popen(companion, preexec_fn=_die_with_parent,
                                          env={**os.environ, ADMIN_KEY_ENV: self.admin_key})
                print(f"gateway: {' '.join(companion[2:])}", file=sys.stderr, flush=True)
            time.sleep(0.2)
        if supervisor is not None:
            supervisor.stop()
        if helper is not None and helper.poll() is None:
            helper.send_signal(signal.SIGTERM)
            helper.wait(15)
        code = self.stop()
        return code or 0
