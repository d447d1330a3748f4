"""Admission by work inside Triton, for every client (issue 19 item 4; the gateway's own is
contract.admission): the tokenizer stage knows each request's tokens, the encoder stage how fast it
clears them, and they share this board, a few numbers in a file under /dev/shm named after the server's
shared-memory prefix (the launcher removes it with the server's other regions).

One row per stage instance, written only by the process that claimed it, so no locks: 8-byte aligned
stores are atomic on x86-64 and ARM64, and a reader that sees one update half-done errs by one request.
Queued work = tokens the tokenizers admitted - tokens the encoders finished. A request Triton drops
between the stages (a full encoder queue, a cancellation, a queue timeout) is never finished; the
tokenizer forgets such work whenever it sees every encoder idle, as then nothing admitted is still
queued but what it sent in the last moments.
"""

from __future__ import annotations

import fcntl
import math
import mmap
import os
import time
from collections import deque
from pathlib import Path

import numpy as np

from pooltriton.contract.admission import DEADLINE_SHARE, HORIZON_S, MIN_ANSWERS, Refusal, refuse

SLOTS = 32  # stage instances per encoder (tokenizers and encoders together)
OWNER, ROLE, TOTAL, BUSY, LAST_END, RATE_TOKENS, RATE_BUSY, RATE_AT, BATCHES = range(9)
FIELDS = 16  # room to grow
TOKENIZER, ENCODER = 1.0, 2.0
# A request the tokenizer admitted reaches an idle encoder within this (the ensemble's hop, ~1 ms).
IN_TRANSIT_S = 0.05


def stub_argv() -> list[str]:
    """This process's command line (the embedded interpreter of Triton's stub leaves sys.argv empty)."""
    try:
        return Path("/proc/self/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def board_path(stub_argv: list[str], encoder: str) -> Path | None:
    """The board of `encoder` on this server: named after the stub's shared-memory region (argv[2], the
    server's prefix + a 36-character UUID) and the server's pid (argv[5]); None outside a stub."""
    if len(stub_argv) < 6 or not stub_argv[0].endswith("triton_python_backend_stub") or len(stub_argv[2]) <= 36:
        return None
    return Path("/dev/shm") / f"{stub_argv[2][:-36].lstrip('/')}work{stub_argv[5]}_{encoder}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Board:
    """This process's row on the board of one encoder (`role`: TOKENIZER or ENCODER)."""

    def __init__(self, path: Path, role: float) -> None:
        self.path = path
        size = SLOTS * FIELDS * 8
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # claiming a row: instances start concurrently
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
            self.rows = np.ndarray((SLOTS, FIELDS), dtype=np.float64, buffer=self._map)
            for row in self.rows:  # a dead instance's row: its totals stay, it is no longer busy
                if row[OWNER] and not _alive(int(row[OWNER])):
                    row[OWNER] = row[BUSY] = 0.0
            # A new row if there is one: a left row's total still counts (that work was admitted, or
            # finished). Else a left row afresh (the queued estimate is off until the encoders idle).
            unused = np.flatnonzero(self.rows[:, ROLE] == 0)
            free = unused if len(unused) else np.flatnonzero(self.rows[:, OWNER] == 0)
            if not len(free):
                raise RuntimeError(f"{path}: all {SLOTS} rows are taken")
            self.row = self.rows[int(free[0])]
            self.row[:] = 0.0
            self.row[ROLE] = role
            self.row[OWNER] = os.getpid()
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def close(self, remove: bool = False) -> None:
        self.row[OWNER] = 0.0
        del self.rows, self.row
        self._map.close()
        if remove:
            self.path.unlink(missing_ok=True)


class EncoderRow(Board):
    """The encoder's side: when it works, what it finished, how fast."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, ENCODER)

    def started(self) -> None:
        self.row[BUSY] = 1.0

    def finished(self, tokens: int, seconds: float, now: float) -> None:
        row = self.row
        decay = math.exp(-max(now - row[RATE_AT], 0.0) / HORIZON_S)
        row[RATE_TOKENS] = row[RATE_TOKENS] * decay + tokens
        row[RATE_BUSY] = row[RATE_BUSY] * decay + seconds
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
        self._recent: deque[tuple[float, float]] = deque()  # (when, tokens) admitted in the last moments
        # Admitted work Triton dropped before the encoder (see the module's note); at the start, all of
        # the board's history (this row is new, the others' work is not this tokenizer's to count).
        self.forgotten = self._outstanding()

    def _outstanding(self) -> float:
        rows = self.rows
        return float(rows[rows[:, ROLE] == TOKENIZER, TOTAL].sum() - rows[rows[:, ROLE] == ENCODER, TOTAL].sum())

    def tokens_per_s(self) -> float | None:
        """What the encoders clear per busy second, summed over instances; None before MIN_ANSWERS batches."""
        encoders = self.rows[self.rows[:, ROLE] == ENCODER]
        if encoders[:, BATCHES].sum() < MIN_ANSWERS:
            return None
        measured = encoders[encoders[:, RATE_BUSY] > 0]
        rate = float((measured[:, RATE_TOKENS] / measured[:, RATE_BUSY]).sum())
        return rate if rate > 0 else None

    def queued(self, now: float) -> float:
        """Tokens admitted and not yet finished, as far as this tokenizer can tell."""
        while self._recent and now - self._recent[0][0] > IN_TRANSIT_S:
            self._recent.popleft()
        rows = self.rows
        encoders = rows[:, ROLE] == ENCODER
        outstanding = self._outstanding()
        idle = not rows[encoders, BUSY].any() and now - float(rows[encoders, LAST_END].max(initial=0.0)) > IN_TRANSIT_S
        if idle:  # nothing is queued but what this tokenizer has just sent
            self.forgotten = outstanding - sum(tokens for _, tokens in self._recent)
        return max(outstanding - self.forgotten, 0.0)

    def admit(self, tokens: int, now: float | None = None) -> Refusal | None:
        """None: admitted (counted as queued until an encoder finishes it); else the refusal. With nothing
        queued anything is admitted (a request longer than the deadline alone runs on an idle encoder)."""
        now = time.monotonic() if now is None else now
        queued = self.queued(now)
        rate = self.tokens_per_s()
        if queued > 0 and rate is not None:
            refusal = refuse(queued, tokens, rate, self.budget_s)
            if refusal is not None:
                return refusal
        self.row[TOTAL] += tokens
        self._recent.append((now, float(tokens)))
        return None
