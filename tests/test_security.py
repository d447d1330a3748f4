"""Safe defaults at export: names that cannot leave the repository folder, no pickled weights and no
model code unless asked for (the threat model: a model folder or a name is untrusted input)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tiny_models import build

from pooltriton.cli import main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("tiny"), "bert", "embed", sentence_transformers_pooling="mean_tokens")


def _export(folder: Path, out: Path, *extra: str, name: str = "tiny") -> int:
    return main(["export", str(folder), f"--name={name}", "--out", str(out), *extra])


@pytest.mark.parametrize("name", ["../evil", "a/b", "..", "x..y", "/abs", "", "-dash", "sp ace"])
def test_export_refuses_names_that_are_not_plain(tiny: Path, tmp_path: Path, capsys, name: str) -> None:
    out = tmp_path / "repo"
    assert _export(tiny, out, name=name) == 2
    assert "invalid model name" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "evil_encoder").exists()


def test_plugin_refuses_bad_names_and_modules(tmp_path: Path, capsys) -> None:
    assert main(["plugin", "ok", "--plugin", "zero_shot", "--module", "os; import x", "--model", "m",
                 "--out", str(tmp_path)]) == 2
    assert "invalid plugin module" in capsys.readouterr().err
    assert main(["plugin", "../up", "--plugin", "zero_shot", "--model", "m", "--out", str(tmp_path)]) == 2
    assert "invalid model name" in capsys.readouterr().err


def test_pickled_weights_are_refused_unless_allowed(tiny: Path, tmp_path: Path, capsys) -> None:
    import torch
    from transformers import AutoModel

    pickled = tmp_path / "pickled"
    shutil.copytree(tiny, pickled)
    for weights in pickled.glob("*.safetensors"):
        weights.unlink()
    torch.save(AutoModel.from_pretrained(tiny).state_dict(), pickled / "pytorch_model.bin")
    assert _export(pickled, tmp_path / "repo") == 2
    assert "only pickled weights (pytorch_model.bin)" in capsys.readouterr().err
    assert not (tmp_path / "repo" / "tiny_encoder").exists()
    assert _export(pickled, tmp_path / "repo", "--allow-pickle") == 0
    assert (tmp_path / "repo" / "tiny_encoder" / "verification.json").is_file()


def test_model_code_is_refused_unless_trusted(tiny: Path, tmp_path: Path, capsys) -> None:
    custom = tmp_path / "custom"
    shutil.copytree(tiny, custom)
    config = json.loads((custom / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    (custom / "config.json").write_text(json.dumps(config))
    assert _export(custom, tmp_path / "repo") == 2
    assert "custom code in config.json (auto_map)" in capsys.readouterr().err


def test_triton_admin_apis_need_the_key(server) -> None:
    """Repository, statistics, shared memory, trace and logging answer only with the admin key;
    health, metadata and inference stay open."""
    import httpx
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    base = f"http://{server.http_url}"
    refused = [httpx.post(f"{base}/v2/repository/index"), httpx.get(f"{base}/v2/models/stats"),
               httpx.get(f"{base}/v2/systemsharedmemory/status"), httpx.get(f"{base}/v2/trace/setting"),
               httpx.get(f"{base}/v2/logging"), httpx.post(f"{base}/v2/repository/models/minilm/unload")]
    assert all(r.status_code >= 400 for r in refused), [(r.request.url.path, r.status_code) for r in refused]
    assert httpx.post(f"{base}/v2/repository/index", headers={"pooltriton-admin-key": "wrong"}).status_code >= 400
    assert httpx.post(f"{base}/v2/repository/index", headers=server.admin_headers()).status_code == 200
    assert httpx.get(f"{base}/v2/models/stats", headers=server.admin_headers()).status_code == 200
    assert httpx.get(f"{base}/v2/health/ready").status_code == 200
    assert httpx.get(f"{base}/v2/models/minilm").status_code == 200
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException):
        client.get_inference_statistics()
    assert client.get_inference_statistics(headers=server.admin_headers("grpc")) is not None
    client.close()
