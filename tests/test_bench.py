"""The benchmark runs end to end on a tiny corpus (no timing assertions: machines are shared)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPOSITORY


def test_benchmark_end_to_end(tmp_path) -> None:
    out = tmp_path / "bench"
    result = subprocess.run(
        [sys.executable, "-m", "pooltriton.clients.bench", "--repository", str(REPOSITORY), "--out", str(out),
         "--texts", "48", "--concurrency", "1,2", "--latency-texts", "3"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "x B" in result.stdout and "Triton gRPC, 2 clients x 32" in result.stdout
    data = json.loads((out / "bench.json").read_text())
    assert {"baseline_sorted", "baseline_corpus_order", "served", "served_short", "served_latency",
            "peak_rss_mb"} <= set(data)
    served = data["served"][-1]
    assert served["tokens_per_s"] > 0 and 0 <= served["padding_pct"] < 100 and served["avg_encoder_batch"] >= 1
    assert set(served["time_share_pct"]) == {"tokenizer", "encoder", "pooler"}
    assert (out / "throughput.png").stat().st_size > 1000
