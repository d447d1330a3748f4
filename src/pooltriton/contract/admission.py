"""Admission by work, not by count: a request that could not be answered within its deadline, behind the
work already queued, is refused at once with the wait it would have had. Pure and clocked from outside;
the gateway's rule, and the one the tokenizer stage applies. Design: docs/design.md#admission-by-work.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# Measured rates forget with this time constant (seconds): the server's speed is the recent one.
HORIZON_S = 30.0
CHARS_PER_TOKEN = 4.0  # before any answer came back (English BPE/WordPiece text: ~4 characters a token)
# Answers (decayed) a rate must rest on before it refuses anything: one short text answered after idle
# time shows a single text's speed, far below what the server clears in batches, and would refuse the
# start of a burst that fits (measured at the gateway's cancellation flood).
MIN_ANSWERS = 8.0
# Admitted work must finish by this share of the deadline by the measured rate: the rate is an estimate,
# and a server that runs slower under the burst than when it was measured, or answers in another order
# than it admitted, overran a 30 s deadline by up to 3.5 s with the whole of it (a slow VM,
# docs/performance.md); a request still queued in Triton at the deadline is refused late, by its queue
# timeout.
DEADLINE_SHARE = 0.8
# A request of at most SHORT_TOKENS tokens (a query or a few) may fill the whole budget; a longer one must
# leave SHORT_RESERVE of it free. A flood of long batches then never holds the queue to the brim, and the
# single queries that arrive during it are admitted (and, sent at PRIORITY_SHORT, run ahead of the flood).
SHORT_TOKENS = 512
SHORT_RESERVE = 0.25


@dataclass
class _Decayed:
    """A sum that forgets with time constant HORIZON_S."""

    value: float = 0.0
    at: float = 0.0

    def add(self, amount: float, now: float) -> None:
        self.value = self.at_time(now) + amount
        self.at = now

    def at_time(self, now: float) -> float:
        return self.value * math.exp(-max(now - self.at, 0.0) / HORIZON_S)


@dataclass(frozen=True)
class Admitted:
    """An admitted request, for `Admission.done`."""

    tokens: float  # its estimated tokens
    at: float  # when it was admitted
    backlog_s: float  # the front's seconds with two requests or more in flight so far


@dataclass(frozen=True)
class Refusal:
    wait_s: float  # the estimated time until this request would have been answered
    retry_after_s: int  # when enough queued work should have cleared for it to fit
    limit_s: float = 0.0  # the work it had to fit within (its budget, less the reserve for a long one)


# How a refusal that crossed Triton (an error message, its only channel) says when to retry.
_RETRY = "retry after {} s"
_RETRY_PATTERN = re.compile(r"retry after (\d+) s\W*$")  # at the end: not in echoed user text


def retry_phrase(refusal: Refusal) -> str:
    return _RETRY.format(refusal.retry_after_s)


def retry_after_in(message: str) -> int | None:
    """The seconds a refusal's message says to wait (retry_phrase), None if it says none."""
    found = _RETRY_PATTERN.search(message)
    return int(found.group(1)) if found else None


def refuse(queued: float, tokens: float, rate: float, budget_s: float) -> Refusal | None:
    """The rule both fronts apply (the gateway's Admission, the tokenizer stage's board): refused when
    the queued work and this request's own would not clear within its budget at `rate` tokens/s: the
    whole budget for a short request, all but SHORT_RESERVE of it for a longer one."""
    limit = budget_s if tokens <= SHORT_TOKENS else budget_s * (1 - SHORT_RESERVE)
    wait = (queued + tokens) / rate
    return Refusal(wait, max(1, math.ceil(wait - limit)), limit) if wait > limit else None


def is_short(characters: int, texts: int) -> bool:
    """Whether a request of `texts` texts of `characters` in all is short (SHORT_TOKENS), by the
    characters-per-token of English text before anything is measured, plus two special tokens a text."""
    return characters / CHARS_PER_TOKEN + 2 * texts <= SHORT_TOKENS


class Admission:
    """One served model's queued work as seen from one front (the gateway, or one client)."""

    def __init__(self, deadline_s: float, share: float = DEADLINE_SHARE) -> None:
        self.deadline_s = deadline_s
        self.budget_s = deadline_s * share  # what admitted work may add up to, by the measured rate
        self.queued_tokens = 0.0
        self._in_flight = 0
        self._busy_since: float | None = None
        self._backlog_s = 0.0  # seconds with two requests or more in flight, all told (read as differences)
        self._tokens = _Decayed()  # tokens answered, each answer's by its share of time with others in flight
        self._busy = _Decayed()  # seconds with two requests or more in flight
        self._answers = _Decayed()  # answers by the same shares: the evidence the rate rests on
        self._chars = _Decayed()  # characters of every answered text ...
        self._text_tokens = _Decayed()  # ... and their tokens (the ratio `estimate_tokens` uses)

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens answered per busy second, both sums decayed to the same moment."""
        now = max(self._tokens.at, self._busy.at)
        tokens, busy = self._tokens.at_time(now), self._busy.at_time(now)
        return tokens / busy if busy > 0 and tokens > 0 else None

    def estimate_tokens(self, characters: int, texts: int) -> float:
        """A request's tokens from its characters, by the ratio the answers showed (+2 specials a text)."""
        ratio = self._chars.value / self._text_tokens.value if self._text_tokens.value > 0 else CHARS_PER_TOKEN
        return characters / max(ratio, 1e-6) + 2 * texts

    def admit(self, tokens: float, now: float) -> Refusal | Admitted:
        """Admitted (pass it to `done` when it is answered), or why not and when to retry: a request that
        could not finish within the budget (DEADLINE_SHARE of the deadline; less SHORT_RESERVE for a long
        one) behind the queued work and its own. With nothing in flight anything is admitted (a request
        longer than the deadline alone is never refused outright; it runs when the model is free)."""
        rate = self.tokens_per_s
        if rate is not None and self._in_flight > 0 and self._answers.at_time(now) >= MIN_ANSWERS:
            refusal = refuse(self.queued_tokens, tokens, rate, self.budget_s)
            if refusal is not None:
                return refusal
        self._account(now)
        self._in_flight += 1
        self.queued_tokens += tokens
        return Admitted(tokens, now, self._backlog_s)

    def done(self, admitted: Admitted, tokens: int | None, characters: int, now: float) -> None:
        """An admitted request answered (`tokens`: what usage says it cost) or failed (None)."""
        self._account(now)
        self._in_flight -= 1
        self.queued_tokens = max(self.queued_tokens - admitted.tokens, 0.0)
        if tokens:
            self._chars.add(characters, now)
            self._text_tokens.add(tokens, now)
            # The share of its time in flight spent beside other requests: 0 alone, 1 throughout.
            lifetime = now - admitted.at
            share = min((self._backlog_s - admitted.backlog_s) / lifetime, 1.0) if lifetime > 0 else 0.0
            if share > 0:
                self._tokens.add(tokens * share, now)
                self._answers.add(share, now)

    def _account(self, now: float) -> None:
        """Busy time: the seconds during which this front had two requests or more in flight."""
        if self._busy_since is not None and self._in_flight >= 2:
            self._busy.add(now - self._busy_since, now)
            self._backlog_s += now - self._busy_since
        self._busy_since = now
