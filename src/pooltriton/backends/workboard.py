"""Admission by work inside Triton, for every client: the board the tokenizer and encoder stages of one
encoder share in /dev/shm (what was admitted, what was finished, how fast), and the rule the tokenizer
admits by. Design: docs/design.md#inside-triton-backendsworkboard.
"""

from __future__ import annotations

import fcntl
import math
import mmap
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from pooltriton.contract.admission import DEADLINE_SHARE, HORIZON_S, MIN_ANSWERS, Refusal, refuse
from pooltriton.contract.stub import SERVER_PID_ARG, SHM_ARG, STUB

SLOTS = 32  # stage instances per encoder (tokenizers and encoders together)
# OWNER and BORN: the process holding a row (pid, its start time); 0 when it left. LAST_END: an encoder's
# last batch's end, a tokenizer's last admission. STARTED: the encoder's current batch's start. BACKLOG:
# 1 when its last batch ended with admitted requests still waiting; STALLED: the idle time before the
# current batch that counts as clearing time (EncoderRow.started). PRIME_TOKENS, PRIME_BUSY: what the
# encoder timed at load (EncoderRow.primed), a prior the rate always counts and time does not decay.
(OWNER, ROLE, TOTAL, BUSY, LAST_END, RATE_TOKENS, RATE_BUSY, RATE_AT, BATCHES, BORN, STARTED,
 BACKLOG, STALLED, PRIME_TOKENS, PRIME_BUSY) = range(15)
FIELDS = 16  # room to grow
TOKENIZER, ENCODER = 1.0, 2.0
# A request the tokenizer admitted reaches an idle encoder within this (the ensemble's hop, ~1 ms).
IN_TRANSIT_S = 0.05
# Triton's dynamic batcher under a queue policy may start nothing for up to 0.5 s after its instance
# finished, requests queued (its poll; docs/performance.md): an encoder idle for longer has none queued.
STALL_S = 0.5 + IN_TRANSIT_S
# The shared row after the SLOTS rows: the tokenizers' forgotten work, and what they admitted in each of
# WINDOWS windows of IN_TRANSIT_S / (WINDOWS - 1) (window n in slot n % WINDOWS: its number, its tokens);
# the last WINDOWS of them are in transit, a span between IN_TRANSIT_S and IN_TRANSIT_S plus one window.
WINDOWS = 5
FORGOTTEN, WINDOW_IDS, WINDOW_TOKENS = 0, 1, 1 + WINDOWS
WINDOW_S = IN_TRANSIT_S / (WINDOWS - 1)
# The log of admitted requests not yet started, after the shared row: one entry per request (its tokens, 0
# when the entry is free; when it was admitted; when its timeout drops it if it has not started by then;
# its own timeout in microseconds, 0 for none, which the encoder matches with the tokens).
# Room for what a queue of 128 and whatever was dropped within a timeout can hold; when it is full the
# entry that expires first leaves it, still counted (until the encoders idle: the module's note).
LOG = 2048
TOKENS, ADMITTED, EXPIRES, TIMEOUT = range(4)
ENTRY = 4  # fields per entry (32 bytes)


def stub_argv() -> list[str]:
    """This process's command line (the embedded interpreter of Triton's stub leaves sys.argv empty)."""
    try:
        return Path("/proc/self/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def board_path(stub_argv: list[str], encoder: str) -> Path | None:
    """The board of `encoder` on this server: named after the stub's shared-memory region less its UUID
    and the server's pid; None outside a stub."""
    if len(stub_argv) <= SERVER_PID_ARG or not stub_argv[0].endswith(STUB) or len(stub_argv[SHM_ARG]) <= 36:
        return None
    return Path("/dev/shm") / f"{stub_argv[SHM_ARG][:-36].lstrip('/')}work{stub_argv[SERVER_PID_ARG]}_{encoder}"


def _born(pid: int) -> float:
    """A process's start time (clock ticks after boot, /proc/<pid>/stat), 0 if it is gone: with the pid,
    it tells a live owner from a later process that reused a dead one's pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    return float(stat[stat.rindex(")") + 2:].split()[19])


class Board:
    """This process's row on the board of one encoder (`role`: TOKENIZER or ENCODER)."""

    def __init__(self, path: Path, role: float) -> None:
        self.path = path
        fd = _locked(path, create=True)
        assert fd is not None
        try:
            if os.fstat(fd).st_size < SIZE:
                os.ftruncate(fd, SIZE)
            self._map, self._inode = mmap.mmap(fd, SIZE), os.fstat(fd).st_ino
            board = np.ndarray((SLOTS + 1, FIELDS), dtype=np.float64, buffer=self._map)
            self.rows, self.shared = board[:SLOTS], board[SLOTS]
            self.log = np.ndarray((LOG, ENTRY), dtype=np.float64, buffer=self._map, offset=ROWS_SIZE)
            self._clear_dead()
            # The row a left instance of this role had, with its total (the work it admitted or finished
            # stays counted); else a new one; else any left row afresh (its total leaves the count: the
            # tokenizers' estimate is off until the encoders idle).
            left = (self.rows[:, OWNER] == 0) & (self.rows[:, ROLE] == role)
            for candidates in (left, self.rows[:, ROLE] == 0, self.rows[:, OWNER] == 0):
                if candidates.any():
                    index = int(np.flatnonzero(candidates)[0])
                    break
            else:
                del board, self.rows, self.shared, self.log  # (views of the map: it cannot close under them)
                self._map.close()
                raise OSError(f"{path}: all {SLOTS} rows are taken")
            self.row = self.rows[index]
            total = self.row[TOTAL] if self.row[ROLE] == role else 0.0
            self.row[:] = 0.0
            self.row[ROLE], self.row[TOTAL], self.row[BORN] = role, total, _born(os.getpid())
            self.row[OWNER] = os.getpid()
            self._fd = os.open(path, os.O_RDWR)  # (the locked file's) for the lock admissions and starts take
        finally:
            _unlock(fd)

    @contextmanager
    def _lock(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _clear_dead(self) -> None:
        for row in self.rows:  # a dead instance's row: it no longer counts as working
            if row[OWNER] and _born(int(row[OWNER])) != row[BORN]:
                row[OWNER] = row[BUSY] = 0.0

    def close(self) -> None:
        """Leave the board; the last stage out removes it (a server stopping: every stage finalizes), while
        a stage reloaded alone leaves it to the other, which still uses it."""
        os.close(self._fd)
        fd = _locked(self.path, create=False)
        try:
            self.row[BUSY] = self.row[OWNER] = 0.0
            if fd is not None and os.fstat(fd).st_ino == self._inode:  # (not a later server's board)
                self._clear_dead()
                if not self.rows[:, OWNER].any():
                    self.path.unlink(missing_ok=True)
        finally:
            if fd is not None:
                _unlock(fd)
            del self.rows, self.row, self.shared, self.log
            self._map.close()


def _micros(timeout_s: float | None) -> int:
    """A request's own timeout as the log keeps it (both stages must write it alike): microseconds, 0 for none."""
    return round((timeout_s or 0.0) * 1e6)


def _keys(tokens: np.ndarray, timeouts_us: np.ndarray) -> np.ndarray:
    """One sortable key per (tokens, own timeout): the tokens above 32 bits, the microseconds below."""
    return (tokens.astype(np.int64) << 32) | np.minimum(timeouts_us.astype(np.int64), 2**32 - 1)


ROWS_SIZE = (SLOTS + 1) * FIELDS * 8
SIZE = ROWS_SIZE + LOG * ENTRY * 8


def _unlock(fd: int) -> None:
    """Explicitly: the mmap holds a duplicate of the descriptor, which would keep the lock held."""
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def _locked(path: Path, create: bool) -> int | None:
    """A descriptor of the board at `path`, locked (flock; `_unlock` releases it); None if there is
    none. Retried when the last stage out removed the file between its opening and its lock."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
        except FileNotFoundError:
            return None
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
        if not create:
            return None


class EncoderRow(Board):
    """The encoder's side: when it works, what it finished, how fast."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, ENCODER)

    def started(self, now: float) -> None:
        """A batch starts. If the last one left admitted requests waiting, the idle time since it (up to a
        batcher stall) is part of what clearing them took: Triton's batcher under a queue policy leaves
        queued requests up to 0.5 s after a batch when nothing arrives (STALL_S), which in a flood that
        refuses everyone is after nearly every batch. A rate per busy second alone is faster than the
        queue clears by the clock, and admits work that may then expire in it."""
        row = self.row
        idle = min(max(now - row[LAST_END], 0.0), STALL_S) if row[BACKLOG] else 0.0
        row[STALLED] = idle
        row[STARTED] = now
        row[BUSY] = 1.0

    def primed(self, tokens: float, seconds: float) -> None:
        """The encoder cleared `tokens` in `seconds` at load: a prior worth one batch that the rate always
        counts, with a batcher stall (as in a flood, where nearly every batch has one), so it errs slow.
        Without it a fresh server admits everything until MIN_ANSWERS batches answered (a flood that
        arrives first is admitted whole and expires in the queue), and an idle one rates by its last
        small batches (the canary's single texts), far below what it clears in a flood. Not decayed by
        time: idle minutes must not leave the rate to a few tiny batches."""
        self.row[PRIME_TOKENS], self.row[PRIME_BUSY] = float(tokens), seconds + STALL_S

    def took(self, requests: list[int], timeouts_s: list[float | None] | None = None) -> None:
        """The started batch's requests (their tokens, their own timeouts) leave the tokenizers' log: of
        each (tokens, timeout), the earliest admitted entries. One with no such entry left counts again
        until it finishes: its entry was forgotten (expired a moment before it started, or taken by an
        equal one that overtook it and had expired) or there was none (a direct call, then neutral)."""
        if not requests:
            return
        timeouts = [_micros(t) for t in (timeouts_s or [None] * len(requests))]
        with self._lock():
            log = self.log
            live = np.flatnonzero(log[:, TOKENS] > 0)
            live_keys = _keys(log[live, TOKENS], log[live, TIMEOUT])
            by_key = np.lexsort((log[live, ADMITTED], live_keys))  # by key, then admitted
            order, keys = live[by_key], live_keys[by_key]
            wanted = np.sort(_keys(np.asarray(requests, dtype=np.float64), np.asarray(timeouts, dtype=np.float64)))
            # The n-th request of a key takes the n-th entry of it, if there is one.
            position = (np.searchsorted(keys, wanted, "left")
                        + np.arange(len(wanted)) - np.searchsorted(wanted, wanted, "left"))
            there = position < np.searchsorted(keys, wanted, "right")
            log[order[position[there]], TOKENS] = 0.0
            self.shared[FORGOTTEN] -= float((wanted[~there] >> 32).sum())

    def finished(self, tokens: int, seconds: float, now: float) -> None:
        """A batch of `tokens` ended after `seconds` of work; the rate counts the stall before it too."""
        row = self.row
        decay = math.exp(-max(now - row[RATE_AT], 0.0) / HORIZON_S)
        row[RATE_TOKENS] = row[RATE_TOKENS] * decay + tokens
        row[RATE_BUSY] = row[RATE_BUSY] * decay + seconds + row[STALLED]
        row[STALLED] = 0.0
        # Admitted requests still waiting (on the log, not past their timeout): the next idle is a stall.
        log = self.log
        row[BACKLOG] = float(((log[:, TOKENS] > 0) & (log[:, EXPIRES] >= now)).any())
        row[RATE_AT] = now
        row[BATCHES] += 1
        row[TOTAL] += tokens
        row[LAST_END] = now
        row[BUSY] = 0.0  # last: a reader that sees it idle sees its totals


class TokenizerRow(Board):
    """The tokenizer's side: admits a request's tokens or refuses them with the wait they would have had."""

    def __init__(self, path: Path, deadline_s: float, share: float = DEADLINE_SHARE) -> None:
        super().__init__(path, TOKENIZER)
        self.deadline_s = deadline_s
        self.budget_s = deadline_s * share
        with self._lock():
            live = self._live(TOKENIZER)
            if not (live[:, OWNER] != self.row[OWNER]).any():
                # The first tokenizer (or a reloaded one alone): the board's history is no work of its.
                self.shared[FORGOTTEN] = self._outstanding()
                self.log[:, TOKENS] = 0.0

    def _outstanding(self) -> float:
        rows = self.rows
        return float(rows[rows[:, ROLE] == TOKENIZER, TOTAL].sum() - rows[rows[:, ROLE] == ENCODER, TOTAL].sum())

    def _live(self, role: float) -> np.ndarray:
        return self.rows[(self.rows[:, ROLE] == role) & (self.rows[:, OWNER] != 0)]

    def tokens_per_s(self, encoders: np.ndarray | None = None) -> float | None:
        """What the live encoders (`encoders`, read now if not given) clear per second of work and of the
        stalls before batches that had requests waiting (EncoderRow.started), summed; None before
        MIN_ANSWERS batches unless an encoder timed a batch at load (EncoderRow.primed: counted too)."""
        encoders = self._live(ENCODER) if encoders is None else encoders
        if encoders[:, BATCHES].sum() < MIN_ANSWERS and not encoders[:, PRIME_BUSY].any():
            return None
        tokens = encoders[:, RATE_TOKENS] + encoders[:, PRIME_TOKENS]
        busy = encoders[:, RATE_BUSY] + encoders[:, PRIME_BUSY]
        rate = float((tokens[busy > 0] / busy[busy > 0]).sum())
        return rate if rate > 0 else None

    @staticmethod
    def _transit_start(now: float) -> float:
        """When the oldest window `_in_transit` counts began."""
        return (math.floor(now / WINDOW_S) - WINDOWS + 1) * WINDOW_S

    def _in_transit(self, now: float) -> float:
        """Tokens the tokenizers admitted in the last IN_TRANSIT_S (up to one window more)."""
        current = math.floor(now / WINDOW_S)
        ids, tokens = self.shared[WINDOW_IDS:WINDOW_IDS + WINDOWS], self.shared[WINDOW_TOKENS:WINDOW_TOKENS + WINDOWS]
        return float(tokens[ids > current - WINDOWS].sum())

    def _sent(self, tokens: float, now: float) -> None:
        current = math.floor(now / WINDOW_S)
        slot = current % WINDOWS
        if self.shared[WINDOW_IDS + slot] != current:
            self.shared[WINDOW_IDS + slot], self.shared[WINDOW_TOKENS + slot] = current, 0.0
        self.shared[WINDOW_TOKENS + slot] += tokens

    def queued(self, now: float) -> float:
        """Tokens admitted and not yet finished, as far as the tokenizers can tell."""
        with self._lock():
            return self._queued(now, self._live(ENCODER), self._in_transit(now))

    def _queued(self, now: float, encoders: np.ndarray, in_transit: float) -> float:
        """`queued`, under the lock, given the live encoders' rows and the work in transit as read now."""
        outstanding = self._outstanding()
        last_end = float(self.rows[self.rows[:, ROLE] == ENCODER, LAST_END].max(initial=0.0))
        log = self.log
        # Requests still on the log past their timeout never started: Triton dropped them.
        expired = (log[:, TOKENS] > 0) & (log[:, EXPIRES] < now)
        forgotten = float(self.shared[FORGOTTEN]) + float(log[expired, TOKENS].sum())
        log[expired, TOKENS] = 0.0
        if not encoders[:, BUSY].any() and now - last_end > STALL_S:
            # Every encoder idle past a stall: nothing is queued but what the tokenizers just sent.
            forgotten = max(forgotten, outstanding - in_transit)
            log[log[:, ADMITTED] < self._transit_start(now), TOKENS] = 0.0
        # Never below nothing queued: finished work no tokenizer admitted (direct calls to the encoder)
        # would otherwise hide the next admissions.
        self.shared[FORGOTTEN] = forgotten = min(forgotten, outstanding)
        return outstanding - forgotten

    def wedged(self, now: float, encoders: np.ndarray | None = None) -> bool:
        """An encoder busy with one batch for longer than the deadline."""
        encoders = self._live(ENCODER) if encoders is None else encoders
        return bool(((encoders[:, BUSY] > 0) & (now - encoders[:, STARTED] > self.deadline_s)).any())

    def admit(self, tokens: int, now: float | None = None, timeout_s: float | None = None) -> Refusal | None:
        """None: admitted (counted as queued until an encoder finishes it, or until its timeout, `timeout_s`
        or the queue's, passes before an encoder started it); else the refusal. With nothing queued
        anything is admitted (a request longer than the deadline alone runs on an idle encoder)."""
        return self.admit_all([tokens], now, [timeout_s])[0]

    def admit_all(self, requests: list[int], now: float | None = None,
                  timeouts_s: list[float | None] | None = None) -> list[Refusal | None]:
        """`admit` for a batch's requests in turn (`timeouts_s`: each one's own timeout, None for the
        queue's), the board read once (a batch of 30 short requests otherwise read it 30 times: ~50 us
        each) and locked: the other tokenizer instances wait."""
        now = time.monotonic() if now is None else now
        with self._lock():
            encoders, in_transit = self._live(ENCODER), self._in_transit(now)  # read once per batch
            queued = self._queued(now, encoders, in_transit)
            rate = self.tokens_per_s(encoders) if queued > 0 or len(requests) > 1 else None
            if rate is not None and self.wedged(now, encoders):
                rate = None
            # An idle encoder with nothing on its way takes the first request (the module's note).
            free = not encoders[:, BUSY].any() and in_transit == 0
            answers: list[Refusal | None] = []
            entries: list[tuple[float, float, float]] = []  # (tokens, expires, own timeout in us) of the admitted
            for tokens, timeout_s in zip(requests, timeouts_s or [None] * len(requests), strict=True):
                refusal = (refuse(queued, tokens, rate, self.budget_s)
                           if rate is not None and queued > 0 and not free else None)
                if refusal is None:
                    queued += tokens
                    # Its timeout runs from its arrival at the encoder's queue, moments after now; the
                    # queue applies the shorter of the request's own and its default (allow_timeout_override).
                    timeout = min(timeout_s, self.deadline_s) if timeout_s else self.deadline_s
                    entries.append((tokens, now + timeout + IN_TRANSIT_S, _micros(timeout_s)))
                    free = False
                answers.append(refusal)
            if entries:
                self._log(entries, now)
                admitted = float(sum(entry[0] for entry in entries))
                self.row[TOTAL] += admitted
                self.row[LAST_END] = now
                self._sent(admitted, now)
        return answers

    def _log(self, entries: list[tuple[float, float, float]], now: float) -> None:
        """Write the admitted requests on the log; when it is full, the entries expiring first leave it."""
        log = self.log
        free = np.flatnonzero(log[:, TOKENS] == 0)
        if free.size < len(entries):
            taken = np.flatnonzero(log[:, TOKENS] > 0)
            free = np.concatenate([free, taken[np.argsort(log[taken, EXPIRES])][:len(entries) - free.size]])
        rows, values = free[:len(entries)], np.asarray(entries, dtype=np.float64)
        log[rows, ADMITTED], log[rows, EXPIRES], log[rows, TIMEOUT] = now, values[:, 1], values[:, 2]
        log[rows, TOKENS] = values[:, 0]
