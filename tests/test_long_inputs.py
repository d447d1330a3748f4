"""Long inputs: a ModernBERT at its real 8,192-token limit serves an 8,192-token text, and a
batch of them, equal to transformers, within the memory the ragged planner allows one encoder call;
a text that cannot fit that memory even alone is refused with a clear 400 while the rest keeps serving.

Attention is quadratic: one 8,192-token row holds heads x 8,192^2 scores per layer (1 GiB per copy at
4 heads). The peak memory of the encoder's process is measured and reported (`-s` prints it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from tiny_models import LONG, build
from transformers import AutoModel, AutoTokenizer
from tritonclient.utils import InferenceServerException

from pooltriton.backends.ragged import MemoryModel, memory_budget
from pooltriton.client import PoolingClient
from pooltriton.contract import stages
from pooltriton.core.activation import normalize
from pooltriton.export.graphs import CACHE_ENV

from conftest import graph_cache, start_server
from corpus import VOCABULARY

NAME = "long"
# The same model exported with a 1 GiB encoder memory budget. (Reloading the encoder with a config
# override instead crashed Triton 2.51 now and then: "malloc(): unaligned fastbin chunk detected" when a
# Python-backend model is loaded again while its previous instance is still unloading.)
SMALL = "long_1gib"
LIMIT = 8192
MAX_ABS = 1e-5
GIB = 1 << 30


def text_of(tokens: int, seed: int) -> str:
    """A text of exactly `tokens` tokens with [CLS] and [SEP] (the tiny vocabulary is one word per token)."""
    rng = np.random.default_rng(seed)
    words = sorted({w for phrase in VOCABULARY for w in phrase.lower().replace(".", " ").split() if w.isalpha()})
    return " ".join(rng.choice(words, size=tokens - 2))


@pytest.fixture(scope="module")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("long_model"), LONG, "embed")


@pytest.fixture(scope="module")
def server(long_model: Path, tmp_path_factory: pytest.TempPathFactory):
    repository = tmp_path_factory.mktemp("long_repository")
    # Exported by the CLI in a process of its own: verifying 8k-token texts peaks at ~17 GB,
    # which a long-lived test process would keep (the allocator does not give it back).
    for name, extra in ((NAME, []), (SMALL, ["--memory-budget-mb", "1024"])):
        done = subprocess.run([sys.executable, "-m", "pooltriton.cli", "export", str(long_model), "--name", name,
                               "--out", str(repository), "--runtime", "onnx", *extra], capture_output=True, text=True,
                              timeout=1200, env={**os.environ, CACHE_ENV: graph_cache()})  # one trace of the two
        assert done.returncode == 0, done.stderr[-3000:]
        # Its own step lines and verification only: no torch warnings, no loading bars.
        chatter = [line for line in (done.stdout + done.stderr).splitlines()
                   if "torchvision" in line or "it/s]" in line]
        assert not chatter, chatter[:3]
    server = start_server(repository, repository / "server.log")
    yield server
    assert server.stop() == 0


def reference(folder: Path, text: str) -> np.ndarray:
    """transformers' own ModernBertModel on the text alone, CLS pooled and normalised (vLLM's default)."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    encoded = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**{k: encoded[k] for k in ("input_ids", "attention_mask")}).last_hidden_state[0].numpy()
    return normalize(hidden[:1])[0]


def encoder_process_memory(name: str) -> tuple[int, int]:
    """(resident, peak resident) bytes of the Python stub that runs `name`'s encoder."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if b"triton_python_backend_stub" in command[0] and any(stages(name).encoder.encode() in a for a in command):
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            return int(fields["VmRSS"].split()[0]) << 10, int(fields["VmHWM"].split()[0]) << 10
    raise LookupError(f"no stub process runs {stages(name).encoder}")


def memory_model(server) -> MemoryModel:
    with httpclient.InferenceServerClient(server.http_url) as client:
        parameters = client.get_model_config(stages(NAME).encoder)["parameters"]
    value = {key: int(entry["string_value"]) for key, entry in parameters.items() if key.startswith("memory_")}
    # One instance running one chunk at a time (onnxruntime): the whole budget is one call's.
    return MemoryModel(value["memory_per_token"], value["memory_per_attention_cell"],
                       memory_budget(value["memory_budget"], 1))


def test_an_8k_text_and_a_batch_of_them_are_served_within_the_planned_memory(server, long_model: Path) -> None:
    texts = [text_of(LIMIT, seed) for seed in range(3)]
    expected = [reference(long_model, text) for text in texts[:2]]
    model = memory_model(server)
    with PoolingClient(server.grpc_url, protocol="grpc", model=NAME) as client:
        assert client.tokenize(texts[0], model=NAME)[0].__len__() == LIMIT
        resident, _ = encoder_process_memory(NAME)
        one = client.embed(texts[0], model=NAME)
        _, peak_one = encoder_process_memory(NAME)
        batch = client.embed(texts, model=NAME)
        _, peak_batch = encoder_process_memory(NAME)
    assert np.abs(one[0] - expected[0]).max() <= MAX_ABS
    for got, want in zip(batch, expected):
        assert np.abs(got - want).max() <= MAX_ABS
    planned = model.row_bytes(LIMIT)
    print(f"\nencoder process: resident {resident / GIB:.2f} GiB before; peak {peak_one / GIB:.2f} GiB after one "
          f"{LIMIT}-token text, {peak_batch / GIB:.2f} GiB after a batch of 3; planned per row {planned / GIB:.2f} "
          f"GiB, budget per call {model.budget / GIB:.1f} GiB")
    # The memory model must not underestimate: one row's growth stays within what the planner counts.
    assert peak_one - resident <= planned
    # A batch of 8k rows never runs more of them at once than the budget holds.
    rows_at_once = max(1, model.budget // planned)
    assert peak_batch - resident <= rows_at_once * planned


def test_a_text_over_the_memory_budget_is_refused_and_shorter_ones_still_serve(server) -> None:
    """The encoder exported with a 1 GiB budget: an 8k text needs ~5 GiB and is refused with a 400 that
    says why; a 2k text still serves."""
    with httpclient.InferenceServerClient(server.http_url) as triton:
        parameters = triton.get_model_config(stages(SMALL).encoder)["parameters"]
    assert int(parameters["memory_budget"]["string_value"]) == GIB
    budget = MemoryModel(int(parameters["memory_per_token"]["string_value"]),
                         int(parameters["memory_per_attention_cell"]["string_value"]), GIB)
    with PoolingClient(server.grpc_url, protocol="grpc", model=SMALL) as client:
        with pytest.raises(InferenceServerException) as refused:
            client.embed(text_of(LIMIT, 0), model=SMALL)
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert f"a text of {LIMIT} tokens" in refused.value.message()
        assert f"at most {budget.longest()} tokens fit" in refused.value.message()
        assert client.embed(text_of(2048, 1), model=SMALL).shape == (1, 128)
