"""Self-healing under load: kill a stage's stub by PID (tokenizer, encoder, scorer); readiness
goes false, the supervisor brings the stage back without manual action, answers are exact again, and
every request sent meanwhile got an answer or a definite error. Bounded in count and time."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from pooltriton.client import PoolingClient
from pooltriton.server.supervisor import Supervisor, instance_model, server_stubs

from conftest import REPOSITORY, start_server, stop_without_exit_timeout

RECOVERY_BOUND_S = 30  # readiness back and exact answers within this, per fault
WEDGE_DEADLINE_S = 3.0  # the canary's deadline here (an idle server answers one text in milliseconds)
RETIRE_GRACE_S = 10.0  # an unloaded tokenizer's stubs exit within ~2 s here
QUERY, DOCUMENTS = "A man is eating food.", ["A man is eating a piece of bread.", "A monkey plays drums."]


@pytest.fixture(scope="module")
def supervised(tmp_path_factory: pytest.TempPathFactory):
    server = start_server(REPOSITORY, tmp_path_factory.mktemp("faults") / "server.log")
    supervisor = Supervisor(server, interval_s=0.5, canary_interval_s=1.0, canary_deadline_s=WEDGE_DEADLINE_S,
                            retire_grace_s=RETIRE_GRACE_S).start()
    yield server, supervisor
    supervisor.stop()
    server.stop()


# (minilm has no pooler stage: its encoder normalises. A pooler is a Python stub like the tokenizer.)
@pytest.mark.parametrize("stage", ["minilm_tokenizer", "minilm_encoder", "minilm_score"])
def test_a_killed_stage_comes_back_by_itself(supervised, minilm_st, stage: str) -> None:
    server, supervisor = supervised
    texts = ["one text to embed", "and a second one"]
    expected = minilm_st.encode(texts, normalize_embeddings=True)
    expected_scores = minilm_st.encode(DOCUMENTS, normalize_embeddings=True) @ minilm_st.encode(
        QUERY, normalize_embeddings=True)
    outcomes: list[str] = []
    stop = threading.Event()

    def load() -> None:  # a steady trickle of requests while the stage dies and comes back
        with PoolingClient(server.grpc_url, protocol="grpc", retries=1) as client:
            while not stop.is_set():
                try:
                    if stage.endswith("score"):
                        ok = np.abs(client.score(QUERY, DOCUMENTS) - expected_scores).max() <= 1e-5
                    else:
                        ok = np.abs(client.embed(texts) - expected).max() <= 1e-5
                    outcomes.append("exact" if ok else "WRONG")
                except Exception as error:  # a definite error, with a status
                    outcomes.append(f"error {getattr(error, 'status', lambda: '?')()}")
                time.sleep(0.05)

    worker = threading.Thread(target=load)
    worker.start()
    try:
        time.sleep(1)
        victim = next(pid for instance, pid in supervisor.stubs().items() if instance_model(instance) == stage)
        healed_before = len(supervisor.healed)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        went_unready = None
        while time.monotonic() - killed < RECOVERY_BOUND_S:
            if went_unready is None and not server.ready():
                went_unready = time.monotonic() - killed
            if len(supervisor.healed) > healed_before and server.ready():
                break
            time.sleep(0.1)
        recovered = time.monotonic() - killed
        time.sleep(2)  # answers after the recovery
    finally:
        stop.set()
        worker.join(60)
    assert supervisor.healed[-1][0] == stage and recovered < RECOVERY_BOUND_S
    assert went_unready is not None, "readiness never went false while the stage was down"
    assert "WRONG" not in outcomes and outcomes[-1] == "exact", outcomes[-10:]
    print(f"\n{stage}: not ready after {went_unready:.1f} s, back after {recovered:.1f} s; "
          f"{outcomes.count('exact')} exact answers, {len(outcomes) - outcomes.count('exact')} definite errors")
    assert server.process.poll() is None


def test_a_wedged_stage_is_found_by_the_canary_and_restarted(supervised, minilm_st) -> None:
    """The encoder's stub stopped (SIGSTOP: alive, never answering): the canary misses its deadline,
    the supervisor restarts minilm's stages, and exact answers come back without manual action."""
    server, supervisor = supervised
    texts = ["one text to embed", "and a second one"]
    victim = next(pid for instance, pid in supervisor.stubs().items() if instance_model(instance) == "minilm_encoder")
    healed_before, wedged_before = len(supervisor.healed), len(supervisor.wedged)
    os.kill(victim, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        while time.monotonic() - stopped < RECOVERY_BOUND_S:
            if len(supervisor.healed) > healed_before and server.ready() and victim not in supervisor.stubs().values():
                break
            time.sleep(0.2)
        recovered = time.monotonic() - stopped
    finally:
        try:
            os.kill(victim, signal.SIGKILL)  # never leave a stopped stub behind
        except ProcessLookupError:
            pass
    assert supervisor.wedged[wedged_before:] == ["minilm"], supervisor.wedged
    assert "minilm_encoder" in [model for model, _ in supervisor.healed[healed_before:]]
    assert recovered < RECOVERY_BOUND_S
    with PoolingClient(server.grpc_url, protocol="grpc") as client:
        np.testing.assert_allclose(client.embed(texts), minilm_st.encode(texts, normalize_embeddings=True), atol=1e-5)
    print(f"\nwedged encoder: found and back after {recovered:.1f} s (canary deadline {WEDGE_DEADLINE_S:g} s)")


def test_a_canary_past_its_deadline_restarts_every_stage_of_its_ensemble(supervised, minilm_st) -> None:
    """The deadline branch: a canary that cannot make its deadline (here 1 ms: no inference can) counts
    as a wedge of the whole ensemble, whose stages are all restarted and answer exactly again."""
    server, supervisor = supervised
    impatient = Supervisor(server, canary_interval_s=0, canary_deadline_s=0.001)
    steps = impatient.ensembles["minilm"]
    before = {i: pid for i, pid in impatient.stubs().items() if instance_model(i) in steps}
    healed_before = len(supervisor.healed)
    assert impatient.check_canaries(only={"minilm"}) == ["minilm"]
    started = time.monotonic()
    while time.monotonic() - started < RECOVERY_BOUND_S:
        if {m for m, _ in supervisor.healed[healed_before:]} >= set(steps) and server.ready():
            break
        time.sleep(0.2)
    assert {m for m, _ in supervisor.healed[healed_before:]} >= set(steps), supervisor.healed
    after = {i: pid for i, pid in impatient.stubs().items() if instance_model(i) in steps}
    assert set(after) == set(before) and not set(after.values()) & set(before.values())  # all new processes
    texts = ["one text to embed", "and a second one"]
    with PoolingClient(server.grpc_url, protocol="grpc") as client:
        np.testing.assert_allclose(client.embed(texts), minilm_st.encode(texts, normalize_embeddings=True), atol=1e-5)


def test_a_stub_that_dies_mid_request_leaves_nothing_behind_and_the_server_still_stops(supervised, minilm_st) -> None:
    """One of the tokenizer's two stubs stops while requests reach it: Triton 2.51 then keeps the old model
    (its Python backend leaks the request's response factory), so after the reload its other stub lives
    on and Triton's own stop would wait out its exit timeout and exit 1 with orphaned stubs. The
    supervisor retires that stub, and the launcher's stop (drain, unload everything, SIGTERM) finishes
    without waiting out Triton's exit timeout, leaving no stub, no crash and no shared memory. Last in
    this module: it stops the module's server."""
    server, supervisor = supervised
    texts = ["one text to embed", "and a second one"]
    expected = minilm_st.encode(texts, normalize_embeddings=True)
    old = {pid for pid, instance in server_stubs(server.shm_prefix).items()
           if instance_model(instance) == "minilm_tokenizer"}
    victim = supervisor.stubs()["minilm_tokenizer_0_0"]
    healed_before = len(supervisor.healed)
    outcomes: list[str] = []
    stop = threading.Event()

    def load() -> None:  # requests to both tokenizer instances until the stopped one is found
        with PoolingClient(server.grpc_url, protocol="grpc", retries=0) as client:
            while not stop.is_set():
                try:
                    outcomes.append("exact" if np.abs(client.embed(texts) - expected).max() <= 1e-5 else "WRONG")
                except Exception as error:  # a definite error, with a status
                    outcomes.append(f"error {getattr(error, 'status', lambda: '?')()}")

    os.kill(victim, signal.SIGSTOP)
    workers = [threading.Thread(target=load) for _ in range(4)]
    for worker in workers:
        worker.start()
    started = time.monotonic()
    try:
        while time.monotonic() - started < RECOVERY_BOUND_S + RETIRE_GRACE_S:
            if len(supervisor.healed) > healed_before and not old & set(server_stubs(server.shm_prefix)):
                break
            time.sleep(0.2)
        # Healed: the clients' next answers are exact (the reloaded stage may take a moment to serve).
        healed_at, waited = len(outcomes), time.monotonic()
        while "exact" not in outcomes[healed_at:] and time.monotonic() - waited < RECOVERY_BOUND_S:
            time.sleep(0.2)
    finally:
        stop.set()
        for worker in workers:
            worker.join(60)
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert "minilm_tokenizer" in [model for model, _ in supervisor.healed[healed_before:]], supervisor.healed
    assert not old & set(server_stubs(server.shm_prefix)), "a stub of the unloaded tokenizer is still alive"
    assert "WRONG" not in outcomes and "exact" in outcomes[healed_at:], outcomes[-10:]
    print(f"\nstopped tokenizer stub: retired {supervisor.retired}; {outcomes.count('exact')} exact answers, "
          f"{len(outcomes) - outcomes.count('exact')} definite errors")

    supervisor.stop()
    stop_without_exit_timeout(server, "after the faults")
