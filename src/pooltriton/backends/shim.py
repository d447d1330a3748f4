"""Shared body of the Python stand-ins for Triton's native `onnxruntime` and `pytorch` backends.

Configs say `backend: "openvino"` / `"onnxruntime"` / `"pytorch"`, so the same repository runs on
the NGC image (native C++ backends) and on the pip-installed server (these shims, which Triton finds
as BACKENDS/<name>/model.py). Each shim reads the parameters of the native backend it stands in for
(intra_op_thread_count, INFERENCE_NUM_THREADS, HINT_BF16, ...) and batches ragged requests itself
(see pooltriton.backends.ragged).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from pooltriton.backends.common import Counters, ModelArgs, error_response, input_array, request_timeout_s
from pooltriton.backends.ragged import TOKEN_BUDGET, MemoryModel, RaggedStats, memory_budget, run_ragged
from pooltriton.backends.workboard import EncoderRow, board_path, stub_argv
from pooltriton.contract import ATTENTION_MASK, INPUT_IDS
from pooltriton.contract.parameters import EncoderParameters

# The batch an encoder times at load for admission's first rate: a few chunks of flood-sized rows, at
# most this wide (wider rows cost more per token: attention grows with the square of the length).
PRIME_CHUNKS, PRIME_MAX_TOKENS = 4, 32768
PRIME_WIDTH = 512
PRIME_LONG_S = 4.0  # a first run this long is timed as it is (a large model on the CPU: load stays short)
# Rows per run of a dense tower (images): 16 keeps a ViT's activations in cache on a CPU, as the text chunks.
DENSE_CHUNK = 16


class EncoderShim:
    default_filename = "model"
    single_row_multiple = 1  # see run_ragged
    concurrent_chunks = 1  # chunks in memory at once (OpenVINO's streams run them together)

    def load(self, path: Path, model: ModelArgs) -> None:
        raise NotImplementedError

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def run_chunks(self, chunks: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
        """All chunks of one dynamic batch; runtimes with several streams override this."""
        return [self.run(feeds) for feeds in chunks]

    def initialize(self, args: dict[str, str]) -> None:
        model = ModelArgs(args)
        filename = model.config.get("default_model_filename") or self.default_filename
        self.input_names = [tensor["name"] for tensor in model.config["input"]]
        self.output_names = [tensor["name"] for tensor in model.config["output"]]
        # Outputs with a sequence axis ([L, ...] after the batch axis) are cut back per request.
        self.per_token = {t["name"] for t in model.config["output"] if len(t["dims"]) >= 2}
        # Inputs of one value per text (ACTIVATE) are not padded to the chunk's width.
        self.row_inputs = frozenset(t["name"] for t in model.config["input"] if [int(d) for d in t["dims"]] == [1])
        # A tower of fixed-size inputs (an image encoder): batched whole, no ragged planner or admission board.
        self.dense = INPUT_IDS not in self.input_names
        if self.dense:
            self.load(model.version_dir / filename, model)
            return
        parameters = model.stage(EncoderParameters)
        self.pad_values = {INPUT_IDS: parameters.pad_token_id}
        self.stats = RaggedStats()
        self.token_budget = parameters.ragged_token_budget or TOKEN_BUDGET
        self.max_width = parameters.max_length
        self.counters = Counters(model.name, ("pooltriton_tokens_total", "pooltriton_padding_tokens_total"))
        self.load(model.version_dir / filename, model)
        # What it finished and how fast, for the tokenizer's admission by work (backends.workboard).
        path = board_path(stub_argv(), model.name)
        self.board = None
        if path is not None:
            try:
                self.board = EncoderRow(path)
            except OSError as error:
                pb_utils.Logger.log_warn(f"{model.name}: no admission by work ({error})")
        self.memory = None
        instances = sum(group.get("count", 1) for group in model.config.get("instance_group", [])) or 1
        if parameters.memory_per_token is not None and parameters.memory_per_attention_cell is not None:
            budget = memory_budget(parameters.memory_budget, instances * self.concurrent_chunks,
                                   self.device_memory())
            self.memory = MemoryModel(parameters.memory_per_token, parameters.memory_per_attention_cell, budget)
        if self.board is not None:
            self._prime(model, instances)

    def _prime(self, model: ModelArgs, instances: int) -> None:
        """Time one flood-sized batch of synthetic tokens (after an untimed run: allocation, compilation)
        so that admission has this encoder's rate before its first answers (EncoderRow.primed). Each
        instance is timed alone but they share the device, so each publishes its share of that rate."""
        width = max(1, min(self.max_width or PRIME_WIDTH, PRIME_WIDTH))
        rows = max(1, min(PRIME_CHUNKS * self.token_budget, PRIME_MAX_TOKENS) // width)
        try:
            feeds = {tensor["name"]: self._synthetic(tensor, rows, width) for tensor in model.config["input"]}
            with _alone(model.version_dir.parent.parent):
                seconds = self._time_prime(feeds)
        except Exception as error:  # admission then waits for measured batches
            pb_utils.Logger.log_warn(f"{model.name}: no rate measured at load ({error})")
            return
        self.board.primed(rows * width / instances, seconds)
        pb_utils.Logger.log_info(f"{model.name}: {rows * width} tokens in {seconds:.3f} s at load (admission's rate)")

    def _time_prime(self, feeds: dict[str, np.ndarray]) -> float:
        seconds = 0.0
        for _ in range(2):  # the second run is timed, unless the first already took long
            started = time.monotonic()
            run_ragged([feeds], self._run_chunks, self.per_token, self.pad_values, RaggedStats(),
                       token_budget=self.token_budget, single_row_multiple=self.single_row_multiple,
                       max_width=self.max_width, memory=self.memory, row_inputs=self.row_inputs)
            seconds = time.monotonic() - started
            if seconds > PRIME_LONG_S:
                break
        return seconds

    def _synthetic(self, tensor: dict, rows: int, width: int) -> np.ndarray:
        """A flood-like input: every text `width` real tokens (values do not change a dense encoder's time)."""
        dtype = pb_utils.triton_string_to_numpy(tensor["data_type"])
        if tensor["name"] in self.row_inputs:
            return np.zeros((rows, 1), dtype=dtype)
        value = {INPUT_IDS: self.pad_values[INPUT_IDS], ATTENTION_MASK: 1}.get(tensor["name"], 0)
        return np.full((rows, width), value, dtype=dtype)

    def device_memory(self) -> int | None:
        """Bytes of the memory the encoder runs in, where it is not this machine's (a GPU)."""
        return None

    def _run_chunks(self, chunks: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        return [dict(zip(self.output_names, outputs)) for outputs in self.run_chunks(chunks)]

    def finalize(self) -> None:
        if self.dense:
            return
        self.counters.close()
        if self.board is not None:
            self.board.close()

    def execute(self, requests: list) -> list:
        if self.dense:
            return self._execute_dense(requests)
        started = time.monotonic()
        if self.board is not None:
            self.board.started(started)
        tokens: list[int] = []
        try:
            batch = [{name: input_array(request, name) for name in self.input_names} for request in requests]
            if self.board is not None:  # these requests off the tokenizers' log
                tokens = [int(_lengths(feeds).sum()) for feeds in batch]
                self.board.took(tokens, [request_timeout_s(request) for request in requests])
            return self._execute(batch)
        finally:  # every request it was handed is off the queue, answered or not
            if self.board is not None:
                now = time.monotonic()
                self.board.finished(sum(tokens), now - started, now)

    def _execute(self, batch: list[dict[str, np.ndarray]]) -> list:
        responses = [self._too_long(feeds) for feeds in batch]
        runnable = [index for index, refused in enumerate(responses) if refused is None]
        if not runnable:
            return responses
        real, computed = self.stats.real_tokens, self.stats.computed_tokens
        outputs = run_ragged([batch[index] for index in runnable], self._run_chunks, self.per_token, self.pad_values,
                             self.stats, token_budget=self.token_budget, single_row_multiple=self.single_row_multiple,
                             max_width=self.max_width, memory=self.memory, row_inputs=self.row_inputs)
        real = self.stats.real_tokens - real
        self.counters.add("pooltriton_tokens_total", real)
        self.counters.add("pooltriton_padding_tokens_total", self.stats.computed_tokens - computed - real)
        for index, out in zip(runnable, outputs):
            responses[index] = pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, np.ascontiguousarray(v)) for name, v in out.items()])
        return responses

    def _execute_dense(self, requests: list) -> list:
        """The batch's rows concatenated, run in chunks of at most DENSE_CHUNK, split back per request."""
        batch = [{name: input_array(request, name) for name in self.input_names} for request in requests]
        feeds = {name: np.concatenate([f[name] for f in batch]) for name in self.input_names}
        total = len(next(iter(feeds.values())))
        chunks = [{name: v[start:start + DENSE_CHUNK] for name, v in feeds.items()}
                  for start in range(0, total, DENSE_CHUNK)]
        outputs = [np.concatenate(parts) for parts in zip(*self.run_chunks(chunks))]
        responses, start = [], 0
        for feeds_of_one in batch:
            rows = len(next(iter(feeds_of_one.values())))
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, np.ascontiguousarray(v[start:start + rows]))
                 for name, v in zip(self.output_names, outputs)]))
            start += rows
        return responses

    def _too_long(self, feeds: dict[str, np.ndarray]):
        """An error response for a request holding a text whose attention would not fit the memory
        budget even alone (None when it fits): refused before anything runs, the rest of the batch runs."""
        if self.memory is None:
            return None
        longest = int(_lengths(feeds).max(initial=0))
        if self.memory.row_bytes(longest) <= self.memory.budget:
            return None
        gib = 1 << 30
        return error_response(
            f"a text of {longest} tokens needs ~{self.memory.row_bytes(longest) / gib:.1f} GiB in the encoder "
            f"(attention grows with the square of the length), over its memory budget of "
            f"{self.memory.budget / gib:.1f} GiB: at most {self.memory.longest()} tokens fit; send shorter texts "
            "or raise the encoder's memory_budget")


@contextmanager
def _alone(folder: Path) -> Iterator[None]:
    """Held by one process at a time (flock on the folder): encoders loading together would otherwise
    time each other's contention for the cores."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (releases the lock)


def _lengths(feeds: dict[str, np.ndarray]) -> np.ndarray:
    """Real tokens per text of one request (the attention mask's, else its full width)."""
    mask = feeds.get("attention_mask")
    return mask.sum(axis=1) if mask is not None else np.full(len(feeds[INPUT_IDS]), feeds[INPUT_IDS].shape[1])
