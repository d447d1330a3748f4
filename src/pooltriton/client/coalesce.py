"""Concurrent small requests for one model and options as one Triton call, each keeping its own answer
and error; bounded waiting, no added wait on an idle server. Design: docs/design.md#coalescing-clientcoalesce.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

from pooltriton.contract import MAX_BATCH_SIZE
from pooltriton.contract.requests import TritonRequest, classify, merge, split

# Statuses that mean the request itself was wrong (INVALID_ARGUMENT and the like): the one request of a
# merged call that caused it is found by sending each again alone.
CLIENT_FAULTS = frozenset({400, 404, 413, 422})
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
        """Texts waiting, those of callers that went away left out."""
        return sum(w.request.rows for w in self.waiting if not w.answer.done())


class Coalescer:
    """`infer` as the transport's, with concurrent requests of one merge key sent together."""

    def __init__(self, send: Send, max_batch: int = MAX_BATCH_SIZE, in_flight: int = IN_FLIGHT,
                 observe: Callable[[int], None] | None = None, small: int | None = None) -> None:
        """`observe(n)` is told of every call to Triton with the number of requests it carries; requests of
        more than `small` texts (default max_batch / SMALL_SHARE) are sent as they come."""
        self.small = small if small is not None else max(1, max_batch // SMALL_SHARE)
        if in_flight < 1 or not 1 <= self.small <= max_batch:
            raise ValueError("in_flight must be at least 1, and small between 1 and max_batch")
        self._send, self.max_batch, self.in_flight = send, max_batch, in_flight
        self._observe = observe or (lambda _requests: None)
        self._lanes: dict[tuple, _Lane] = {}
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    @property
    def waiting(self) -> int:
        """Requests waiting for a call, over all lanes."""
        return sum(len(lane.waiting) for lane in self._lanes.values())

    async def infer(self, request: TritonRequest) -> dict[str, np.ndarray]:
        if self._closed:
            raise ConnectionError("the pooling service is closed")
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
        while not self._closed and lane.waiting and (lane.running < self.in_flight or lane.rows >= self.max_batch):
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
                _cancel_when_abandoned(task, batch)
        if not lane.running and not lane.waiting:
            self._lanes.pop(key, None)

    async def _run(self, key: tuple, lane: _Lane, batch: list[_Waiting]) -> None:
        requests = [w.request for w in batch]
        try:
            answer = await self._call(merge(requests) if len(batch) > 1 else requests[0], len(batch))
            parts = split(requests[0].outputs, answer, [r.rows for r in requests]) if len(batch) > 1 else [answer]
            for waiting, part in zip(batch, parts, strict=True):
                _settle(waiting.answer, part)
        except Exception as error:
            if len(batch) > 1 and classify(error).status in CLIENT_FAULTS:
                # One request's fault must stay that request's: each again on its own.
                await asyncio.gather(*(self._alone(waiting) for waiting in batch))
            for waiting in batch:
                _settle(waiting.answer, error=error)
        finally:
            # Cancelled (every caller went away, or close()): nobody may be left waiting for an answer.
            for waiting in batch:
                _settle(waiting.answer, error=ConnectionError("the pooling service closed before answering"))
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
        """Refuse new requests, fail those waiting, cancel the calls in flight and wait for them."""
        self._closed = True
        for lane in self._lanes.values():
            while lane.waiting:
                _settle(lane.waiting.popleft().answer, error=ConnectionError("the pooling service closed"))
        while self._tasks:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _cancel_when_abandoned(task: asyncio.Task, batch: list[_Waiting]) -> None:
    """Cancel the call once every caller in it went away (HTTP clients that disconnected)."""
    def abandoned(_answer: asyncio.Future) -> None:
        if all(waiting.answer.cancelled() for waiting in batch):
            task.cancel()

    for waiting in batch:
        waiting.answer.add_done_callback(abandoned)


def _settle(answer: asyncio.Future, result: dict | None = None, error: Exception | None = None) -> None:
    """Answer a waiting request unless it has its answer (or its caller went away). A shared error is the
    same object for every caller (tritonclient's exceptions cannot be copied)."""
    if answer.done():
        return
    if error is not None:
        answer.set_exception(error)
    else:
        answer.set_result(result)
