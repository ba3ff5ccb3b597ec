"""ekka_core.repro: what a script sends — literal splats, chat messages, token ids, request scenarios — and the served
configuration (every engine keyword kept), written as a spec that DiagnosisSpec.from_toml loads back."""

from __future__ import annotations

import tomllib
from pathlib import Path

from ekka_core.cli import main as cli
from ekka_core.contracts.spec import DiagnosisSpec
from repro_scripts import roundtrip as _roundtrip, write_script as _script
from ekka_core.repro import import_repro, to_toml




def test_literal_dict_splats_in_sampling_params_and_the_engine(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        from vllm import LLM, SamplingParams
        ENGINE = {"model": "org/m", "max_model_len": 2048}
        llm = LLM(**ENGINE, **{"enable_prefix_caching": True})
        params = SamplingParams(**{'max_tokens': 512}, temperature=0)
        llm.generate(["hi"], params)
    ''')
    result = import_repro(path)
    assert result.unknown == [] and result.complete
    assert result.fields["model"] == "org/m" and result.fields["max_new_tokens"] == 512
    assert result.fields["engine_args"] == {"max_model_len": 2048, "enable_prefix_caching": True}
    out = tmp_path / "spec.ekka.toml"
    assert cli(["import-repro", str(path), "--out", str(out)]) == 0        # complete: exit 0, not 2
    assert DiagnosisSpec.from_toml(out) == result.spec()


def test_every_engine_keyword_is_the_served_configuration(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        from vllm import LLM
        llm = LLM(model="org/m", enforce_eager=False, enable_prefix_caching=True, seed=1234,
                  compilation_config={"mode": 3}, max_num_batched_tokens=64, quantization=None)
        llm.generate("hi")
    ''')
    result = import_repro(path)
    assert result.fields["engine_args"] == {"enforce_eager": False, "enable_prefix_caching": True, "seed": 1234,
                                            "compilation_config": {"mode": 3}, "max_num_batched_tokens": 64}
    assert any("quantization=None" in n and "TOML has no null" in n for n in result.notes)
    assert _roundtrip(tmp_path, result).engine_args == result.fields["engine_args"]


def test_token_ids_from_tokens_prompt_and_prompt_dicts(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
        llm = LLM(model="org/m")
        llm.generate([TokensPrompt(prompt_token_ids=[1, 415, 2936]), {"prompt_token_ids": [1, 7]}],
                     SamplingParams(max_tokens=5, temperature=0))
    ''')
    result = import_repro(path)
    assert result.unknown == [] and result.complete
    assert result.fields["prompt_token_ids"] == [[1, 415, 2936], [1, 7]] and "prompts" not in result.fields
    spec = _roundtrip(tmp_path, result)
    assert [r.prompt_token_ids for r in spec.request_list()] == [[1, 415, 2936], [1, 7]]
    spec.validate()


def test_text_and_token_ids_in_one_call_are_requests_sent_together(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        from vllm import LLM, TokensPrompt
        llm = LLM(model="org/m")
        llm.generate(["text first", TokensPrompt(prompt_token_ids=[5, 6, 7])])
    ''')
    result = import_repro(path)
    assert result.fields["requests"] == [{"id": "0", "prompt": "text first"},
                                         {"id": "1", "prompt_token_ids": [5, 6, 7]}]
    assert _roundtrip(tmp_path, result).waves() == [[0, 1]]


def test_calls_in_sequence_become_a_request_scenario(tmp_path: Path) -> None:
    """Issue 15/16's shape: a warm-up request fills the prefix cache, then requests that share the prefix."""
    path = _script(tmp_path, '''
        from vllm import LLM, SamplingParams
        PREFIX = "You are a careful assistant. " * 4
        llm = LLM(model="org/m", enable_prefix_caching=True, max_num_batched_tokens=64)
        llm.generate([PREFIX + "warm up"], SamplingParams(max_tokens=1, temperature=0))
        llm.generate([PREFIX + "first", PREFIX + "second"], SamplingParams(max_tokens=16, temperature=0))
        llm.chat([{"role": "user", "content": "and a chat"}], SamplingParams(max_tokens=16, temperature=0))
    ''')
    result = import_repro(path)
    assert result.unknown == [] and result.complete
    prefix = "You are a careful assistant. " * 4
    assert result.fields["max_new_tokens"] == 16                          # the most common setting
    assert result.fields["requests"] == [
        {"id": "0", "prompt": prefix + "warm up", "max_new_tokens": 1},
        {"id": "1", "prompt": prefix + "first", "after": "0"},
        {"id": "2", "prompt": prefix + "second", "after": "0"},
        {"id": "3", "messages": [{"role": "user", "content": "and a chat"}], "after": "2"},
    ]
    assert any("3 rounds of requests" in n for n in result.notes)
    spec = _roundtrip(tmp_path, result)
    assert spec.waves() == [[0], [1, 2], [3]]
    assert [spec.max_new_tokens_of(r) for r in spec.request_list()] == [1, 16, 16, 16]
    assert spec.request_list()[3].messages == [{"role": "user", "content": "and a chat"}]
    assert spec.engine_args == {"enable_prefix_caching": True, "max_num_batched_tokens": 64}
    assert spec == result.spec()


def test_a_call_repeated_by_a_loop_sends_its_requests_each_time(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        from vllm import LLM, SamplingParams
        llm = LLM(model="org/m")
        sp = SamplingParams(max_tokens=4, temperature=0)
        for _ in range(2):
            llm.generate(["same prompt", "other"], sp)
    ''')
    result = import_repro(path)
    assert [(r["prompt"], r.get("after")) for r in result.fields["requests"]] == [
        ("same prompt", None), ("other", None), ("same prompt", "1"), ("other", "1")]
    assert _roundtrip(tmp_path, result).waves() == [[0, 1], [2, 3]]


def test_several_conversations_in_one_chat_call(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        from vllm import LLM
        llm = LLM(model="org/m")
        convs = [[{"role": "user", "content": "one"}], [{"role": "user", "content": "two"}]]
        llm.chat(convs)
    ''')
    result = import_repro(path)
    assert [r["messages"][0]["content"] for r in result.fields["requests"]] == ["one", "two"]
    assert _roundtrip(tmp_path, result).waves() == [[0, 1]]


def test_chat_with_a_custom_template_is_left_to_fill_in(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        from vllm import LLM
        llm = LLM(model="org/m")
        llm.chat([{"role": "user", "content": "hi"}], chat_template="{{ messages }}")
    ''')
    result = import_repro(path)
    (u,) = result.unknown
    assert u.field == "messages" and "custom chat_template" in u.reason and u.line == 3
    assert "messages" not in result.fields and not result.complete


def test_different_max_tokens_per_prompt_become_per_request_values(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        from vllm import LLM, SamplingParams
        llm = LLM(model="org/m")
        llm.generate(["a", "b"], [SamplingParams(max_tokens=8), SamplingParams(max_tokens=2)])
    ''')
    result = import_repro(path)
    assert result.unknown == []
    assert [r.get("max_new_tokens") for r in result.fields["requests"]] == [None, 2]
    assert result.fields["max_new_tokens"] == 8
    spec = _roundtrip(tmp_path, result)
    assert [spec.max_new_tokens_of(r) for r in spec.request_list()] == [8, 2]


def test_to_toml_writes_requests_messages_and_token_ids_that_load_back(tmp_path: Path) -> None:
    fields = {
        "model": "org/m", "target": "vllm", "reference": "hf", "max_new_tokens": 8,
        "engine_args": {"enable_prefix_caching": True},
        "requests": [
            {"id": "warm", "prompt": 'quote " and\nnewline', "max_new_tokens": 1},
            {"id": "chat", "messages": [{"role": "system", "content": "be brief"},
                                        {"role": "user", "content": "ünïcødé ✓"}], "after": "warm"},
            {"id": "ids", "prompt_token_ids": [1, 2, 3], "after": "warm", "sampling": {"temperature": 0.5}},
        ],
    }
    text = to_toml(fields)
    assert tomllib.loads(text) == fields
    path = tmp_path / "s.ekka.toml"
    path.write_text(text)
    spec = DiagnosisSpec.from_toml(path)
    assert spec == DiagnosisSpec.from_json(fields) and spec.waves() == [[0], [1, 2]]
    top = {"model": "org/m", "messages": [{"role": "user", "content": "hi"}], "prompt_token_ids": [[4, 5]]}
    assert tomllib.loads(to_toml(top)) == top


def test_a_call_that_is_a_loops_iterable_runs_once(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        from vllm import LLM, SamplingParams
        llm = LLM(model="org/m")
        for out in llm.generate(["p1", "p2"], SamplingParams(max_tokens=3)):
            print(out)
    ''')
    result = import_repro(path)
    assert result.fields["prompts"] == ["p1", "p2"] and "requests" not in result.fields
    assert not any("inside a loop" in n for n in result.notes)
