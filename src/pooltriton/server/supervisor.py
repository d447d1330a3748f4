"""Self-healing: bring a stage back when its Python stub dies.

Triton 2.51 does not restart a dead stub: the model keeps answering "Stub process ... is not healthy"
(HTTP 500) and its readiness stays true. The server runs with `--model-control-mode=explicit` (every
model loaded at start), its model-repository API closed to all but the admin key, and this
supervisor watches the stub processes (by the server's shared-memory prefix in their command line).
When one of a model's stubs is gone it unloads and loads that model again over the repository API:
while the model is unloaded Triton's strict readiness is false (so are the gateway's `/health` and any
probe on `/v2/health/ready`), and it is back with fresh stubs within seconds (~3 s for an encoder here).
A wedged stub that is alive but never answers is not detected (no canary inference yet).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

# The stub's command line: stub, model path, shm region, sizes..., instance name at this index.
_INSTANCE_ARG = 8


def instance_model(instance: str) -> str:
    """`minilm_encoder_0_1` (model, instance group, instance) -> `minilm_encoder`."""
    return instance.rsplit("_", 2)[0]


class Supervisor:
    def __init__(self, server, interval_s: float = 1.0) -> None:
        self.server = server
        self.interval_s = interval_s
        self.expected: dict[str, int] = {}  # instance name -> pid
        self.healed: list[tuple[str, float]] = []  # (model, seconds to recover)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def stubs(self) -> dict[str, int]:
        """This server's Python stubs, instance name -> pid."""
        prefix = self.server.shm_prefix.encode()
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if len(argv) > _INSTANCE_ARG and argv[0].endswith(b"triton_python_backend_stub") and prefix in argv[2]:
                found[argv[_INSTANCE_ARG].decode()] = int(entry.name)
        return found

    def start(self) -> Supervisor:
        self.expected = self.stubs()
        self._thread = threading.Thread(target=self._run, name="pooltriton-supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except OSError as error:  # the server is stopping or unreachable: try again next tick
                print(f"supervisor: {error}", file=sys.stderr, flush=True)

    def check(self) -> list[str]:
        """Reload every model one of whose stubs died since the last check; returns those models."""
        current = self.stubs()
        dead = sorted({instance_model(i) for i, pid in self.expected.items() if current.get(i) != pid})
        for model in dead:
            started = time.monotonic()
            print(f"supervisor: a stub of {model} died; reloading it", file=sys.stderr, flush=True)
            self.server.admin(f"/v2/repository/models/{model}/unload", timeout=300)
            self.server.admin(f"/v2/repository/models/{model}/load", timeout=300)
            self.healed.append((model, time.monotonic() - started))
            print(f"supervisor: {model} is back ({time.monotonic() - started:.1f} s)", file=sys.stderr, flush=True)
        if dead:
            current = self.stubs()
        self.expected = {**{i: p for i, p in self.expected.items() if instance_model(i) not in dead},
                         **{i: p for i, p in current.items() if instance_model(i) in dead}}
        return dead
