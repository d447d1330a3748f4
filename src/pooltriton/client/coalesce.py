"""Concurrent small requests for one model as one Triton call (the gateway's many short requests).

Per `merge_key` (model, options, priority) a lane keeps at most `in_flight` calls running: a request
that finds a free slot and nobody waiting is sent at once, so an idle server answers it without any
added wait. Others wait in the lane and leave, merged (`contract.requests.merge`), when a call comes
back, or at once when they fill `max_batch` texts: waiting is bounded by one batch per lane and lanes
are dropped when idle, so nothing a client sends grows the gateway's state without bound.

Each request keeps its own answer and its own error: a merged call that fails with UNAVAILABLE (queue
full, server going away) fails every request in it, as each alone would have; any other error (one
text too long, say) sends its requests again one by one, so only the one that caused it sees it.
Triton still batches across lanes and clients with its dynamic batcher; this saves the per-request cost
of every hop (HTTP/2 frames, the ensemble, each stage's request objects) for requests that would
otherwise travel side by side.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

from pooltriton.contract import MAX_BATCH_SIZE
from pooltriton.contract.requests import TritonRequest, classify, merge, split

Send = Callable[[TritonRequest], Awaitable[dict[str, np.ndarray]]]
# Requests of up to this share of a batch are merged; bigger ones already carry their per-call cost
# over many texts, and merging them would only make their first texts wait for the last.
SMALL_SHARE = 8
# Two calls in flight per lane keep the ensemble's stages busy side by side (one batch tokenizing while
# the other is encoded) while the rest gather into the next batch.
IN_FLIGHT = 2


@dataclass
class _Waiting:
    request: TritonRequest
    answer: asyncio.Future


@dataclass
class _Lane:
    running: int = 0
    waiting: deque[_Waiting] = field(default_factory=deque)

    @property
    def rows(self) -> int:
        return sum(w.request.rows for w in self.waiting)


class Coalescer:
    """`infer` as the transport's, with concurrent requests of one merge key sent together."""

    def __init__(self, send: Send, max_batch: int = MAX_BATCH_SIZE, in_flight: int = IN_FLIGHT,
                 observe: Callable[[int], None] | None = None, small: int | None = None) -> None:
        """`observe(n)` is told of every call to Triton with the number of requests it carries; requests of
        more than `small` texts (default max_batch / SMALL_SHARE) are sent as they come."""
        if in_flight < 1:
            raise ValueError("in_flight must be at least 1")
        self._send, self.max_batch, self.in_flight = send, max_batch, in_flight
        self.small = small if small is not None else max(1, max_batch // SMALL_SHARE)
        self._observe = observe or (lambda _requests: None)
        self._lanes: dict[tuple, _Lane] = {}
        self._tasks: set[asyncio.Task] = set()

    async def infer(self, request: TritonRequest) -> dict[str, np.ndarray]:
        if request.rows > self.small:
            return await self._call(request)
        key = request.merge_key()
        lane = self._lanes.setdefault(key, _Lane())
        if lane.running < self.in_flight and not lane.waiting:
            lane.running += 1
            try:
                return await self._call(request)
            finally:
                lane.running -= 1
                self._dispatch(key, lane)
        waiting = _Waiting(request, asyncio.get_running_loop().create_future())
        lane.waiting.append(waiting)
        self._dispatch(key, lane)
        return await waiting.answer

    async def _call(self, request: TritonRequest, requests: int = 1) -> dict[str, np.ndarray]:
        self._observe(requests)
        return await self._send(request)

    def _dispatch(self, key: tuple, lane: _Lane) -> None:
        """Send what waits while a slot is free or a full batch has gathered; drop the lane when idle."""
        while lane.waiting and (lane.running < self.in_flight or lane.rows >= self.max_batch):
            batch, rows = [], 0
            while lane.waiting and rows + lane.waiting[0].request.rows <= self.max_batch:
                waiting = lane.waiting.popleft()
                if not waiting.answer.done():  # a caller that went away is not sent
                    batch.append(waiting)
                    rows += waiting.request.rows
            if batch:
                lane.running += 1
                task = asyncio.get_running_loop().create_task(self._run(key, lane, batch))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        if not lane.running and not lane.waiting:
            self._lanes.pop(key, None)

    async def _run(self, key: tuple, lane: _Lane, batch: list[_Waiting]) -> None:
        try:
            requests = [w.request for w in batch]
            try:
                answer = await self._call(merge(requests) if len(batch) > 1 else requests[0], len(batch))
            except Exception as error:
                if len(batch) == 1 or classify(error).retryable:
                    for waiting in batch:
                        _settle(waiting.answer, error=error)
                else:  # one request's fault must stay that request's: each again on its own
                    await asyncio.gather(*(self._alone(waiting) for waiting in batch))
                return
            except BaseException:
                for waiting in batch:
                    waiting.answer.cancel()
                raise
            parts = split(requests[0].outputs, answer, [r.rows for r in requests]) if len(batch) > 1 else [answer]
            for waiting, part in zip(batch, parts):
                _settle(waiting.answer, part)
        finally:
            lane.running -= 1
            self._dispatch(key, lane)

    async def _alone(self, waiting: _Waiting) -> None:
        if waiting.answer.done():
            return
        try:
            _settle(waiting.answer, await self._call(waiting.request))
        except Exception as error:
            _settle(waiting.answer, error=error)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _settle(answer: asyncio.Future, result: dict | None = None, error: Exception | None = None) -> None:
    if answer.done():  # its caller was cancelled meanwhile
        return
    if error is not None:
        answer.set_exception(error)
    else:
        answer.set_result(result)
