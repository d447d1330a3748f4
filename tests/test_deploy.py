"""Deployment files, checked offline: every Kubernetes overlay renders (`kubectl kustomize`), core
resources pass `kubernetes-validate --strict`, custom resources (KServe, Prometheus Operator) validate
against their CRDs' vendored schemas, the Prometheus config passes `promtool check config`, every metric
the Grafana dashboard queries exists on a live server, and every config of the CPU and GPU exports
parses as Triton's ModelConfig (the GPU one with KIND_GPU native encoders and no ragged inputs)."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from pooltriton.contract.config import parse_config

from conftest import REPOSITORY, running_gateway

ROOT = Path(__file__).resolve().parent.parent
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(p.name for p in (KUBERNETES / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
SCHEMAS = KUBERNETES / "schemas"
CRDS = {  # (apiVersion, kind) -> vendored CRD file
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "serving.kserve.io_servingruntimes.yaml.gz",
    ("serving.kserve.io/v1beta1", "InferenceService"): "serving.kserve.io_inferenceservices.yaml.gz",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml.gz",
}
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "pooltriton.json"


def _render(overlay: str) -> list[dict]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (it renders kustomize offline)")
    result = subprocess.run(["kubectl", "kustomize", str(KUBERNETES / "overlays" / overlay)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_overlays_exist() -> None:
    assert {"cpu", "gpu", "pvc", "kserve"} <= set(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates(overlay: str, tmp_path: Path) -> None:
    documents = _render(overlay)
    core = [d for d in documents if (d["apiVersion"], d["kind"]) not in CRDS]
    custom = [d for d in documents if (d["apiVersion"], d["kind"]) in CRDS]
    # Every resource is either core Kubernetes (validated below) or a custom resource with a vendored CRD.
    assert documents and all("." not in d["apiVersion"].split("/")[0] for d in core), core
    if core:
        rendered = tmp_path / "core.yaml"
        rendered.write_text(yaml.safe_dump_all(core))
        result = subprocess.run([str(Path(sys.executable).parent / "kubernetes-validate"), "--strict", "--quiet",
                                 str(rendered)], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
    for document in custom:
        errors = _crd_errors(document)
        assert not errors, f"{document['kind']}/{document['metadata']['name']}: {errors[:5]}"


def test_overlays_have_what_production_needs() -> None:
    cpu = {(d["kind"], d["metadata"]["name"]): d for d in _render("cpu")}
    triton = cpu[("Deployment", "pooltriton-triton")]["spec"]["template"]["spec"]
    container = triton["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    shm = next(v for v in triton["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"mountPath": "/dev/shm", "name": "dshm"} in container["volumeMounts"]
    hpa = cpu[("HorizontalPodAutoscaler", "pooltriton-triton")]["spec"]
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "pooltriton_queue_time_ms"
    assert ("ServiceMonitor", "pooltriton") in cpu
    gpu = {(d["kind"], d["metadata"]["name"]): d for d in _render("gpu")}
    resources = gpu[("Deployment", "pooltriton-triton")]["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 1
    pvc = {(d["kind"], d["metadata"]["name"]): d for d in _render("pvc")}
    assert ("PersistentVolumeClaim", "pooltriton-models") in pvc
    kserve = {d["kind"]: d for d in _render("kserve")}
    model = kserve["InferenceService"]["spec"]["predictor"]["model"]
    assert model["protocolVersion"] == "v2" and model["storageUri"] and model["runtime"] == "pooltriton"
    assert "v2" in kserve["ServingRuntime"]["spec"]["protocolVersions"]


def _crd_errors(document: dict) -> list[str]:
    import jsonschema

    crd = yaml.safe_load(gzip.decompress((SCHEMAS / CRDS[(document["apiVersion"], document["kind"])]).read_bytes()))
    version = document["apiVersion"].split("/")[1]
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]
    validator = jsonschema.Draft7Validator(_strict(schema))
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def _strict(schema: dict) -> dict:
    """An API server prunes unknown fields silently; here they are errors (a typo is not lost quietly).
    Kubernetes' int-or-string extension becomes the JSON Schema it means."""
    schema = dict(schema)
    if schema.pop("x-kubernetes-int-or-string", False):
        schema["type"] = ["integer", "string"]
    if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        schema.setdefault("additionalProperties", False)
    for key in ("properties", "patternProperties"):
        if key in schema:
            schema[key] = {name: _strict(sub) for name, sub in schema[key].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            schema[key] = _strict(schema[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in schema:
            schema[key] = [_strict(sub) for sub in schema[key]]
    return schema


def test_crd_validation_catches_mistakes() -> None:
    runtime = next(d for d in _render("kserve") if d["kind"] == "ServingRuntime")
    assert not _crd_errors(runtime)
    typo = json.loads(json.dumps(runtime))
    typo["spec"]["protocolVersion"] = typo["spec"].pop("protocolVersions")
    assert _crd_errors(typo)
    wrong = json.loads(json.dumps(runtime))
    wrong["spec"]["containers"][0]["ports"][0]["containerPort"] = "eighty"
    assert _crd_errors(wrong)


def test_prometheus_config_passes_promtool() -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian's prometheus package; `make deploy-tools`)")
    result = subprocess.run(["promtool", "check", "config", str(ROOT / "deploy" / "prometheus" / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def dashboard_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    names = {m for e in expressions for m in re.findall(r"\b((?:nv|pooltriton)_[a-z_]+)", e)}
    return {re.sub(r"_(bucket|sum|count)$", "", n) if "duration_seconds" in n else n for n in names}


def test_dashboard_queries_only_metrics_a_live_server_has(server, minilm_st) -> None:
    needed = dashboard_metrics()
    assert {"nv_inference_request_success", "nv_inference_queue_duration_us", "nv_inference_count",
            "nv_inference_exec_count", "pooltriton_padding_tokens_total", "nv_inference_request_failure",
            "nv_inference_request_summary_us", "pooltriton_gateway_request_duration_seconds"} <= needed
    with running_gateway(server.grpc_url, admin_key=server.admin_key) as url:
        answer = httpx.post(f"{url}/v1/embeddings", json={"model": "minilm", "input": ["a", "b"]}, timeout=60)
        assert answer.status_code == 200
        exposed = httpx.get(server.metrics_url, timeout=10).text + httpx.get(f"{url}/metrics", timeout=10).text
    present = set(re.findall(r"^([a-z_]+)[{ ]", exposed, re.M))
    present |= {re.sub(r"_(bucket|sum|count)$", "", n) for n in present}
    assert needed <= present, sorted(needed - present)


def _configs(repository: Path) -> dict[str, object]:
    return {path.parent.name: parse_config(path) for path in sorted(repository.glob("*/config.pbtxt"))}


def test_every_cpu_config_is_triton_configuration() -> None:
    from tritonclient.grpc import model_config_pb2

    configs = _configs(REPOSITORY)
    assert "minilm" in configs and len(configs) >= 10
    encoders = [c for name, c in configs.items() if name.endswith("_encoder")]
    assert encoders and all(g.kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
                            for c in encoders for g in c.instance_group)


@pytest.fixture(scope="module")
def gpu_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The GPU image's repository, exported as its Dockerfile stage does (on this CPU)."""
    out = tmp_path_factory.mktemp("gpu_repository")
    result = subprocess.run([sys.executable, "-m", "pooltriton.cli", "defaults", "--device", "cuda", "--tensorrt",
                             "--out", str(out)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_every_gpu_config_is_triton_configuration_with_native_gpu_encoders(gpu_repository: Path) -> None:
    from tritonclient.grpc import model_config_pb2

    configs = _configs(gpu_repository)
    assert {"minilm", "minilm_tokens", "rampart", "minilm_zero_shot"} <= set(configs)
    encoders = {name: c for name, c in configs.items() if name.endswith("_encoder")}
    assert set(encoders) == {"minilm_encoder", "minilm_tokens_encoder", "rampart_encoder"}
    for name, config in encoders.items():
        assert config.backend == "onnxruntime", name
        assert [g.kind for g in config.instance_group] == [model_config_pb2.ModelInstanceGroup.KIND_GPU], name
        accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
        assert [a.name for a in accelerators] == ["tensorrt"] and accelerators[0].parameters["precision_mode"] == "FP32"
        assert (gpu_repository / name / "1" / "model.onnx").is_file()
    for name, config in configs.items():
        assert not any(t.allow_ragged_batch for t in config.input), name
    tokenizer = json.loads(dict(configs["minilm_tokenizer"].parameters)["pad_to_buckets"].string_value)
    assert tokenizer and tokenizer == sorted(tokenizer)


@pytest.mark.parametrize("profile", ["cpu", "gpu", "monitoring"])
def test_compose_profiles_are_valid(profile: str) -> None:
    """The GPU profile cannot run here (no NGC image, no GPU): its file is checked by compose itself."""
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose is not installed (`make deploy-tools`)")
    result = subprocess.run(["docker-compose", "--profile", profile, "config"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    for name, service in services.items():
        assert service.get("network_mode") == "host", name  # loopback ports only (no bridge networks)
    if profile == "gpu":
        gpu = services["triton-gpu"]
        assert gpu["build"]["target"] == "gpu" and gpu["shm_size"]
        assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
        assert gpu["environment"]["POOLTRITON_GATEWAY_PORT"] == "8080"  # the gateway runs beside Triton
    if profile == "cpu":
        assert services["triton-cpu"]["build"]["target"] == "cpu" and services["triton-cpu"]["shm_size"]


def test_dockerfile_stages() -> None:
    """The image stages as documented (the CPU one is also built for real in test_image.py)."""
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+) AS (\S+)$", text, re.M)
    # cpu before the GPU stages: a classic builder (no BuildKit) with --target cpu never reaches them.
    assert stages == [("${BASE_IMAGE}", "export"), ("${BASE_IMAGE}", "cpu"), ("export", "export-gpu"),
                      ("${TRITON_IMAGE}", "gpu")]
    assert "ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:24.10-py3" in text
    assert "ARG BASE_IMAGE=debian:bookworm-slim" in text
    for stage in ("cpu", "gpu"):
        body = text.split(f" AS {stage}\n", 1)[1].split("\nFROM ", 1)[0]
        assert "USER 1000" in body and "HEALTHCHECK" in body and 'ENTRYPOINT ["pooltriton", "serve"' in body, stage
    assert "--device cuda" in text and "backends --native" in text


def test_gpu_repository_answers_like_the_cpu_one(gpu_repository: Path, tmp_path: Path, grpc_client) -> None:
    """The GPU repository's files and bucket padding, served here by the onnxruntime stand-in on the CPU
    (instances made KIND_CPU, TensorRT dropped: the only edits), answer as the default CPU repository
    does (whose answers are checked against the references elsewhere): every public model, every task."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from pooltriton.client import PoolingClient

    from conftest import start_server

    repository = tmp_path / "gpu_on_cpu"
    shutil.copytree(gpu_repository, repository)
    for path in repository.glob("*/config.pbtxt"):  # edited as Triton's own message, written back by text_format
        config = parse_config(path)
        for group in config.instance_group:
            group.kind = model_config_pb2.ModelInstanceGroup.KIND_CPU
        config.ClearField("optimization")
        path.write_text(text_format.MessageToString(config))
    texts = ["A man is eating food.", "My name is Jane Doe and my email is jane.doe@example.com.",
             "A much longer sentence " * 20, "x"]
    server = start_server(repository, tmp_path / "server.log")
    try:
        with PoolingClient(server.grpc_url, protocol="grpc") as gpu:
            np.testing.assert_allclose(gpu.embed(texts, model="minilm"), grpc_client.embed(texts, model="minilm"),
                                       atol=1e-5)
            for model in ("minilm_tokens", "rampart"):
                served, expected = gpu.encode(texts, model=model), grpc_client.encode(texts, model=model)
                assert [len(v) for v in served] == [len(v) for v in expected], model  # padding cut off
                for got, want in zip(served, expected):
                    np.testing.assert_allclose(got, want, atol=1e-5)
            np.testing.assert_allclose(gpu.score(texts[0], texts[1:], model="minilm"),
                                       grpc_client.score(texts[0], texts[1:], model="minilm"), atol=1e-5)
    finally:
        assert server.stop() == 0
