"""Precision is chosen by what the CPU really runs: both branches of every capability decision.

The branch this host has runs for real (export, OpenVINO compilation, a served stage); the branch it
lacks is exercised through the detection override (POOLTRITON_CPU_FLAGS), and where a real run of
that branch cannot happen here the test says so in its skip reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tiny_models import build

from pooltriton.client import PoolingClient
from pooltriton.core.capabilities import OVERRIDE_ENV, PrecisionError, choose_precision, detect, load_warning
from pooltriton.export.build import ExportOptions, export_model
from pooltriton.export.defaults import DEFAULT_MODELS, exported_defaults

from conftest import REPOSITORY, edit_config, start_server

HOST = detect()
AVX2 = detect("fpu sse2 avx fma avx2")  # e.g. AMD EPYC family 25
BF16 = detect("avx2 fma avx512f avx512_vnni avx512_bf16")  # e.g. Sapphire Rapids without AMX
BF16_FLAGS_TEXT = "avx2 fma avx512f avx512_bf16"
AMX = detect("avx2 avx512f avx512_bf16 amx_tile amx_bf16 amx_int8")
VNNI = detect("avx2 fma avx512f avx512_vnni")  # e.g. Cascade Lake / Ice Lake: int8, no bf16
NO_BF16_HERE = "this host runs bf16 natively: the no-bf16 branch is covered through the override only"
BF16_HERE = "this host has no AVX512-BF16/AMX: the bf16 branch is covered through the override only"


def test_detection_reads_the_cpu_and_the_runtimes() -> None:
    flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0]
    assert ("avx2" in HOST.flags) == (" avx2" in flags)
    assert HOST.bf16 == any(f" {flag}" in flags for flag in ("avx512_bf16", "amx_bf16"))
    assert HOST.openvino is not None and "FP32" in HOST.openvino
    assert ("BF16" in HOST.openvino) == HOST.bf16  # the CPU flags and OpenVINO agree on this host
    assert HOST.torch and HOST.onnxruntime and "CPUExecutionProvider" in HOST.onnxruntime


def test_override_classes() -> None:
    assert (AVX2.cpu_class, AVX2.bf16, AVX2.vnni) == ("avx2", False, False)
    assert (BF16.cpu_class, BF16.bf16, BF16.vnni) == ("avx512-bf16", True, True)
    assert AMX.cpu_class == "amx" and AMX.bf16
    assert detect("avx2 avx512f avx512_vnni").cpu_class == "avx512-vnni"
    assert AVX2.source == OVERRIDE_ENV and "BF16" not in AVX2.openvino and "BF16" in BF16.openvino


@pytest.mark.parametrize("runtime", ["openvino", "torchscript"])
def test_auto_picks_bf16_only_where_it_runs_natively(runtime: str) -> None:
    # bf16 first where it is native (faster and more exact than int8 where both run); then int8 (VNNI).
    assert choose_precision(runtime, "auto", "cpu", BF16)[0] == "bf16"
    assert choose_precision(runtime, "auto", "cpu", BF16, quantize=False)[0] == "bf16"
    assert choose_precision(runtime, "auto", "cpu", AMX, quantize=False)[0] == "bf16"
    precision, reason = choose_precision(runtime, "auto", "cpu", AVX2)
    assert precision == "fp32" and "avx512_bf16" in reason
    assert choose_precision("onnx", "auto", "cpu", BF16)[0] == "fp32"  # ONNX Runtime here serves fp32 only
    assert choose_precision("torchscript", "auto", "cuda", AVX2)[0] == "fp16"  # the GPU decides, not the CPU


def test_an_explicit_precision_the_cpu_cannot_run_is_refused() -> None:
    with pytest.raises(PrecisionError, match="needs a CPU with avx512_bf16 or amx_bf16"):
        choose_precision("openvino", "bf16", "cpu", AVX2)
    with pytest.raises(PrecisionError, match="avx512_fp16"):
        choose_precision("torchscript", "fp16", "cpu", BF16)
    assert choose_precision("openvino", "bf16", "cpu", BF16) == ("bf16", "as asked")
    assert choose_precision("openvino", "fp32", "cpu", AVX2) == ("fp32", "as asked")


def test_int8_is_refused_without_vnni_or_amx() -> None:
    """int8 matrix work is native with VNNI (AVX-512 or AVX) or AMX; elsewhere it is refused in one line
    and auto never picks it."""
    with pytest.raises(PrecisionError, match="needs a CPU with avx512_vnni or avx_vnni or amx_int8") as refused:
        choose_precision("openvino", "int8", "cpu", AVX2)
    assert "\n" not in str(refused.value) and "here: fp32" in str(refused.value)
    assert choose_precision("openvino", "auto", "cpu", AVX2)[0] == "fp32"
    assert choose_precision("openvino", "int8", "cpu", detect("avx2 avx_vnni")) == ("int8", "as asked")
    assert choose_precision("openvino", "auto", "cpu", AMX)[0] == "bf16"  # bf16 first where it is native
    precision, reason = choose_precision("openvino", "auto", "cpu", VNNI)
    assert precision == "int8" and "avx512_vnni" in reason and "if the quantized model meets its bounds" in reason
    assert choose_precision("openvino", "auto", "cpu", VNNI, quantize=False)[0] == "fp32"
    assert choose_precision("torchscript", "auto", "cpu", VNNI)[0] == "fp32"  # only OpenVINO quantizes


def test_int8_is_verified_and_served_from_openvino_ir(tiny_embedder: Path, tmp_path: Path, monkeypatch,
                                                      capsys) -> None:
    """The int8 branch for real (flags say VNNI; OpenVINO runs the int8 graph on any x86 CPU): NNCF
    quantizes, verification checks cosine and neighbours and fails the tiny random model at a bound
    tighter than int8 can meet (accuracy control tries the smallest group and keeps products out of int8
    first); with a looser --tolerance it passes, writes model.xml and the verification report, and
    Triton serves it in int8."""
    from pooltriton.cli import main

    monkeypatch.setenv(OVERRIDE_ENV, "avx2 fma avx512f avx512_vnni")
    assert main(["export", str(tiny_embedder), "--name", "x", "--out", str(tmp_path), "--runtime", "openvino",
                 "--precision", "int8", "--tolerance", "0.00002"]) == 1
    err = capsys.readouterr().err
    # Which bound it names depends on the CPU (cosine and neighbours, or too few products left in int8).
    assert "verification failed" in err and "Nothing was written" in err and "Traceback" not in err, err[-2000:]
    assert not list(tmp_path.glob("x*"))

    assert main(["export", str(tiny_embedder), "--name", "x", "--out", str(tmp_path), "--runtime", "openvino",
                 "--precision", "int8", "--tolerance", "0.02"]) == 0
    encoder = tmp_path / "x_encoder"
    report = json.loads((encoder / "verification.json").read_text())
    assert report["precision"] == report["executed_precision"] == "int8" and report["passed"]
    quantization = report["quantization"]
    assert report["retrieval"]["queries"] == 200 and quantization["validation_texts"] == 400
    assert quantization["activation_group"] == 128  # the loose tolerance lets the fastest group through
    assert quantization["int8_products"] + len(quantization["kept_out_of_int8"]) == quantization["products"] > 0
    assert sorted(p.name for p in (encoder / "1").iterdir()) == ["model.bin", "model.xml"]
    texts = ["one two three", "a query about the python language", "the model reads text"]
    server = start_server(tmp_path, tmp_path / "server.log")
    try:
        with PoolingClient(server.grpc_url, protocol="grpc") as client:
            served = client.embed(texts, model="x")
    finally:
        assert server.stop() == 0
    from sentence_transformers import SentenceTransformer

    expected = SentenceTransformer(str(tiny_embedder), device="cpu").encode(texts, normalize_embeddings=True)
    cosines = np.sum(served * expected, axis=1)
    assert cosines.min() >= 1 - 5 * 0.02 and cosines.min() < 1 - 1e-6, cosines  # int8: close, not exact


def test_int8_export_is_refused_on_a_cpu_without_vnni(tiny_embedder: Path, tmp_path: Path, monkeypatch,
                                                       capsys) -> None:
    code, err = _export(tiny_embedder, tmp_path, "x", "int8", monkeypatch, "avx2 fma", capsys)
    assert code == 2 and "needs a CPU with avx512_vnni" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())


def test_default_models_follow_the_cpu() -> None:
    assert exported_defaults(AVX2) == ["minilm", "minilm_tokens", "rampart"]
    assert exported_defaults(BF16) == [model.name for model in DEFAULT_MODELS]
    bf16_model = next(model for model in DEFAULT_MODELS if model.name == "minilm_bf16")
    assert "does not run bf16 natively" in bf16_model.unsupported(AVX2) and bf16_model.unsupported(AMX) is None
    int8_model = next(model for model in DEFAULT_MODELS if model.name == "minilm_int8")
    assert "does not run int8 natively" in int8_model.unsupported(AVX2) and int8_model.unsupported(AMX) is None
    assert exported_defaults(detect("avx2 fma avx512f avx512_bf16")) == [
        "minilm", "minilm_bf16", "minilm_tokens", "rampart"]  # bf16 without VNNI: no int8


def test_the_default_repository_has_what_this_cpu_runs() -> None:
    for name in (model.name for model in DEFAULT_MODELS):
        assert (REPOSITORY / name).is_dir() == (name in exported_defaults(HOST)), name


def test_stage_load_warning_both_branches() -> None:
    assert "computes it in fp32" in load_warning("bf16", "fp32", AVX2)
    assert "emulated" in load_warning("bf16", "bf16", AVX2)
    assert load_warning("bf16", "bf16", BF16) is None and load_warning("fp32", "fp32", AVX2) is None
    # an int8 repository built on a VNNI host and served on one without: said at load, not silent
    assert "emulated" in load_warning("int8", "int8", AVX2) and load_warning("int8", "int8", VNNI) is None


def test_capabilities_command(capsys) -> None:
    from pooltriton.cli import main

    assert main(["capabilities"]) == 0
    out = capsys.readouterr().out
    assert f"({HOST.cpu_class})" in out and "OPTIMIZATION_CAPABILITIES" in out and "--precision auto" in out
    assert main(["capabilities", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["class"] == HOST.cpu_class and summary["auto_precision"]["onnx"] == "fp32"


@pytest.fixture(scope="module")
def tiny_embedder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("tiny"), "bert", "embed", sentence_transformers_pooling="mean_tokens")


def _export(folder: Path, out: Path, name: str, precision: str, monkeypatch=None, flags: str | None = None,
            capsys=None) -> tuple[int, str]:
    from pooltriton.cli import main

    if flags is not None:
        monkeypatch.setenv(OVERRIDE_ENV, flags)
    code = main(["export", str(folder), "--name", name, "--out", str(out), "--runtime", "openvino",
                 "--precision", precision])
    return code, capsys.readouterr().err if capsys else ""


def test_auto_export_runs_what_it_reports(tiny_embedder: Path, tmp_path: Path, capsys) -> None:
    """Real export on this host: auto's choice is what OpenVINO really compiled, read back."""
    code, err = _export(tiny_embedder, tmp_path, "auto", "auto", capsys=capsys)
    assert code == 0, err
    expected = "bf16" if HOST.bf16 else "fp32"
    if not HOST.bf16 and HOST.vnni and "int8 missed its bounds" not in err:  # int8 where it meets its bounds
        expected = "int8"
    assert f"--precision auto: {expected}" in err and f"ran {expected}" in err
    report = json.loads((tmp_path / "auto_encoder" / "verification.json").read_text())
    assert report["precision"] == report["executed_precision"] == expected and report["passed"]
    assert report["capabilities"]["class"] == HOST.cpu_class
    from pooltriton.contract.config import parse_config

    config = parse_config(tmp_path / "auto_encoder" / "config.pbtxt")
    assert config.parameters["HINT_BF16"].string_value == ("YES" if expected in ("bf16", "int8") else "NO")


def test_auto_falls_back_when_int8_misses_its_bounds(tiny_embedder: Path, tmp_path: Path, monkeypatch,
                                                     capsys) -> None:
    """On a VNNI CPU without bf16 auto tries int8; at a bound tighter than int8 can meet (and fp32 can)
    int8 misses it, and the export says so and writes fp32 instead."""
    from pooltriton.cli import main

    monkeypatch.setenv(OVERRIDE_ENV, "avx2 fma avx512f avx512_vnni")
    code = main(["export", str(tiny_embedder), "--name", "x", "--out", str(tmp_path), "--runtime", "openvino",
                 "--precision", "auto", "--tolerance", "0.00002"])
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    assert "--precision auto: int8" in err and "--precision auto: fp32 (int8 missed its bounds" in err
    report = json.loads((tmp_path / "x_encoder" / "verification.json").read_text())
    assert report["precision"] == report["executed_precision"] == "fp32" and report["passed"]
    assert sorted(p.name for p in (tmp_path / "x_encoder" / "1").iterdir()) == ["model.onnx"]


@pytest.mark.skipif(HOST.bf16, reason=NO_BF16_HERE)
def test_bf16_is_refused_on_a_cpu_without_it(tiny_embedder: Path, tmp_path: Path, capsys) -> None:
    code, err = _export(tiny_embedder, tmp_path, "x", "bf16", capsys=capsys)
    assert code == 2 and "needs a CPU with avx512_bf16 or amx_bf16" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())


def openvino_compiles_bf16() -> bool:
    """Whether OpenVINO's CPU plugin compiles a bf16 request in bf16 here, asked of OpenVINO itself on one
    matrix product: natively with avx512_bf16 or AMX, emulated on other AVX-512 CPUs, in fp32 on AVX2."""
    import openvino as ov
    from openvino import opset13 as ops

    feed = ops.parameter([2, 16], np.float32)
    model = ov.Model([ops.matmul(feed, ops.constant(np.ones((16, 16), np.float32)), False, False)], [feed])
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "bf16"})
    return compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name() == "bf16"


def test_verification_reads_back_what_openvino_compiled(tiny_embedder: Path, tmp_path: Path, monkeypatch,
                                                         capsys) -> None:
    """Told (falsely, on a host without bf16) that the CPU has bf16, the export asks OpenVINO for bf16: the
    compiled model's read-back precision decides. Where OpenVINO compiles it in fp32 (AVX2) the export
    fails and writes nothing; where it compiles bf16 (native, or emulated on AVX-512) it passes and
    records bf16."""
    code, err = _export(tiny_embedder, tmp_path, "x", "bf16", monkeypatch, BF16_FLAGS_TEXT, capsys)
    if openvino_compiles_bf16():
        assert code == 0, err
        report = json.loads((tmp_path / "x_encoder" / "verification.json").read_text())
        assert report["executed_precision"] == "bf16"
    else:
        assert code == 1, err
        assert "asked for bf16 but compiled the encoder in fp32" in err and "Traceback" not in err
        assert not list(tmp_path.glob("x*"))


def test_a_stage_warns_when_its_export_precision_does_not_run_here(tiny_embedder: Path, tmp_path: Path) -> None:
    """A repository exported for bf16 (config HINT_BF16 YES and precision bf16, as on a bf16 machine) served
    here: the encoder logs a warning where this CPU has no bf16 (computed in fp32, or emulated), and none
    where it has; answers stay exact."""
    export_model(tiny_embedder, ExportOptions(name="tiny", out=tmp_path, runtime="openvino"))
    config = tmp_path / "tiny_encoder" / "config.pbtxt"

    def bf16(message) -> None:
        assert message.parameters["HINT_BF16"].string_value == "NO"
        message.parameters["HINT_BF16"].string_value = "YES"
        assert message.parameters["precision"].string_value == "fp32"
        message.parameters["precision"].string_value = "bf16"

    edit_config(config, bf16)
    log = tmp_path / "server.log"
    server = start_server(tmp_path, log)
    try:
        with PoolingClient(server.grpc_url, protocol="grpc") as client:
            vectors = client.embed(["one two three", "query"], model="tiny")
    finally:
        assert server.stop() == 0
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    text = log.read_text()
    warned = "tiny_encoder: exported for bf16" in text
    assert warned == (not HOST.bf16), text[-3000:]
    if warned:  # AVX2: OpenVINO computes it in fp32; other AVX-512: it emulates bf16
        said = "it is emulated" if openvino_compiles_bf16() else f"this CPU ({HOST.cpu_class}) computes it in fp32"
        assert said in text, text[-3000:]
