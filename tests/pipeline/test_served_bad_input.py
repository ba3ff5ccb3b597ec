"""Bad input about what to serve and send: one clear line naming the input and the fix, exit 2, nothing computed
so far lost (through the real CLI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ekka_core.repro import to_toml


def _ekka(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ekka_core.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("ekka: error:")]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    return lines[0]


def _spec(tmp_path: Path, **fields) -> Path:
    path = tmp_path / "bad.ekka.toml"
    path.write_text(to_toml(fields))
    return path


def test_prompt_and_messages_together(tmp_path, zoo_model):
    spec = _spec(tmp_path, model=str(zoo_model("llama")), prompts=["hello"],
                 messages=[{"role": "user", "content": "hi"}])
    line = _one_error_line(_ekka("diagnose", "--spec", str(spec), "--out", str(tmp_path / "out")))
    assert "both `prompt(s)` and `messages`" in line and "[[requests]]" in line


def test_scenario_that_references_a_missing_request(tmp_path, zoo_model):
    spec = _spec(tmp_path, model=str(zoo_model("llama")),
                 requests=[{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y", "after": "first"}])
    line = _one_error_line(_ekka("diagnose", "--spec", str(spec), "--out", str(tmp_path / "out")))
    assert "'b' is sent after 'first', which no request is called" in line and "a, b" in line


@pytest.mark.parametrize("arg", ["max_model_len", "compilation_config={mode: 3}"])
def test_engine_arg_that_does_not_parse(tmp_path, zoo_model, arg):
    line = _one_error_line(_ekka("diagnose", "--model", str(zoo_model("llama")), "--prompt", "x",
                                 "--engine-arg", arg, "--out", str(tmp_path / "out")))
    assert "--engine-arg" in line and ("KEY=VALUE" in line or "does not parse" in line)


def test_message_that_is_not_role_and_text(tmp_path, zoo_model):
    line = _one_error_line(_ekka("diagnose", "--model", str(zoo_model("llama")), "--message", "hello there",
                                 "--out", str(tmp_path / "out")))
    assert "ROLE:TEXT" in line


@pytest.mark.slow
def test_engine_argument_vllm_does_not_know_is_named_with_the_nearest(tmp_path, zoo_model):
    line = _one_error_line(_ekka("diagnose", "--model", str(zoo_model("llama")), "--prompt", "x",
                                 "--engine-arg", "max_num_batched_token=64", "--out", str(tmp_path / "out")))
    assert "has no engine argument `max_num_batched_token`" in line and "max_num_batched_tokens" in line
    assert line.startswith("ekka: error: vLLM ")


@pytest.mark.slow
def test_served_configuration_that_cannot_start_keeps_the_traces(tmp_path, zoo_model):
    model = str(zoo_model("llama"))
    out = tmp_path / "out"
    ok = _ekka("diagnose", "--model", model, "--prompt", "Once upon a time", "--max-new-tokens", "2",
               "--engine-arg", "enforce_eager=true", "--out", str(out), timeout=900)
    assert ok.returncode == 0, ok.stderr[-2000:]
    index = out / "traces" / "target" / "index.json"
    before = index.read_bytes()
    line = _one_error_line(_ekka("diagnose", "--model", model, "--prompt", "Once upon a time",
                                 "--engine-arg", "max_model_len=4096", "--out", str(out)))
    assert "vLLM cannot start with this configuration" in line and "max_model_len" in line
    assert index.read_bytes() == before          # what was computed before is kept, untouched
