"""server.settings: one typed settings object per workspace folder; the interpreter precedence the extension uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ekka_core.contracts.errors import BadInput
from server.settings import Settings, WorkspaceSettings, resolve_interpreter

REPO = Path(__file__).resolve().parents[2]
PRECEDENCE = json.loads((REPO / "extension/test/fixtures/interpreter-precedence.json").read_text())["cases"]


@pytest.mark.parametrize("case", PRECEDENCE, ids=[c["name"] for c in PRECEDENCE])
def test_interpreter_precedence_is_the_extensions(case):
    """The same table as extension/test/interpreter.test.ts: one precedence, two implementations."""
    settings = WorkspaceSettings.from_json({"interpreter": case["setting"],
                                            "pythonInterpreter": case["python_extension"]})
    def run() -> str:
        return resolve_interpreter(settings, case["root"] or None, exists=lambda p: case["venv_exists"],
                                   platform=case["platform"], fallback="<fallback>")
    if "error" in case:
        with pytest.raises(BadInput, match=case["error"].replace(".", r"\.")):
            run()
    else:
        assert run() == ("<fallback>" if case.get("expect_fallback") else case["expect"])


def test_the_server_falls_back_to_its_own_interpreter():
    import sys
    assert resolve_interpreter(WorkspaceSettings(), None) == sys.executable


def _folder(path: str, **kw) -> dict:
    return {"workspace": path, "interpreter": "", "pythonInterpreter": "", "targetDefault": "vllm",
            "executor": "local", "remote": {"python": "python3", "workdir": "~/.cache/ekka-remote"},
            "engineArgs": {}, **kw}


def test_each_job_gets_the_settings_of_the_folder_its_file_is_in(tmp_path):
    a, b, inner = tmp_path / "a", tmp_path / "b", tmp_path / "a" / "nested"
    s = Settings()
    s.update({"settings": [_folder(str(a), interpreter="/py/a", engineArgs={"max_num_seqs": 4}),
                           _folder(str(b), executor="ssh://gpu-box", remote={"python": "/opt/py", "workdir": "/w"}),
                           _folder(str(inner), targetDefault="sglang")],
              "globalSettings": _folder("", interpreter="/py/global")})
    assert s.for_path(str(a / "repro.py")).interpreter == "/py/a"
    assert s.for_path(str(a / "repro.py")).engine_args == {"max_num_seqs": 4}
    assert s.for_path(str(inner / "x.ekka.toml")).target_default == "sglang"      # the innermost folder
    assert s.for_path(str(b / "x.ekka.toml")).executor_params() == {"url": "ssh://gpu-box", "python": "/opt/py",
                                                                      "workdir": "/w"}
    assert s.for_path(str(tmp_path / "ab" / "x.py")).interpreter == "/py/global"  # not a prefix match on "a"
    assert s.for_path(None).interpreter == "/py/global"
    # didChangeConfiguration carries the same object under `ekka`
    s.update({"ekka": {"settings": [_folder(str(a), interpreter="/py/a2")], "globalSettings": _folder("")}})
    assert s.for_path(str(a / "repro.py")).interpreter == "/py/a2"
    assert s.for_path(str(b / "x.py")).executor == "local"                       # b is gone: global settings
    assert s.to_json()["settings"][0]["workspace"] == str(a)


def test_an_untyped_object_of_an_older_client_is_the_global_settings():
    s = Settings()
    s.update({"settings": {"interpreter": "/usr/bin/python3", "target": {"default": "sglang"}, "executor": "local"}})
    assert s.for_path("/anywhere/x.py").interpreter == "/usr/bin/python3"
    assert s.for_path("/anywhere/x.py").target_default == "sglang"


def test_ill_typed_settings_are_named_and_fail_the_job():
    s = WorkspaceSettings.from_json({"executor": "gpu-box", "engineArgs": ["max_num_seqs"], "targetDefault": "trt",
                                     "interpreter": 3}, workspace="/ws")
    assert s.executor == "local" and s.engine_args == {} and s.target_default == "vllm" and s.interpreter == ""
    assert len(s.problems) == 4
    with pytest.raises(BadInput, match=r"invalid settings \(workspace folder /ws\).*ekka\.executor.*gpu-box"):
        s.check()
    bad_key = WorkspaceSettings.from_json({"engineArgs": {"max-num-seqs": 4}})
    assert bad_key.problems and "ekka.engineArgs" in bad_key.problems[0]
    WorkspaceSettings.from_json({"engineArgs": {"max_num_seqs": 4}}).check()     # fine: no exception


def test_engine_args_merge_under_the_specs_own_and_target_default_fills_a_missing_target():
    s = WorkspaceSettings.from_json({"engineArgs": {"enable_prefix_caching": True, "max_num_batched_tokens": 64},
                                     "targetDefault": "sglang"})
    spec = {"model": "m", "prompts": ["p"], "engine_args": {"max_num_batched_tokens": 32}}
    out = s.apply_to_spec(spec, target_given=False)
    assert out["engine_args"] == {"enable_prefix_caching": True, "max_num_batched_tokens": 32}   # the spec wins
    assert out["target"] == "sglang"
    assert spec["engine_args"] == {"max_num_batched_tokens": 32}                 # the request is not changed
    kept = s.apply_to_spec({"model": "m", "target": "vllm"}, target_given=True)
    assert kept["target"] == "vllm" and kept["engine_args"] == {"enable_prefix_caching": True,
                                                                "max_num_batched_tokens": 64}
    assert WorkspaceSettings().apply_to_spec({"model": "m"}, target_given=True) == {"model": "m"}


def test_spec_names_target_reads_the_spec_file(tmp_path):
    from server.server import spec_names_target

    named, unnamed = tmp_path / "a.ekka.toml", tmp_path / "b.ekka.toml"
    named.write_text('model = "m"\ntarget = "vllm"\nprompts = ["p"]\n')
    unnamed.write_text('model = "m"\nprompts = ["p"]\n')
    assert spec_names_target({}, str(named)) and not spec_names_target({}, str(unnamed))
    assert spec_names_target({}, str(tmp_path / "repro.py"))                     # a script builds its engine
    assert not spec_names_target({"spec": {"model": "m"}}, None)
    assert spec_names_target({"spec": {"model": "m", "target": "sglang"}}, None)
