"""The benchmark runs end to end on a tiny corpus (no timing assertions: machines are shared)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.bench import MINILM_MODELS
from pooltriton.core.capabilities import detect
from pooltriton.export.defaults import exported_defaults

from conftest import REPOSITORY

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench.py"


@pytest.mark.server
def test_image_benchmark_end_to_end(tmp_path) -> None:
    """bench/images.py on a tiny tower: B and the served path at two client counts, stage shares."""
    out = tmp_path / "bench"
    result = subprocess.run([sys.executable, str(BENCH.parent / "images.py"), "--size", "tiny", "--images", "24",
                             "--clients", "1,4", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"served,  4 clients: +[\d.]+ images/s +[\d.]+ x B", result.stdout), result.stdout
    data = json.loads((out / "images.json").read_text())
    assert [s["clients"] for s in data["served"]] == [1, 4] and len(data["baseline"]) == 2
    assert set(data["stage_shares"]) == {"clip_image_processor", "clip_image_encoder"}
    assert abs(sum(data["stage_shares"].values()) - 1) < 1e-9
    assert [p.name for p in out.iterdir() if p.name.startswith("pooltriton-images-")] == []  # its repository went


@pytest.mark.server
def test_benchmark_end_to_end(tmp_path) -> None:
    out = tmp_path / "bench"
    result = subprocess.run(
        [sys.executable, str(BENCH), "--repository", str(REPOSITORY), "--out", str(out),
         "--texts", "48", "--concurrency", "1,2", "--latency-texts", "3", "--overload-clients", "4",
         "--overload-requests", "1", "--deadline-s", "30"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "x B" in result.stdout and "Triton minilm, 2 clients x 32" in result.stdout
    # The header says what this CPU runs; bf16 is measured where the CPU runs it, and only there.
    capabilities = detect()
    # Every MiniLM export this CPU runs is measured; sizing is printed for the last one.
    models = [m for m in MINILM_MODELS if m in exported_defaults(capabilities)]
    sized = models[-1]
    assert re.search(rf"queue sizing \({sized}, 32-text requests\): [\d.]+ requests/s x 30 s timeout -> "
                     r"at most --queue-size \d+", result.stdout), result.stdout
    assert f"({capabilities.cpu_class})" in result.stdout and "--precision auto (openvino) on this CPU" in result.stdout
    assert ("Triton minilm_bf16, 2 clients x 32" in result.stdout) == capabilities.bf16
    assert ("Triton minilm_int8, 2 clients x 32" in result.stdout) == capabilities.vnni
    data = json.loads((out / "bench.json").read_text())
    assert {"baseline_sorted", "baseline_corpus_order", "served", "served_short", "served_latency",
            "long_served_latency", "gateway_latency", "peak_rss_mb"} <= set(data)
    # One idle text per path is measured on short texts (the bound) and on long ones.
    assert "single short text: Triton minilm" in result.stdout and "single long text: B" in result.stdout
    assert "gateway - gRPC (minilm, one idle short text)" in result.stdout
    assert "gateway: one idle http exchange (404), no work done: p50" in result.stdout
    assert data["machine"]["capabilities"]["class"] == capabilities.cpu_class
    assert [r["model"] for r in data["served"]] == [m for m in models for _ in (1, 2)]
    served = data["served"][-1]
    assert served["tokens_per_s"] > 0 and 0 <= served["padding_pct"] < 100 and served["avg_encoder_batch"] >= 1
    assert set(served["time_share_pct"]) == {"tokenizer", "encoder"}  # an embed ensemble has no pooler
    assert (out / "throughput.png").stat().st_size > 1000
    # Overload through the gateway with admission: every request answered or refused, nothing else.
    overload = data["overload"]
    assert overload["requests"] == 4 and overload["answered"] + overload["refused"] == 4 and overload["other"] == 0
    assert "overload (minilm, 4 clients, 4 requests of 32 long texts, deadline 30 s" in result.stdout
    direct = data["overload_grpc"]
    assert direct["requests"] == 4 and direct["answered"] + direct["refused"] == 4 and direct["other"] == 0
    cold = data["overload_kserve_http"]  # the fresh server's first traffic, over KServe HTTP
    assert cold["requests"] == 4 and cold["answered"] + cold["refused"] == 4 and cold["expired"] == cold["other"] == 0
    assert cold["answered"] and cold["answered_tokens_per_s"] > 0 and "goodput: " in result.stdout
    assert "overload (minilm, 4 clients, 4 requests of 32 long texts, raw gRPC callers" in result.stdout


@pytest.mark.server
def test_gpu_benchmark_script_runs_on_the_cpu(tmp_path) -> None:
    """scripts/gpu_bench.sh without a GPU: TorchScript export, Triton, B on the same model.pt."""
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "gpu"
    # Small passes: the script's steps are under test here, not the speed (make bench-gpu runs them whole).
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "TEXTS": "32", "CONCURRENCY": "1,2",
           "LATENCY_TEXTS": "5", "OVERLOAD_CLIENTS": "4", "OVERLOAD_REQUESTS": "1"}
    result = subprocess.run([str(root / "scripts" / "gpu_bench.sh")], capture_output=True, text=True,
                            timeout=600, env=env)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    assert "no GPU: running the same steps on the CPU (fp32)" in result.stdout
    from pooltriton.contract.config import parse_config

    encoder = parse_config(out / "repository" / "minilm_encoder" / "config.pbtxt")
    assert encoder.backend == "pytorch" and encoder.instance_group[0].kind == encoder.instance_group[0].KIND_CPU
    data = json.loads((out / "bench.json").read_text())
    assert data["models"] == ["minilm"] and data["baseline_sorted"]["tokens_per_s"] > 0
    assert all(r["tokens_per_s"] > 0 for r in data["served"])
