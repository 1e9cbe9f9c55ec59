"""The lab's tiny model folder: made to the current recipe, and remade when an earlier ppscope
made it to another (the first recipe gave 687 of its 1024 token ids no text, so bench_serving,
which counts a token when its chunk carries text, put some requests' first token at the end of
the run and their TPOT near zero)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from microbench.sglang_lab import venv

ROOT = Path(__file__).resolve().parents[1]


def _recipe():
    spec = importlib.util.spec_from_file_location(
        "make_model", venv.BOOT / "ppscope_lab_make_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_recipe_version_is_the_one_ensure_model_asks_for():
    assert _recipe().VERSION == venv.MODEL_VERSION


def test_the_models_vocab_is_the_tokenizers():
    """config.json takes its vocab_size from the trained tokenizer: no id without a token."""
    cfg = _recipe().config(61, 246)
    assert cfg["vocab_size"] == 246 and cfg["num_hidden_layers"] == 61


def _fake_boot(tmp_path: Path, monkeypatch) -> Path:
    """A stand-in for the recipe (the real one needs `tokenizers`, in the lab venv only) that
    writes the files and the version, and counts its runs."""
    boot = tmp_path / "boot"
    boot.mkdir()
    (boot / "ppscope_lab_make_model.py").write_text(
        "import json, sys, pathlib\n"
        "out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)\n"
        "for n in ('config.json', 'tokenizer.json'): (out / n).write_text('{}')\n"
        f"(out / 'ppscope-model.json').write_text(json.dumps({{'version': {venv.MODEL_VERSION}}}))\n"
        "runs = out.parent / 'runs'; runs.write_text(runs.read_text() + 'x' if runs.exists() else 'x')\n")
    monkeypatch.setattr(venv, "BOOT", boot)
    return boot


def test_a_model_folder_of_the_first_recipe_is_made_again(tmp_path, monkeypatch):
    _fake_boot(tmp_path, monkeypatch)
    lab = tmp_path / "lab"
    old = lab / "model-llama-4l"
    old.mkdir(parents=True)
    for n in ("config.json", "tokenizer.json"):         # the first recipe wrote no version
        (old / n).write_text(json.dumps({"vocab_size": 1024}))
    got = venv.ensure_model(Path(sys.executable), lab, 4)
    assert got == old and json.loads((got / "config.json").read_text()) == {}
    assert json.loads((got / "ppscope-model.json").read_text())["version"] == venv.MODEL_VERSION
    assert not (lab / "model-llama-4l.tmp").exists()
    assert venv.ensure_model(Path(sys.executable), lab, 4) == got      # current: kept
    assert (lab / "runs").read_text() == "x"
