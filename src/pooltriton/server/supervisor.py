"""Self-healing: reload a stage whose Python stub died (Triton 2.51 does not), find wedged stages with
a canary inference (decided by status codes and process states, never message text), and kill the
stubs a reload leaves behind. Design: docs/design.md#self-healing-serversupervisor.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import logging
import math
import os
import signal
import threading
import time
from pathlib import Path

import grpc
from tritonclient.utils import InferenceServerException

from pooltriton.contract import TEXT
from pooltriton.contract.config import parse_config, repository_models
from pooltriton.contract.requests import text_array
from pooltriton.contract.stub import INSTANCE_ARG, SHM_ARG, STUB

log = logging.getLogger(__name__)

# A canary waits for at most one executing batch per stage: seconds for 128 long texts on 2 cores.
CANARY_INTERVAL_S, CANARY_DEADLINE_S = 10.0, 30.0
CANARY_PRIORITY = 1  # Triton's highest level (contract.PRIORITY_LEVELS)
# Status codes of a failed canary that mean a stage is wedged (Triton answers INTERNAL for a stub that
# stopped answering its health pings); anything else (overload, a reload under way) is not.
INTERNAL, DEADLINE_EXCEEDED = str(grpc.StatusCode.INTERNAL), str(grpc.StatusCode.DEADLINE_EXCEEDED)
INTERNAL_STRIKES = 3
# Process states of a stub that cannot answer: stopped, traced, zombie, dead (/proc/<pid>/stat).
_STUCK_STATES = frozenset("TtZXx")
_STOPPED_STATES = frozenset("Tt")
RETIRE_GRACE_S = 30.0

def process_state(pid: int) -> str:
    """The kernel's one-letter state of a process (R, S, D, T, Z, ...); X when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "X"
    return stat[stat.rindex(")") + 2]


def instance_model(instance: str) -> str:
    """`minilm_encoder_0_1` (model, instance group, instance) -> `minilm_encoder`."""
    return instance.rsplit("_", 2)[0]


def server_stubs(shm_prefix: str) -> dict[int, str]:
    """The Python stubs of the server with this shared-memory prefix, pid -> instance name (a pid, not a
    name, is unique: the stubs of an unloaded model that Triton still holds share their replacements' names)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if len(argv) > INSTANCE_ARG and argv[0].endswith(STUB) and shm_prefix in argv[SHM_ARG]:
            found[int(entry.name)] = argv[INSTANCE_ARG]
    return found


class Supervisor:
    def __init__(self, server, interval_s: float = 1.0, canary_interval_s: float = CANARY_INTERVAL_S,
                 canary_deadline_s: float = CANARY_DEADLINE_S, retire_grace_s: float = RETIRE_GRACE_S) -> None:
        self.server = server
        self.interval_s = interval_s
        self.retire_grace_s = retire_grace_s
        self.retiring: dict[int, float] = {}  # pid of a replaced stub still alive -> when it is killed
        self.retired: list[str] = []  # instances of unloaded models whose stub had to be killed
        self.canary_interval_s, self.canary_deadline_s = canary_interval_s, canary_deadline_s
        self.expected: dict[str, int] = {}  # instance name -> pid
        self.healed: list[tuple[str, float]] = []  # (model, seconds to recover)
        self.wedged: list[str] = []  # ensembles whose canary missed its deadline
        self.strikes: dict[str, int] = {}  # ensemble -> INTERNAL canaries in a row with no stuck stub
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def stubs(self, alive: dict[int, str] | None = None) -> dict[str, int]:
        """This server's Python stubs, instance name -> pid (a retiring stub of an unloaded model, which
        has the same instance name as its replacement, is not one of them). `alive`: a scan already made."""
        alive = server_stubs(self.server.shm_prefix) if alive is None else alive
        return {instance: pid for pid, instance in alive.items() if pid not in self.retiring}

    def start(self) -> Supervisor:
        self.expected = self.stubs()
        self._threads = [threading.Thread(target=self._run, name="pooltriton-supervisor", daemon=True)]
        if self.canary_interval_s > 0:
            self._threads.append(threading.Thread(target=self._canaries, name="pooltriton-canary", daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.canary_deadline_s + 5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except (OSError, http.client.HTTPException, InferenceServerException) as error:  # stopping: next tick
                log.warning("supervisor: %s", error)

    def check(self) -> list[str]:
        """Reload every model one of whose stubs died since the last check; returns those models."""
        alive = server_stubs(self.server.shm_prefix)
        self.retire(alive)
        current = self.stubs(alive)
        dead = sorted({instance_model(i) for i, pid in self.expected.items() if current.get(i) != pid})
        for model in dead:
            started = time.monotonic()
            log.warning("supervisor: a stub of %s died; reloading it", model)
            self.retiring |= {pid: started + self.retire_grace_s for i, pid in current.items()
                              if instance_model(i) == model}
            self.server.unload(model)
            self.server.load(model)
            self.healed.append((model, time.monotonic() - started))
            log.info("supervisor: %s is back (%.1f s)", model, time.monotonic() - started)
        if dead:
            current = self.stubs()
        # A reloaded model's instances as they are now; one already gone again (it died during the
        # reload) stays expected with no pid, so the next check reloads it once more.
        reloaded = {i for i in (*self.expected, *current) if instance_model(i) in dead}
        self.expected = {**{i: p for i, p in self.expected.items() if instance_model(i) not in dead},
                         **{i: current.get(i, 0) for i in reloaded}}
        return dead

    def retire(self, alive: dict[int, str]) -> list[str]:
        """Kill the replaced stubs still alive (`alive`: this server's stubs now) past their grace (their
        model was leaked, see above); returns their instances. A killed stub stays retiring until no
        scan lists it: it bears its live replacement's instance name, and a scan made before it was reaped
        would otherwise let it stand for that instance, a death that reloads a healthy model."""
        now = time.monotonic()
        killed = []
        for pid, deadline in list(self.retiring.items()):
            if pid not in alive:  # exited (a zombie has no command line)
                del self.retiring[pid]
            elif now >= deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(alive[pid])
                self.retiring[pid] = math.inf
        if killed:
            log.warning("supervisor: %s outlived the unload of its model (Triton kept the model whose stub died "
                        "mid-request); killed", ", ".join(sorted(killed)))
            self.retired += killed
        return killed

    @functools.cached_property
    def ensembles(self) -> dict[str, list[str]]:
        """The repository's ensembles -> the stages they run (read once: reloads use the same files)."""
        found = {}
        for name in repository_models(self.server.repository):
            config = parse_config(self.server.repository / name / "config.pbtxt")
            if config.platform == "ensemble":
                found[config.name] = [step.model_name for step in config.ensemble_scheduling.step]
        return found

    def canary(self, model: str) -> dict[str, int]:
        """Nothing when a one-text inference of `model` answered (or was refused for overload or a reload)
        and none of its stages' stubs is stopped; else the stubs to restart, as they were when the canary
        was sent (a stub the watch has replaced since is not touched): those stopped before and after the
        canary whatever it met (under load a canary lands on a free instance, and a stopped one among
        several fails each request fast, so it is free only for moments); on INTERNAL those of the
        ensemble's stages the kernel shows cannot run, or after INTERNAL_STRIKES such canaries with none,
        every stage's; past the deadline every stage's."""
        import tritonclient.grpc as grpcclient

        sent_to = self.stubs()
        steps = self.ensembles.get(model, [])
        stages = {i: pid for i, pid in sent_to.items() if instance_model(i) in steps}
        stopped = {i for i, pid in stages.items() if process_state(pid) in _STOPPED_STATES}
        inputs = [grpcclient.InferInput(TEXT, [1, 1], "BYTES")]
        inputs[0].set_data_from_numpy(text_array(["canary"], batched=True))
        status = None
        with grpcclient.InferenceServerClient(self.server.grpc_url) as client:
            try:
                client.infer(model, inputs, priority=CANARY_PRIORITY, client_timeout=self.canary_deadline_s)
            except InferenceServerException as error:
                status = error.status()
        if any(i not in sent_to for i in self.expected if instance_model(i) in steps):
            self.strikes.pop(model, None)
            return {}  # a stage's stub died: the watch reloads it, its failing canaries are no wedge
        stuck = {i: pid for i, pid in stages.items() if process_state(pid) in _STUCK_STATES}
        if status not in (INTERNAL, DEADLINE_EXCEEDED):
            self.strikes.pop(model, None)
            return {i: pid for i, pid in stuck.items() if i in stopped}
        if stuck or status == DEADLINE_EXCEEDED:
            self.strikes.pop(model, None)
            return stuck or stages
        self.strikes[model] = self.strikes.get(model, 0) + 1
        if self.strikes[model] < INTERNAL_STRIKES:
            return {}
        self.strikes.pop(model, None)
        return stages

    def check_canaries(self, only: set[str] | None = None) -> list[str]:
        """Kill the stubs a failed canary points at (the watch above then reloads their models); returns
        the ensembles where a live stub was killed. `only`: these ensembles (default: all)."""
        wedged = []
        for model in self.ensembles:
            if only is not None and model not in only:
                continue
            killed = []
            for instance, pid in ({} if self._stop.is_set() else self.canary(model)).items():
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(instance)
                except ProcessLookupError:
                    pass  # already dead: the watch has it
            if killed:
                log.warning("supervisor: %s is wedged (its canary failed, deadline %g s, or a stub is stopped); "
                            "restarted %s", model, self.canary_deadline_s, ", ".join(sorted(killed)))
                wedged.append(model)
        self.wedged += wedged
        return wedged

    def _canaries(self) -> None:
        while not self._stop.wait(self.canary_interval_s):
            try:
                self.check_canaries()
            except Exception as error:  # the server is stopping: try again next round
                log.warning("supervisor canary: %s", error)
