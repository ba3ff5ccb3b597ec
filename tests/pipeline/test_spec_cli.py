"""DiagnosisSpec validation and the CLI's bad-input contract (DESIGN.md: exit 2, the message names the input and
the fix, one line, no traceback unless --debug). No engine is started: every case fails before capture."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ekka_core import zoo
from ekka_core.contracts.errors import BadInput
from ekka_core.contracts.spec import DTYPES, TARGETS, DiagnosisSpec

REPO_ROOT = Path(__file__).resolve().parents[2]
EKKA = REPO_ROOT / ".venv" / "bin" / "ekka"


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "tiny-model"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama"}')
    return d


# --- DiagnosisSpec.validate -----------------------------------------------------------------------------------

def _bad(spec: DiagnosisSpec) -> BadInput:
    with pytest.raises(BadInput) as e:
        spec.validate()
    assert e.value.fix, "every bad-input error must say how to fix it"
    assert e.value.exit_code == 2
    return e.value


def test_valid_spec_passes(model_dir):
    spec = DiagnosisSpec(model=str(model_dir), prompts=["hello"])
    assert spec.validate() is spec
    assert spec.target in TARGETS and spec.dtype == "auto" and spec.declared_dtype() in DTYPES


def test_missing_model_path(tmp_path):
    e = _bad(DiagnosisSpec(model=str(tmp_path / "nope"), prompts=["hi"]))
    assert "nope" in e.message and "does not exist" in e.message


def test_model_dir_without_config(tmp_path):
    e = _bad(DiagnosisSpec(model=str(tmp_path), prompts=["hi"]))
    assert "config.json" in e.message


def test_empty_model():
    e = _bad(DiagnosisSpec(model="", prompts=["hi"]))
    assert "model" in e.message


def test_unknown_target(model_dir):
    e = _bad(DiagnosisSpec(model=str(model_dir), prompts=["hi"], target="foo"))
    assert "'foo'" in e.message and all(t in e.fix for t in TARGETS)


def test_unknown_reference(model_dir):
    e = _bad(DiagnosisSpec(model=str(model_dir), prompts=["hi"], reference="jax"))
    assert "jax" in e.message and "hf" in e.fix


@pytest.mark.parametrize("prompts", [[], [""], ["ok", "   "]])
def test_empty_prompt(model_dir, prompts):
    e = _bad(DiagnosisSpec(model=str(model_dir), prompts=prompts))
    assert "prompt" in e.message


@pytest.mark.parametrize("dtype", ["bf16", "int8", "float64"])
def test_bad_dtype(model_dir, dtype):
    e = _bad(DiagnosisSpec(model=str(model_dir), prompts=["hi"], dtype=dtype))
    assert dtype in e.message and all(d in e.fix for d in DTYPES)


@pytest.mark.parametrize("n", [0, -1, 100_000])
def test_max_new_tokens_out_of_range(model_dir, n):
    e = _bad(DiagnosisSpec(model=str(model_dir), prompts=["hi"], max_new_tokens=n))
    assert str(n) in e.message


# --- DiagnosisSpec.from_toml ----------------------------------------------------------------------------------

def test_from_toml_missing_file(tmp_path):
    with pytest.raises(BadInput, match="does not exist") as e:
        DiagnosisSpec.from_toml(tmp_path / "missing.toml")
    assert e.value.fix


def test_from_toml_invalid_toml(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('model = "x"\nprompts = ["unterminated\n')
    with pytest.raises(BadInput, match="not valid TOML") as e:
        DiagnosisSpec.from_toml(p)
    assert e.value.fix


def test_from_toml_unknown_key(tmp_path, model_dir):
    p = tmp_path / "spec.toml"
    p.write_text(f'model = "{model_dir}"\nprompts = ["hi"]\ntemperature = 0.7\n')
    with pytest.raises(BadInput, match="temperature") as e:
        DiagnosisSpec.from_toml(p)
    assert "prompts" in e.value.fix    # names the keys that are allowed


def test_from_toml_directory_is_unreadable(tmp_path):
    with pytest.raises(BadInput, match="cannot be read"):
        DiagnosisSpec.from_toml(tmp_path)


def test_from_toml_missing_required_key(tmp_path):
    p = tmp_path / "spec.toml"
    p.write_text('prompts = ["hi"]\n')
    with pytest.raises(BadInput) as e:
        DiagnosisSpec.from_toml(p)
    assert "model" in e.value.fix


def test_from_toml_single_prompt_and_relative_model(tmp_path, model_dir):
    p = tmp_path / "spec.toml"
    p.write_text(f'model = "{model_dir.name}"\nprompt = "The capital of France is"\ndtype = "float16"\n'
                 f'[engine_args]\nmax_model_len = 256\n')
    spec = DiagnosisSpec.from_toml(p).validate()
    assert spec.prompts == ["The capital of France is"]
    assert Path(spec.model) == model_dir.resolve()      # relative to the spec file, not the cwd
    assert spec.dtype == "float16" and spec.engine_args == {"max_model_len": 256}


# --- CLI ------------------------------------------------------------------------------------------------------

def _ekka(*args: str, cwd: Path, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([str(EKKA), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ekka: error:"), lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    return lines[0]


def test_cli_missing_model(tmp_path):
    line = _one_error_line(_ekka("diagnose", "--model", str(tmp_path / "nope"), "--prompt", "hi",
                                 "--out", str(tmp_path / "out"), cwd=tmp_path))
    assert "nope" in line and "does not exist" in line
    assert not (tmp_path / "out" / "report.json").exists()


def test_cli_no_model_flag(tmp_path):
    line = _one_error_line(_ekka("diagnose", "--prompt", "hi", "--out", str(tmp_path / "out"), cwd=tmp_path))
    assert "model" in line and "--model" in line


def test_cli_unknown_target(tmp_path, model_dir):
    line = _one_error_line(_ekka("diagnose", "--model", str(model_dir), "--target", "foo", "--prompt", "hi",
                                 "--out", str(tmp_path / "out"), cwd=tmp_path))
    assert "target" in line and "foo" in line and "vllm" in line


def test_cli_empty_prompt(tmp_path, model_dir):
    line = _one_error_line(_ekka("diagnose", "--model", str(model_dir), "--prompt", "",
                                 "--out", str(tmp_path / "out"), cwd=tmp_path))
    assert "prompt" in line


def test_cli_bad_dtype(tmp_path, model_dir):
    line = _one_error_line(_ekka("diagnose", "--model", str(model_dir), "--prompt", "hi", "--dtype", "fp8",
                                 "--out", str(tmp_path / "out"), cwd=tmp_path))
    assert "fp8" in line and "bfloat16" in line


@pytest.mark.parametrize("field", ["trace_modules", "trace_positions", "trace_store_dtype", "target_trace"])
def test_cli_spec_file_with_a_non_string_trace_option_is_bad_input(tmp_path, model_dir, field):
    spec = tmp_path / "s.toml"
    spec.write_text(f'model = "{model_dir}"\nprompts = ["hi"]\n{field} = 5\n')
    line = _one_error_line(_ekka("diagnose", "--spec", str(spec), "--out", str(tmp_path / "out"), cwd=tmp_path))
    assert f"`{field}` must be a string" in line


def test_cli_target_trace_with_prompts_is_bad_input(tmp_path):
    line = _one_error_line(_ekka("diagnose", "--target-trace", str(tmp_path), "--prompt", "hi",
                                 "--out", str(tmp_path / "out"), cwd=tmp_path))
    assert "--target-trace" in line and "--prompt" in line


@pytest.mark.parametrize("kind", ["missing", "directory", "invalid"])
def test_cli_unreadable_spec(tmp_path, kind):
    spec = {"missing": tmp_path / "missing.toml", "directory": tmp_path}.get(kind, tmp_path / "bad.toml")
    if kind == "invalid":
        spec.write_text("model = \n")
    line = _one_error_line(_ekka("diagnose", "--spec", str(spec), "--out", str(tmp_path / "out"), cwd=tmp_path))
    assert "spec file" in line and str(spec) in line


def test_cli_flags_override_spec_and_are_validated(tmp_path, model_dir):
    spec = tmp_path / "s.toml"
    spec.write_text(f'model = "{model_dir}"\nprompts = ["hi"]\n')
    line = _one_error_line(_ekka("diagnose", "--spec", str(spec), "--target", "bar", "--out",
                                 str(tmp_path / "out"), cwd=tmp_path))
    assert "bar" in line


def test_cli_debug_shows_the_traceback(tmp_path):
    proc = _ekka("--debug", "diagnose", "--model", str(tmp_path / "nope"), "--prompt", "hi",
                 "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("ekka: error:")


def test_cli_zoo_unknown_architecture_names_the_known_ones(tmp_path):
    proc = _ekka("zoo", "nosuch", cwd=tmp_path, env_extra={"EKKA_ZOO_DIR": str(tmp_path / "zoo")})
    line = _one_error_line(proc)
    assert "nosuch" in line
    known = zoo.known_architectures()
    assert known and all(a in line for a in known)
    assert proc.stdout == ""
    assert not any((tmp_path / "zoo").glob("nosuch*"))


# --- known bugs (see the report to the lead): ill-typed spec values are bad input, not internal failures -----

@pytest.mark.parametrize("body", ['prompts = ["hi"]\nmax_new_tokens = "eight"\n',
                                  'prompts = [1]\n'])
def test_cli_ill_typed_spec_values_are_bad_input(tmp_path, model_dir, body):
    spec = tmp_path / "s.toml"
    spec.write_text(f'model = "{model_dir}"\n{body}')
    _one_error_line(_ekka("diagnose", "--spec", str(spec), "--out", str(tmp_path / "out"), cwd=tmp_path))
