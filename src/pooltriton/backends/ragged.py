"""Run a padded-batch encoder over a dynamic batch of ragged requests.

Triton hands the encoder requests of different lengths (`allow_ragged_batch`). We sort every text of
every request by real length, cut the sorted list into chunks under a token budget, pad each chunk
only to its own longest text, run the encoder once per chunk, and scatter rows back per request.
Sorting keeps padding small however the requests arrive (make bench measures it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Rows x padded length per encoder call: the export sets it per device (ragged_token_budget).
TOKEN_BUDGET = 2048
MAX_ROWS = 64
# What one more encoder call costs, in padded token positions (per-call overhead, measured ~2-3 ms
# on MiniLM, ~25 positions, doubled for the smaller GEMMs of tiny chunks). The planner adds
# padding to a chunk only where that is cheaper than another call.
CALL_COST_TOKENS = 64


@dataclass(frozen=True)
class MemoryModel:
    """What one row of a chunk holds at the peak of an encoder layer: activations that grow with its
    width and attention scores that grow with its square (every head, and their masked and softmaxed
    copies). The export writes the per-token and per-cell bytes from the model's config; `budget` is
    what one chunk may hold (the shim's share of this machine's memory)."""

    token_bytes: int
    cell_bytes: int
    budget: int

    def row_bytes(self, width: int | np.ndarray) -> int | np.ndarray:
        return width * self.token_bytes + width * width * self.cell_bytes

    def longest(self) -> int:
        """The most tokens one row may have within the budget."""
        a, b = self.cell_bytes, self.token_bytes
        width = int((-b + (b * b + 4 * a * self.budget) ** 0.5) / (2 * a)) if a else self.budget // max(b, 1)
        while width > 0 and self.row_bytes(width) > self.budget:
            width -= 1
        return width


def machine_memory() -> int:
    """Bytes of memory this process may use: the machine's, or its cgroup's limit when lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total


def memory_budget(configured: int, sharers: int, available: int | None = None) -> int:
    """Bytes one chunk may hold: as configured, or (0) half the memory the encoder runs in (`available`:
    this machine's by default, a GPU's for GPU instances), shared by the chunks that may run at once
    (encoder instances x concurrent streams). Per encoder: each model on a server counts its own."""
    return configured // sharers if configured else (available or machine_memory()) // 2 // sharers


@dataclass
class RaggedStats:
    real_tokens: int = 0
    computed_tokens: int = 0
    calls: int = 0


def plan_chunks(lengths: np.ndarray, token_budget: int = TOKEN_BUDGET, max_rows: int = MAX_ROWS,
                call_cost: int = CALL_COST_TOKENS, memory: MemoryModel | None = None) -> list[np.ndarray]:
    """Indices of rows grouped into chunks of consecutive lengths (longest first), each with
    rows * longest <= budget and rows * memory.row_bytes(longest) <= memory.budget (or one row: rows
    too long for the memory are the caller's to refuse), minimising padded positions + call_cost per
    chunk.

    Dynamic programming over the sorted lengths: best[e] is the cheapest plan for the e longest
    rows, ending in a chunk [s, e) whose width is the length at s. At most max_rows candidates per
    end, vectorised, so a 128-row batch plans in well under a millisecond.
    """
    if len(lengths) == 1:
        # One text, the idle request: the plan below costs ~0.25 ms of numpy calls on a cold CPU.
        return [np.zeros(1, dtype=np.intp)]
    order = np.argsort(-lengths, kind="stable")
    widths = np.maximum(lengths[order].astype(np.int64), 1)
    count = len(order)
    best = np.zeros(count + 1, dtype=np.int64)
    cut = np.zeros(count + 1, dtype=np.int64)
    for end in range(1, count + 1):
        starts = np.arange(max(0, end - max_rows), end)
        rows = end - starts
        cost = best[starts] + rows * widths[starts] + call_cost
        over = rows * widths[starts] > token_budget
        if memory is not None:
            over |= rows * memory.row_bytes(widths[starts]) > memory.budget
        cost[over & (rows > 1)] = np.iinfo(np.int64).max
        pick = int(np.argmin(cost))
        best[end], cut[end] = cost[pick], starts[pick]
    chunks, end = [], count
    while end > 0:
        chunks.append(order[cut[end]:end])
        end = int(cut[end])
    return chunks[::-1]


Feeds = dict[str, np.ndarray]
RunChunks = Callable[[list[Feeds]], list[dict[str, np.ndarray]]]


def sequentially(run: Callable[[Feeds], dict[str, np.ndarray]]) -> RunChunks:
    """A run_chunks for a runtime that takes one chunk at a time."""
    return lambda chunks: [run(feeds) for feeds in chunks]


def run_ragged(
    requests: list[dict[str, np.ndarray]],
    run_chunks: RunChunks,
    per_token_outputs: set[str],
    pad_values: dict[str, int],
    stats: RaggedStats | None = None,
    token_budget: int = TOKEN_BUDGET,
    single_row_multiple: int = 1,
    max_width: int = 0,
    memory: MemoryModel | None = None,
    row_inputs: frozenset[str] = frozenset(),
) -> list[dict[str, np.ndarray]]:
    """`requests[i][name]` is [n_i, L_i] (or [n_i, 1] for `row_inputs`: one value per text); returns
    per request {output: [n_i, ...]}. `run_chunks` gets every chunk of the batch at once, so a runtime
    with several streams can run them concurrently.

    Token-level outputs come back as [n_i, L_i, ...] (the request's own width, padding rows zero).
    A chunk of one row is padded up to a multiple of `single_row_multiple` (at most `max_width`):
    runtimes that compile kernels per shape (OpenVINO) then see a few dozen single-text shapes
    again and again instead of a new one per length (-2 ms per single text, measured).
    """
    names = list(requests[0])
    tokens = next(name for name in names if name not in row_inputs)
    owner, widths, row_arrays = [], [], {name: [] for name in names}
    lengths = []
    for index, request in enumerate(requests):
        mask = request.get("attention_mask")
        width = request[tokens].shape[1]
        real = mask.sum(axis=1) if mask is not None else np.full(request[tokens].shape[0], width)
        for row in range(request[tokens].shape[0]):
            owner.append((index, row))
            lengths.append(int(real[row]))
            for name in names:
                row_arrays[name].append(request[name][row])
        widths.append(width)
    lengths_arr = np.asarray(lengths)
    results: list[dict[str, np.ndarray] | None] = [None] * len(owner)
    chunks = plan_chunks(lengths_arr, token_budget, memory=memory)
    all_feeds = []
    for chunk in chunks:
        width = max(int(lengths_arr[chunk].max()), 1)
        if len(chunk) == 1 and single_row_multiple > 1 and max_width:
            width = min(-(-width // single_row_multiple) * single_row_multiple, max(max_width, width))
        feeds = {name: np.stack([row_arrays[name][row] for row in chunk]) for name in row_inputs if name in names}
        for name in names:
            if name in row_inputs:
                continue
            batch = np.full((len(chunk), width), pad_values.get(name, 0), dtype=row_arrays[name][0].dtype)
            for slot, row in enumerate(chunk):
                n = min(lengths[row], width)
                batch[slot, :n] = row_arrays[name][row][:n]
            feeds[name] = batch
        all_feeds.append(feeds)
    for chunk, feeds, outputs in zip(chunks, all_feeds, run_chunks(all_feeds)):
        if stats is not None:
            stats.real_tokens += int(lengths_arr[chunk].sum())
            stats.computed_tokens += int(feeds[tokens].size)
            stats.calls += 1
        for slot, row in enumerate(chunk):
            results[row] = {name: value[slot] for name, value in outputs.items()}
    responses = []
    position = 0
    for index, request in enumerate(requests):
        count = request[tokens].shape[0]
        rows = results[position : position + count]
        position += count
        merged = {}
        for name in rows[0]:
            if name in per_token_outputs:
                shape = (count, widths[index], *rows[0][name].shape[1:])
                out = np.zeros(shape, dtype=rows[0][name].dtype)
                for r, values in enumerate(rows):
                    row = values[name][: widths[index]]
                    out[r, : row.shape[0]] = row
                merged[name] = out
            else:
                merged[name] = np.stack([values[name] for values in rows])
        responses.append(merged)
    return responses
