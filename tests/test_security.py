"""Safe defaults at export: names that cannot leave the repository folder, no pickled weights and no
model code unless asked for (issue 11's threat model: a model folder or a name is untrusted input)."""

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
