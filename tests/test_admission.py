"""Admission by work: the pure policy on a clock the test drives, the gateway's 429 with
Retry-After when a request cannot start within its deadline (a fake transport, no server), and the
tokenizer stage's board (test_overload has both against a real server)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from fastapi.testclient import TestClient
from gateway_fake import FakeClient

from pooltriton.backends.workboard import (
    BACKLOG,
    BUSY,
    IN_TRANSIT_S,
    OWNER,
    SLOTS,
    STALL_S,
    STALLED,
    TOTAL,
    WINDOW_S,
    EncoderRow,
    TokenizerRow,
    board_path,
    stub_argv,
)
from pooltriton.contract.admission import (
    DEADLINE_SHARE,
    MIN_ANSWERS,
    SHORT_RESERVE,
    SHORT_TOKENS,
    Admission,
    Admitted,
    Refusal,
    retry_after_in,
    retry_phrase,
)
from pooltriton.gateway import create_app


def admitted(result: Admitted | Refusal) -> Admitted:
    assert isinstance(result, Admitted), result
    return result


def measured(deadline_s: float, share: float = 1.0) -> Admission:
    """An admission that has seen 1,000 tokens answered over one second with two requests in flight:
    1,000 tokens/s (the whole deadline admitted unless `share` says otherwise, so the arithmetic below
    is the deadline's)."""
    admission = Admission(deadline_s, share)
    for i in range(10):  # two requests of 50 tokens in flight together for 0.1 s, answered together
        pair = [admitted(admission.admit(50, now=i * 0.1)) for _ in range(2)]
        for ticket in pair:
            admission.done(ticket, 50, 200, now=(i + 1) * 0.1)
    assert admission.tokens_per_s == pytest.approx(1000, rel=0.01)
    return admission


def test_admission_keeps_headroom_below_the_deadline_for_its_own_estimate() -> None:
    """By default only DEADLINE_SHARE of the deadline is admitted: the measured rate is an estimate."""
    admission = measured(deadline_s=2.0, share=DEADLINE_SHARE)
    assert admission.budget_s == pytest.approx(2.0 * DEADLINE_SHARE) and DEADLINE_SHARE < 1
    for _ in range(15):  # 1,500 tokens in flight: a 100-token request would be answered after 1.6 s
        admitted(admission.admit(100, now=1.0))
    admitted(admission.admit(90, now=1.0))  # 1.59 s: within the budget, 80 % of the 2 s deadline
    refusal = admission.admit(100, now=1.0)  # 1.69 s: within the deadline but past the budget
    assert isinstance(refusal, Refusal)
    assert refusal.wait_s == pytest.approx(1.69, rel=0.01) and refusal.retry_after_s == 1
    assert Admission(2.0).budget_s == pytest.approx(2.0 * DEADLINE_SHARE)  # the default


def test_admission_refuses_when_the_estimated_wait_exceeds_the_deadline() -> None:
    admission = measured(deadline_s=2.0)
    held = [admitted(admission.admit(100, now=1.0)) for _ in range(19)]  # 1,900 tokens: the next after 2.0 s
    assert isinstance(admission.admit(200, now=1.0), Refusal)  # 2.1 s with its own work: over the deadline
    admitted(admission.admit(90, now=1.0))  # 1.99 s: it fits
    refusal = admission.admit(1010, now=1.0)  # 1,990 ahead + its own 1,010 tokens: 3.0 s
    assert isinstance(refusal, Refusal) and refusal.wait_s == pytest.approx(3.0, rel=0.01)
    # A long request leaves SHORT_RESERVE of the budget to short ones: 1.5 s over its 1.5 s, rounded up.
    assert refusal.retry_after_s == 2
    # The refused request holds nothing; the queue drains as answers come back and it fits again.
    assert admission.queued_tokens == pytest.approx(1990)
    for ticket in held:
        admission.done(ticket, 100, 400, now=2.0)
    admitted(admission.admit(1010, now=2.0))
    # A request longer than the deadline on its own still runs when nothing else is in flight.
    lone = measured(deadline_s=2.0)
    admitted(lone.admit(10**5, now=1.0))


def test_admission_admits_anything_before_it_has_measured_and_when_nothing_is_queued() -> None:
    fresh = Admission(deadline_s=0.001)
    admitted(fresh.admit(10**6, now=0.0))  # no rate yet: nothing to estimate with
    # A few answers are not evidence of what the server clears in batches: a burst behind them is
    # admitted until enough answers measured the rate.
    thin = Admission(deadline_s=1.0)
    first, second = admitted(thin.admit(10, now=0.0)), admitted(thin.admit(10, now=0.0))
    thin.done(first, 10, 40, now=0.01)  # 1,000 tokens/s, with the other in flight
    thin.done(second, 10, 40, now=0.01)
    assert thin.tokens_per_s is not None
    admitted(thin.admit(10, now=0.02))
    admitted(thin.admit(10**5, now=0.02))
    admitted(thin.admit(10, now=0.02))  # 100 s "ahead" by two answers' rate: still admitted
    idle = measured(deadline_s=0.5)
    admitted(idle.admit(10**6, now=2.0))  # alone, however long: it waits for nothing


def test_one_request_at_a_time_is_no_evidence_of_what_the_server_clears() -> None:
    """Answers with nothing else in flight measure a request's latency: 40 short texts one after the
    other (a gateway's idle traffic) put the rate at ~3.8 x too slow, and the next burst was refused
    though it fitted. They leave the rate unmeasured, so a burst behind them is admitted."""
    admission = Admission(deadline_s=1.0)
    for i in range(40):
        admission.done(admitted(admission.admit(10, now=i * 0.01)), 10, 40, now=i * 0.01 + 0.005)
    assert admission.tokens_per_s is None
    assert all(isinstance(admission.admit(5000, now=1.0), Admitted) for _ in range(3))  # 15 s by that latency
    assert admission.estimate_tokens(400, 1) == pytest.approx(102)  # its characters still tell its tokens


def test_an_answer_counts_by_its_share_of_time_beside_others() -> None:
    """A request that ran alone for 0.9 s and beside another for its last 0.1 s: counted whole, its
    1,000 tokens over 0.1 s busy would put the rate at 10,000 tokens/s, ten times what the server
    cleared; by its share it is 1,000 (and the other's 100 tokens over its 0.2 s count half: 50)."""
    admission = Admission(deadline_s=1.0)
    long = admitted(admission.admit(1000, now=0.0))
    short = admitted(admission.admit(100, now=0.9))
    admission.done(long, 1000, 4000, now=1.0)
    assert admission.tokens_per_s == pytest.approx(1000)
    admission.done(short, 100, 400, now=1.1)
    assert admission.tokens_per_s == pytest.approx((1000 * 0.1 + 100 * 0.5) / 0.1, rel=0.01)  # 1,500: its half


def test_tokens_are_estimated_by_the_characters_the_answers_showed() -> None:
    assert Admission(1.0).estimate_tokens(400, 1) == pytest.approx(102)  # 4 characters a token before answers
    admission = measured(deadline_s=1.0)  # answers showed 4,000 characters for 1,000 tokens
    assert admission.estimate_tokens(800, 2) == pytest.approx(204)


def test_the_gateway_refuses_at_once_with_429_and_retry_after_from_the_estimate() -> None:
    fake = FakeClient()
    with TestClient(create_app("unused:0", client=fake, deadline_s=1.0)) as http:
        assert http.post("/v1/embeddings", json={"model": "emb", "input": ["one two three"]}).status_code == 200
        admission = http.app.state.pooling_service._admission["emb"]
        past = time.monotonic() - 1
        for i in range(10):  # answers with another request in flight: the rate it measures (8 at least)
            pair = [admitted(admission.admit(5, now=past + i * 0.01)) for _ in range(2)]
            for ticket in pair:
                admission.done(ticket, 5, 13, now=past + (i + 1) * 0.01)
        rate = admission.tokens_per_s
        assert rate is not None
        # Work worth 2.5 deadlines in flight from this front (as if other requests held it):
        held = admitted(admission.admit(2.5 * rate, now=time.monotonic()))
        sent = len(fake.requests)
        answer = http.post("/v1/embeddings", json={"model": "emb", "input": ["one more text"]})
        assert answer.status_code == 429 and answer.json()["error"]["type"] == "rate_limit_error"
        assert int(answer.headers["Retry-After"]) == 2  # 2.5 s of wait against a 1 s deadline: 1.5 s over
        assert "deadline" in answer.json()["error"]["message"]
        assert len(fake.requests) == sent  # refused before anything was sent
        admission.done(held, None, 0, now=time.monotonic())
        assert http.post("/v1/embeddings", json={"model": "emb", "input": ["one more text"]}).status_code == 200


def test_usage_moves_the_rate() -> None:
    admission = measured(2.0)
    before = admission.tokens_per_s
    first, _ = admitted(admission.admit(100, now=1.2)), admitted(admission.admit(100, now=1.2))
    admission.done(first, 1000, 4000, now=1.3)  # an answer of 1,000 tokens in 0.1 s, the other in flight
    assert admission.tokens_per_s > before
    assert np.isfinite(admission.tokens_per_s)


# The same rule inside Triton (backends.workboard): the tokenizer stage admits by the tokens queued for
# its encoder and the rate the encoder measured; both sides here, on a board in a temporary file.


def encoder_at_1000_tokens_per_s(path, batches: int = MIN_ANSWERS) -> EncoderRow:
    encoder = EncoderRow(path)
    for _ in range(int(batches)):
        encoder.started(time.monotonic())
        encoder.finished(100, 0.1, now=time.monotonic())
    return encoder


def busy_board(tmp_path) -> tuple[EncoderRow, TokenizerRow, float]:
    """A board whose encoder runs at 1,000 tokens/s and is busy from `now` on, and a tokenizer admitting
    2.0 s of work (a 2.5 s deadline)."""
    encoder = encoder_at_1000_tokens_per_s(tmp_path / "board")
    tokenizer = TokenizerRow(tmp_path / "board", deadline_s=2.5)
    now = time.monotonic()
    encoder.started(now)
    return encoder, tokenizer, now


def test_the_tokenizer_stage_refuses_work_its_encoder_cannot_clear_within_the_queue_timeout(tmp_path) -> None:
    path = tmp_path / "board"
    encoder = encoder_at_1000_tokens_per_s(path)
    tokenizer = TokenizerRow(path, deadline_s=2.5)  # admits 2.0 s of work (DEADLINE_SHARE)
    assert tokenizer.tokens_per_s() == pytest.approx(1000)
    encoder.started(time.monotonic())  # busy with a batch, the rest queued behind it
    assert tokenizer.admit(1500) is None  # nothing queued: admitted, however long
    assert tokenizer.admit(400) is None  # 1.9 s
    refusal = tokenizer.admit(200)  # 2.1 s
    assert refusal is not None and refusal.wait_s == pytest.approx(2.1) and refusal.retry_after_s == 1
    assert retry_after_in(f"overloaded ...; {retry_phrase(refusal)}") == 1
    assert tokenizer.queued(time.monotonic()) == pytest.approx(1900)  # the refused request holds nothing
    encoder.finished(1500, 1.5, now=time.monotonic())  # the encoder clears the first request
    encoder.started(time.monotonic())
    assert tokenizer.admit(200) is None  # 0.6 s
    for row in (tokenizer, encoder):
        row.close()


def test_a_flood_of_long_requests_leaves_room_for_short_ones(tmp_path) -> None:
    """Admission by each request's own cost: long requests stop at (1 - SHORT_RESERVE) of the budget, so a
    short query arriving while they hold the queue is still admitted, on the board and at the gateway; a
    flood of short ones alone may fill the whole budget. Fails if every request had the same limit."""
    encoder, tokenizer, now = busy_board(tmp_path)  # 1,000 tokens/s, a 2.0 s budget
    long = SHORT_TOKENS + 88  # 600 tokens: 0.6 s each
    floods = [tokenizer.admit(long, now=now) for _ in range(5)]
    assert floods[:2] == [None, None] and all(isinstance(r, Refusal) for r in floods[2:])  # 1.2 s, not 1.8
    assert tokenizer.queued(now) == pytest.approx(2 * long)
    shorts = [tokenizer.admit(90, now=now) for _ in range(9)]  # up to the full 2.0 s: 8 of them fit
    assert shorts[:8] == [None] * 8 and isinstance(shorts[8], Refusal)
    encoder.close()
    tokenizer.close()
    gateway = measured(deadline_s=2.0)  # 1,000 tokens/s, the whole 2.0 s admitted
    held = [gateway.admit(long, now=1.0) for _ in range(4)]
    assert [isinstance(r, Admitted) for r in held] == [True, True, False, False]
    assert (1 - SHORT_RESERVE) * 2.0 < 3 * long / 1000
    assert all(isinstance(gateway.admit(100, now=1.0), Admitted) for _ in range(8))


def test_work_dropped_between_the_stages_is_forgotten_when_the_encoder_idles(tmp_path) -> None:
    """A request Triton drops before the encoder (full queue, cancellation, queue timeout) is never finished:
    while the encoder works it counts as queued, once the encoder has idled past a batcher stall it is
    forgotten; before that an idle encoder still takes one request."""
    path = tmp_path / "board"
    encoder = encoder_at_1000_tokens_per_s(path)
    tokenizer = TokenizerRow(path, deadline_s=2.5)  # admits 2.0 s of work
    now = time.monotonic()
    encoder.started(now)
    assert tokenizer.admit(1000, now=now) is None and tokenizer.admit(500, now=now) is None
    encoder.finished(1000, 1.0, now=now + 1)  # the 500 tokens never arrive
    assert tokenizer.queued(now + 1) == pytest.approx(500)  # the encoder just finished: they may be in transit
    assert tokenizer.queued(now + 1.1) == pytest.approx(500)  # or in a queue Triton's batcher has not served
    assert tokenizer.admit(2000, now=now + 1.1) is None  # yet an idle encoder takes one request, however long
    assert tokenizer.admit(100, now=now + 1.1) is not None  # and only one: it is on its way
    encoder.started(now + 1.11)
    assert tokenizer.queued(now + 2) == pytest.approx(2500)  # busy: the dropped work still counts
    encoder.finished(2000, 2.0, now=now + 3.11)
    assert tokenizer.queued(now + 3.11 + STALL_S + 0.01) == 0  # idle past a stall: nothing is queued
    encoder.started(now + 4)
    assert tokenizer.admit(1800, now=now + 4) is None
    assert tokenizer.queued(now + 4) == pytest.approx(1800)  # counted from there on
    for row in (tokenizer, encoder):
        row.close()


def test_work_not_started_within_its_timeout_is_forgotten_while_the_encoder_works(tmp_path) -> None:
    """Each admitted request goes on the tokenizers' log with the moment its timeout (its own, else the
    queue's) drops it from the encoder's queue; the encoder takes what it starts off the log. What is
    still there past that moment never started: forgotten, though the encoder never idles (under steady
    load it did not, and dropped work kept everyone refused)."""
    encoder, tokenizer, now = busy_board(tmp_path)
    assert tokenizer.admit(800, now=now, timeout_s=0.2) is None  # nothing queued: admitted
    assert tokenizer.admit(650, now=now) is None  # the queue's timeout: 2.5 s; 1.45 s of 1.5 s for a long one
    assert tokenizer.admit(600, now=now) is not None  # 2.05 s
    assert tokenizer.queued(now + 0.2) == pytest.approx(1450)  # its timeout, and the hop: maybe still queued
    assert tokenizer.queued(now + 0.3) == pytest.approx(650)  # past them, never started: dropped
    assert tokenizer.admit(600, now=now + 0.3) is None  # 1.25 s
    encoder.finished(0, 0.4, now=now + 0.4)
    encoder.started(now + 0.4)
    encoder.took([650, 600])  # what it starts leaves the log ...
    assert tokenizer.queued(now + 3) == pytest.approx(1250)  # ... and counts until it is finished
    encoder.finished(1250, 1.25, now=now + 3.1)
    assert tokenizer.queued(now + 3.1) == 0
    for row in (tokenizer, encoder):
        row.close()


def test_requests_leave_the_log_by_their_tokens_and_what_has_no_entry_counts_while_it_runs(tmp_path) -> None:
    encoder, tokenizer, now = busy_board(tmp_path)
    assert tokenizer.admit_all([300, 300, 200], now=now, timeouts_s=[0.2, None, 0.2]) == [None] * 3
    encoder.finished(0, 0.1, now=now + 0.1)
    encoder.started(now + 0.1)
    encoder.took([300, 999], [0.2, None])  # the 300 of that timeout; 999: a direct call, no entry
    assert sorted(encoder.log[encoder.log[:, 0] > 0, 0]) == [200, 300]
    assert tokenizer.queued(now + 1) == pytest.approx(300 + 999 + 300)  # both running, a 300 queued; 200 dropped
    encoder.finished(1299, 1.3, now=now + 1.4)
    assert tokenizer.queued(now + 1.4) == pytest.approx(300)  # the direct call was neutral
    assert tokenizer.admit_all([300, 50], now=now + 1.4) == [None, None]
    encoder.started(now + 1.5)
    encoder.took([300, 300, 300, 50])  # both 300s on the log and the 50; the third has none: it counts
    assert not encoder.log[:, 0].any()
    assert tokenizer.queued(now + 1.6) == pytest.approx(950)
    encoder.finished(950, 1.0, now=now + 2.5)
    assert tokenizer.queued(now + 2.5) == 0
    for row in (tokenizer, encoder):
        row.close()


def test_of_equal_tokens_the_entry_of_the_same_own_timeout_leaves(tmp_path) -> None:
    """The encoder sees each request's own timeout too: of two requests of equal tokens, the one that
    started leaves the log, not the other (a request still queued would have been forgotten with the
    short timeout of one that ran, or one dropped counted for the long timeout of one that ran)."""
    encoder, tokenizer, now = busy_board(tmp_path)
    assert tokenizer.admit(400, now=now) is None  # the queue's timeout: on the log until now + 2.55
    assert tokenizer.admit(400, now=now + 0.1, timeout_s=0.2) is None  # until now + 0.35
    encoder.finished(0, 0.2, now=now + 0.2)
    encoder.started(now + 0.2)
    encoder.took([400], [0.2])  # the later one, overtaking (priority)
    assert tokenizer.queued(now + 1) == pytest.approx(800)  # it runs, the first waits
    encoder.finished(400, 0.4, now=now + 1.5)
    encoder.started(now + 1.5)  # busy: no idle rule
    assert tokenizer.queued(now + 1.6) == pytest.approx(400)
    assert tokenizer.queued(now + 2.6) == 0  # the queue's timeout passed: it was dropped
    for row in (tokenizer, encoder):
        row.close()


def test_a_request_that_starts_after_its_entry_expired_counts_until_it_finishes(tmp_path) -> None:
    encoder, tokenizer, now = busy_board(tmp_path)
    assert tokenizer.admit(400, now=now, timeout_s=0.2) is None
    assert tokenizer.queued(now + 0.3) == 0  # forgotten: past its timeout and the hop
    encoder.finished(0, 0.3, now=now + 0.3)
    encoder.started(now + 0.3)
    encoder.took([400], [0.2])  # Triton had taken it just in time
    assert tokenizer.queued(now + 0.4) == pytest.approx(400)
    encoder.finished(400, 0.4, now=now + 0.7)
    assert tokenizer.queued(now + 0.7) == 0  # not below nothing: counted once
    for row in (tokenizer, encoder):
        row.close()


def test_the_tokenizer_stage_admits_everything_before_its_encoder_measured_a_rate(tmp_path) -> None:
    path = tmp_path / "board"
    encoder = encoder_at_1000_tokens_per_s(path, batches=MIN_ANSWERS - 1)
    tokenizer = TokenizerRow(path, deadline_s=1.0)
    encoder.started(time.monotonic())
    assert tokenizer.tokens_per_s() is None
    assert all(tokenizer.admit(10**5) is None for _ in range(3))
    encoder.finished(100, 0.1, now=time.monotonic())  # the MIN_ANSWERS-th batch
    encoder.started(time.monotonic())
    assert tokenizer.admit(10) is not None
    for row in (tokenizer, encoder):
        row.close()


def test_an_encoder_that_timed_a_batch_at_load_lets_a_fresh_server_refuse_a_flood(tmp_path) -> None:
    """A flood that reaches a fresh server first is admitted by the rate the encoder timed at load
    (with a batcher stall, so it errs slow) rather than whole; the real batches then outweigh it."""
    path = tmp_path / "board"
    encoder, tokenizer = EncoderRow(path), TokenizerRow(path, deadline_s=10.0)
    now = time.monotonic()
    encoder.primed(8000, 1.0 - STALL_S)  # 8,000 tokens/s of work, a stall counted: 8,000 tokens/s
    assert tokenizer.tokens_per_s() == pytest.approx(8000)
    answers = tokenizer.admit_all([8000] * 20, now=now)  # 160,000 tokens: 20 s at that rate
    fits = int(10.0 * DEADLINE_SHARE * (1 - SHORT_RESERVE))  # long requests leave the short ones' reserve
    assert answers[:fits] == [None] * fits and all(answer is not None for answer in answers[fits:])
    unprimed = TokenizerRow(tmp_path / "cold", deadline_s=10.0)
    cold = EncoderRow(tmp_path / "cold")
    assert unprimed.admit_all([8000] * 20, now=now) == [None] * 20  # what it did before: everything
    for batch in range(40):  # a real rate, four times faster, takes over
        encoder.started(now + batch * 0.1)
        encoder.finished(3200, 0.1, now + batch * 0.1 + 0.1)
    assert 25000 < tokenizer.tokens_per_s() < 32000  # ~120,000 tokens (decayed) in ~4 s, the prior 1 s
    for row in (tokenizer, encoder, unprimed, cold):
        row.close()


def test_idle_minutes_of_tiny_batches_do_not_replace_the_rate_timed_at_load(tmp_path) -> None:
    """The supervisor's canary sends one short text every 10 s. Time alone decayed the measured rate, so
    on an idle server the canaries' rate (a single text's speed, per-call overhead and all) was all that
    was left, far below what a flood clears; the load's prior is not decayed by time."""
    path = tmp_path / "board"
    encoder, tokenizer = EncoderRow(path), TokenizerRow(path, deadline_s=10.0)
    encoder.primed(8000, 1.0 - STALL_S)
    now = time.monotonic()
    for canary in range(60):  # ten idle minutes: 5 tokens in 5 ms every 10 s (1,000 tokens/s)
        encoder.started(now + 10 * canary)
        encoder.finished(5, 0.005, now + 10 * canary + 0.005)
    assert tokenizer.tokens_per_s() == pytest.approx(8000, rel=0.05)
    for row in (tokenizer, encoder):
        row.close()


def test_a_dead_stage_instance_leaves_its_row_and_is_not_busy_for_ever(tmp_path) -> None:
    path = tmp_path / "board"
    encoder = encoder_at_1000_tokens_per_s(path)
    encoder.started(time.monotonic())
    encoder.row[OWNER] = 2**22 + 1  # above Linux's largest pid: the encoder was killed mid-batch
    restarted = EncoderRow(path)  # Triton restarts the stub: it takes the dead one's row and total
    assert restarted.row[TOTAL] == 100 * MIN_ANSWERS and restarted.rows[:, BUSY].sum() == 0
    tokenizer = TokenizerRow(path, deadline_s=1.0)
    assert tokenizer.tokens_per_s() is None  # the new encoder has measured nothing yet
    assert tokenizer.queued(time.monotonic() + 1) == 0
    tokenizer.close()
    assert path.exists()  # a stage reloaded alone leaves the board to the other
    restarted.close()
    assert not path.exists()  # the last one out (a server stopping) removes it


def test_a_full_board_refuses_one_more_instance_and_keeps_nothing_of_it(tmp_path) -> None:
    """Past SLOTS live instances the stage runs without admission (the tokenizer logs it): the refused
    instance leaves no map open and no row taken, and the board still goes with the last one out."""
    path = tmp_path / "board"
    rows = [EncoderRow(path) for _ in range(SLOTS)]
    with pytest.raises(OSError, match="rows are taken"):
        EncoderRow(path)
    assert (rows[0].rows[:, OWNER] != 0).sum() == SLOTS
    for row in rows:
        row.close()
    assert not path.exists()


def test_only_live_encoders_rate_and_a_wedged_encoder_is_not_hidden_behind_refusals(tmp_path) -> None:
    path = tmp_path / "board"
    tokenizer = TokenizerRow(path, deadline_s=2.5)
    left = encoder_at_1000_tokens_per_s(path)
    left.close()  # unloaded: its rate no longer counts
    encoder = EncoderRow(path)  # reloaded: the left row, its rate measured afresh
    assert encoder.row[TOTAL] == 100 * MIN_ANSWERS and tokenizer.tokens_per_s() is None
    for _ in range(int(MIN_ANSWERS)):
        encoder.started(time.monotonic())
        encoder.finished(200, 0.1, now=time.monotonic())
    assert tokenizer.tokens_per_s() == pytest.approx(2000)
    now = time.monotonic()
    encoder.started(now)
    assert tokenizer.admit(4000, now=now) is None and tokenizer.admit(1000, now=now) is not None
    # Busy with one batch for longer than the deadline: wedged (or far slower than measured). Refusing
    # would keep the supervisor's canary from seeing it; the queue timeout rejects what cannot run.
    assert tokenizer.admit(1000, now=now + 2.6) is None
    for row in (tokenizer, encoder):
        row.close()


def test_finished_work_the_tokenizer_never_admitted_does_not_hide_later_admissions(tmp_path) -> None:
    path = tmp_path / "board"
    encoder = encoder_at_1000_tokens_per_s(path)
    tokenizer = TokenizerRow(path, deadline_s=2.5)
    now = time.monotonic()
    encoder.started(now)
    encoder.finished(5000, 5.0, now=now)  # a direct call to the encoder, not through this tokenizer
    encoder.started(now)
    assert tokenizer.queued(now) == 0
    assert tokenizer.admit(1500, now=now) is None
    assert tokenizer.queued(now) == pytest.approx(1500)
    assert tokenizer.admit(1000, now=now) is not None
    for row in (tokenizer, encoder):
        row.close()


def test_the_board_is_named_after_the_servers_shared_memory_regions() -> None:
    argv = ["/opt/backends/python/triton_python_backend_stub", "model.py",
            "pooltriton1p8000_d5da761e-cfe7-4aeb-9769-cda56eaf08e1", "1", "1", "42"]
    assert str(board_path(argv, "minilm_encoder")) == "/dev/shm/pooltriton1p8000_work42_minilm_encoder"
    assert board_path(stub_argv(), "minilm_encoder") is None  # not a stub: this is pytest


def test_a_batch_of_requests_is_admitted_in_turn_with_one_read_of_the_board(tmp_path) -> None:
    path = tmp_path / "board"
    encoder = encoder_at_1000_tokens_per_s(path)
    tokenizer = TokenizerRow(path, deadline_s=2.5)  # admits 2.0 s of work
    now = time.monotonic()
    encoder.started(now)
    answers = tokenizer.admit_all([1500, 400, 200, 50], now=now)  # nothing queued: the first goes, however long
    assert [answer is None for answer in answers] == [True, True, False, True]
    assert answers[2].wait_s == pytest.approx(2.1)
    assert tokenizer.queued(now) == pytest.approx(1950)
    for row in (tokenizer, encoder):
        row.close()


def test_the_tokenizer_instances_of_one_encoder_admit_as_one(tmp_path) -> None:
    """Two instances of the tokenizer stage: each counts the other's admissions, and the work Triton dropped
    is forgotten for both, while what either sent in the last moments stays queued (in transit)."""
    path = tmp_path / "board"
    encoder = encoder_at_1000_tokens_per_s(path)
    first, second = TokenizerRow(path, deadline_s=2.5), TokenizerRow(path, deadline_s=2.5)  # 2.0 s each
    now = time.monotonic()
    encoder.started(now)
    assert first.admit(1500, now=now) is None
    assert second.queued(now) == pytest.approx(1500)
    refusal = second.admit(600, now=now)
    assert refusal is not None and refusal.wait_s == pytest.approx(2.1)
    assert second.admit(400, now=now) is None and first.queued(now) == pytest.approx(1900)
    encoder.finished(1500, 1.5, now=now + 1.5)  # the 400 tokens were dropped between the stages
    assert second.queued(now + 1.6) == pytest.approx(400)  # within a batcher stall: maybe still queued
    later = now + 1.5 + STALL_S + 0.01
    assert first.admit(300, now=later) is None  # idle past a stall: the dropped work forgotten
    assert second.queued(later + 0.001) == pytest.approx(300)  # for both; the new request in transit
    assert first.queued(later + IN_TRANSIT_S + WINDOW_S) == 0  # and then forgotten too: it never came
    for row in (first, second, encoder):
        row.close()
    assert not path.exists()


def test_the_rate_counts_the_batchers_stall_between_batches_that_left_requests_waiting(tmp_path) -> None:
    """Under a flood that refuses everyone, nothing arrives to wake Triton's batcher after a batch
    and queued requests wait up to its 0.5 s poll. The encoder clears its queue at the rate by the clock, so
    that stall counts; an idle encoder with nothing waiting is not slower for it."""
    path = tmp_path / "board"
    encoder, tokenizer = EncoderRow(path), TokenizerRow(path, deadline_s=2.5)
    now = time.monotonic()
    assert tokenizer.admit_all([100] * 20, now=now) == [None] * 20  # not measured yet: all admitted
    for batch in range(int(MIN_ANSWERS)):  # 0.1 s of work, then a 0.1 s stall with requests waiting
        start = now + 0.2 * batch + 0.1
        encoder.started(start)
        encoder.took([100])
        encoder.finished(100, 0.1, now=start + 0.1)
    # 800 tokens in 0.8 s of work and 7 stalls (none was waiting before the first batch), not in 0.8 s
    assert tokenizer.tokens_per_s() == pytest.approx(800 / 1.5, rel=0.02)
    encoder.started(now + 1.7)
    refusal = tokenizer.admit(100, now=now + 1.7)  # 12 waiting: 1,300 tokens, 2.4 s by the clock (1.3 s busy)
    assert refusal is not None and refusal.wait_s == pytest.approx(1300 / (800 / 1.5), rel=0.02)
    quiet = TokenizerRow(tmp_path / "quiet", deadline_s=2.5)  # the same batches, nothing ever waiting
    idle = EncoderRow(tmp_path / "quiet")
    for batch in range(int(MIN_ANSWERS)):
        start = now + 0.2 * batch + 0.1
        idle.started(start)
        idle.finished(100, 0.1, now=start + 0.1)
    assert quiet.tokens_per_s() == pytest.approx(1000, rel=0.05)
    assert encoder.row[BACKLOG] == 1 and idle.row[BACKLOG] == 0 and idle.row[STALLED] == 0
    for row in (tokenizer, encoder, quiet, idle):
        row.close()
