"""Run a padded-batch encoder over a dynamic batch of ragged requests.

Triton hands the encoder requests of different lengths (`allow_ragged_batch`). We sort every text of
every request by real length, cut the sorted list into chunks under a token budget, pad each chunk
only to its own longest text, run the encoder once per chunk, and scatter rows back per request.
Sorting keeps padding small however the requests arrive (issue 5's benchmark measures it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# Rows x padded length per encoder call: big enough to amortise per-call overhead, small enough
# to keep activations in cache-friendly sizes on CPU.
TOKEN_BUDGET = 8192
MAX_ROWS = 64
# A chunk ends when the next (shorter) text is below this fraction of the chunk's longest: it
# bounds the padding of every chunk, which sorting alone does not when one request brings 32
# texts of mixed lengths.
MIN_FILL = 0.8


@dataclass
class RaggedStats:
    real_tokens: int = 0
    computed_tokens: int = 0
    calls: int = 0


def plan_chunks(lengths: np.ndarray, token_budget: int = TOKEN_BUDGET, max_rows: int = MAX_ROWS,
                min_fill: float = MIN_FILL) -> list[np.ndarray]:
    """Indices of rows, longest first, grouped so that rows * longest <= budget and every row of a
    chunk is at least `min_fill` of its longest."""
    order = np.argsort(-lengths, kind="stable")
    chunks, start = [], 0
    while start < len(order):
        width = max(int(lengths[order[start]]), 1)
        rows = max(1, min(max_rows, token_budget // width))
        end = start + 1
        while end < min(start + rows, len(order)) and lengths[order[end]] >= min_fill * width:
            end += 1
        chunks.append(order[start:end])
        start = end
    return chunks


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
) -> list[dict[str, np.ndarray]]:
    """`requests[i][name]` is [n_i, L_i]; returns per request {output: [n_i, ...]}. `run_chunks` gets
    every chunk of the batch at once, so a runtime with several streams can run them concurrently.

    Token-level outputs come back as [n_i, L_i, ...] (the request's own width, padding rows zero).
    """
    names = list(requests[0])
    owner, widths, row_arrays = [], [], {name: [] for name in names}
    lengths = []
    for index, request in enumerate(requests):
        mask = request.get("attention_mask")
        width = request[names[0]].shape[1]
        real = mask.sum(axis=1) if mask is not None else np.full(request[names[0]].shape[0], width)
        for row in range(request[names[0]].shape[0]):
            owner.append((index, row))
            lengths.append(int(real[row]))
            for name in names:
                row_arrays[name].append(request[name][row])
        widths.append(width)
    lengths_arr = np.asarray(lengths)
    results: list[dict[str, np.ndarray] | None] = [None] * len(owner)
    chunks = plan_chunks(lengths_arr, token_budget)
    all_feeds = []
    for chunk in chunks:
        width = max(int(lengths_arr[chunk].max()), 1)
        feeds = {}
        for name in names:
            batch = np.full((len(chunk), width), pad_values.get(name, 0), dtype=row_arrays[name][0].dtype)
            for slot, row in enumerate(chunk):
                n = min(lengths[row], width)
                batch[slot, :n] = row_arrays[name][row][:n]
            feeds[name] = batch
        all_feeds.append(feeds)
    for chunk, feeds, outputs in zip(chunks, all_feeds, run_chunks(all_feeds)):
        if stats is not None:
            stats.real_tokens += int(lengths_arr[chunk].sum())
            stats.computed_tokens += int(feeds[names[0]].size)
            stats.calls += 1
        for slot, row in enumerate(chunk):
            results[row] = {name: value[slot] for name, value in outputs.items()}
    responses = []
    position = 0
    for index, request in enumerate(requests):
        count = request[names[0]].shape[0]
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
