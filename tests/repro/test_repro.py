"""ekka_core.repro: vLLM / SGLang repro scripts → DiagnosisSpec fields, read with libcst and never executed."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from ekka_core.contracts.errors import BadInput
from repro_scripts import roundtrip as _roundtrip, write_script as _script
from ekka_core.repro import import_repro, to_toml
from ekka_core.contracts.spec import DiagnosisSpec




GEMMA = '''
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    llm = LLM(model="google/gemma-3-4b-it", max_model_len=2048)
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))
    print(out[0].outputs[0].text)
'''


def test_vllm_bug_report_script(tmp_path: Path) -> None:
    result = import_repro(_script(tmp_path, GEMMA))
    assert result.fields == {"model": "google/gemma-3-4b-it", "target": "vllm", "reference": "hf",
                             "max_new_tokens": 32, "prompts": ["Hello"], "engine_args": {"max_model_len": 2048}}
    assert result.unknown == []
    assert result.engine_line == 4
    assert not any("temperature" in n for n in result.notes)  # greedy already
    assert any("dtype" in n for n in result.notes)  # no dtype: the engine uses the checkpoint's own
    assert result.complete
    spec = _roundtrip(tmp_path, result)
    assert spec == result.spec() == DiagnosisSpec(**result.fields)
    spec.validate()


def test_module_level_bindings_and_vllm_module_call(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        import vllm
        from vllm import SamplingParams as SP

        MODEL_ID = "Qwen/" + "Qwen2.5-0.5B-Instruct"
        SYSTEM = f"You are terse."
        prompts = [
            "Hello, my name is",
            SYSTEM + " The capital of France is",
            """Line one
        line "two" \\\\ end""",
        ]
        sampling_params = SP(temperature=0.8, top_p=0.95, max_tokens=64)

        llm = vllm.LLM(MODEL_ID, dtype="half", tensor_parallel_size=2, trust_remote_code=True,
                       enforce_eager=True, gpu_memory_utilization=0.85, max_model_len=4096,
                       hf_overrides={"rope_scaling": {"type": "linear", "factor": 2.0}})
        outputs = llm.generate(prompts, sampling_params)
        for output in outputs:
            print(output.prompt, output.outputs[0].text)
    ''')
    result = import_repro(path)
    f = result.fields
    assert f["model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert f["dtype"] == "float16"
    assert f["max_new_tokens"] == 64
    assert f["prompts"] == ["Hello, my name is", "You are terse. The capital of France is",
                            'Line one\nline "two" \\ end']
    assert f["engine_args"] == {"tensor_parallel_size": 2, "trust_remote_code": True, "enforce_eager": True,
                                "gpu_memory_utilization": 0.85, "max_model_len": 4096,
                                "hf_overrides": {"rope_scaling": {"type": "linear", "factor": 2.0}}}
    assert result.unknown == []
    assert not any("enforce_eager" in n for n in result.notes)   # the served configuration: kept, not dropped
    assert any("temperature 0.8" in n and "greedy" in n for n in result.notes)
    assert any("top_p=0.95" in n for n in result.notes)
    spec = _roundtrip(tmp_path, result)
    assert spec == DiagnosisSpec(**f)


def test_sglang_engine_script(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        import sglang as sgl

        def main():
            llm = sgl.Engine(model_path="meta-llama/Llama-3.2-1B-Instruct", dtype="bfloat16",
                             context_length=1024, mem_fraction_static=0.7, disable_cuda_graph=True)
            prompts = ["The future of AI is", "Write a haiku about GPUs."]
            sampling_params = {"temperature": 0, "max_new_tokens": 16}
            outputs = llm.generate(prompts, sampling_params=sampling_params)
            for prompt, output in zip(prompts, outputs):
                print(prompt, output["text"])
            llm.shutdown()

        if __name__ == "__main__":
            main()
    ''')
    result = import_repro(path)
    assert result.fields == {"model": "meta-llama/Llama-3.2-1B-Instruct", "target": "sglang", "reference": "hf",
                             "dtype": "bfloat16", "max_new_tokens": 16,
                             "prompts": ["The future of AI is", "Write a haiku about GPUs."],
                             "engine_args": {"context_length": 1024, "mem_fraction_static": 0.7,
                                             "disable_cuda_graph": True}}
    assert result.unknown == []
    assert _roundtrip(tmp_path, result) == DiagnosisSpec(**result.fields)


def test_sglang_from_import_engine_single_prompt(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        from sglang import Engine
        engine = Engine(model_path="/models/qwen", tp_size=1)
        print(engine.generate("Hi there", {"max_new_tokens": 8, "temperature": 0.0}))
    ''')
    result = import_repro(path)
    assert result.fields["target"] == "sglang"
    assert result.fields["prompts"] == ["Hi there"]
    assert result.fields["max_new_tokens"] == 8
    assert result.fields["engine_args"] == {"tp_size": 1}


def test_chat_messages_become_the_specs_messages(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        from vllm import LLM, SamplingParams

        llm = LLM(model="google/gemma-3-1b-it", dtype="bfloat16")
        messages = [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is 2+2?"},
        ]
        out = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=20))
    ''')
    result = import_repro(path)
    conversation = [{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "What is 2+2?"}]
    assert result.fields["messages"] == conversation       # each framework renders it with its own template
    assert "prompts" not in result.fields                  # never rendered into guessed text
    assert result.unknown == [] and result.complete
    assert any("llm.chat at line 8" in n and "own chat template" in n for n in result.notes)
    assert result.fields["max_new_tokens"] == 20 and result.fields["dtype"] == "bfloat16"
    spec = DiagnosisSpec.from_toml(_write(tmp_path, result.to_toml()))
    assert spec.messages == conversation and spec.prompts == [] and spec == result.spec()
    assert [r.kind for r in spec.request_list()] == ["messages"]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "out.ekka.toml"
    path.write_text(text)
    return path


def test_runtime_values_are_unknown_with_lines(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        import argparse
        import os
        from vllm import LLM, SamplingParams

        parser = argparse.ArgumentParser()
        parser.add_argument("--max-len", type=int, default=8192)
        args = parser.parse_args()

        MODEL = os.environ.get("MODEL_PATH", "meta-llama/Llama-3.1-8B")
        with open("prompt.txt") as f:
            long_prompt = f.read()
        prompts = []
        for i in range(4):
            prompts.append(f"Question {i}:")

        llm = LLM(model=MODEL, max_model_len=args.max_len, block_size=16)
        llm.generate(long_prompt, SamplingParams(max_tokens=16, temperature=0))
        llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0))
        llm.generate([f"Q{i}" for i in range(3)], SamplingParams(max_tokens=16, temperature=0))
    ''')
    result = import_repro(path)
    by_field = {}
    for u in result.unknown:
        by_field.setdefault(u.field, []).append(u)
    (model,) = by_field["model"]
    assert model.line == 9 and "MODEL_PATH" in model.reason and "meta-llama/Llama-3.1-8B" in model.hint
    (max_len,) = by_field["engine_args.max_model_len"]
    assert max_len.line == 16 and max_len.snippet == "args.max_len"
    assert "--max-len" in max_len.hint and "8192" in max_len.hint
    prompt_lines = sorted(u.line for u in by_field["prompts"])
    assert prompt_lines == [11, 14, 19]  # f.read(), prompts.append(...), the comprehension
    assert any("f.read()" in u.snippet for u in by_field["prompts"])
    assert "model" not in result.fields and "prompts" not in result.fields
    assert result.fields["engine_args"] == {"block_size": 16}
    assert result.fields["max_new_tokens"] == 16
    assert str(model).startswith("line 9: model:")
    with pytest.raises(BadInput, match="cannot determine model and prompts"):
        result.spec()
    # The spec file still loads and says what is missing; nothing was guessed.
    text = result.to_toml()
    assert "UNKNOWN line 9" in text and "# TODO model" in text
    with pytest.raises(BadInput, match="give at least `model` and `prompts`"):
        DiagnosisSpec.from_toml(_write(tmp_path, text))


def test_loop_over_prompts_and_repetition(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        from vllm import LLM, SamplingParams
        import torch

        PROMPTS = ["a b c"] * 2 + ["x" "y"]
        llm = LLM("facebook/opt-125m", dtype=torch.float32, seed=0)
        params = SamplingParams(max_tokens=4)
        for prompt in PROMPTS:
            print(llm.generate(prompt, params))
    ''')
    result = import_repro(path)
    # one generate per iteration: each prompt a request sent once the previous one has finished
    assert "prompts" not in result.fields
    assert result.fields["requests"] == [{"id": "0", "prompt": "a b c"}, {"id": "1", "prompt": "a b c", "after": "0"},
                                         {"id": "2", "prompt": "xy", "after": "1"}]
    assert result.fields["max_new_tokens"] == 4
    assert result.fields["dtype"] == "float32"
    assert result.fields["model"] == "facebook/opt-125m"
    assert result.fields["engine_args"] == {"seed": 0}      # kept: the served configuration
    assert result.unknown == []
    assert any("loop" in n and "line 7" in n for n in result.notes)
    assert any("temperature unset" in n for n in result.notes)  # vLLM samples by default
    spec = _roundtrip(tmp_path, result)
    assert spec.waves() == [[0], [1], [2]] and [r.prompt for r in spec.request_list()] == ["a b c", "a b c", "xy"]


def test_hf_generate_is_not_the_engine(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from vllm import LLM, SamplingParams

        name = "google/gemma-2-2b-it"
        tok = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name)
        hf_out = model.generate(**tok("HF prompt", return_tensors="pt"), max_new_tokens=5)

        llm = LLM(model=name, dtype="auto")
        vllm_out = llm.generate({"prompt": "vLLM prompt"}, SamplingParams(temperature=0, max_tokens=5))
    ''')
    result = import_repro(path)
    assert result.fields["prompts"] == ["vLLM prompt"]
    assert "dtype" not in result.fields
    assert any("dtype='auto'" in n for n in result.notes)
    assert result.unknown == []


def test_engines_that_disagree_are_reported(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        from vllm import LLM, SamplingParams
        sp = SamplingParams(temperature=0, max_tokens=8)
        good = LLM(model="m/x", max_model_len=1024, enforce_eager=True)
        bad = LLM(model="m/x", max_model_len=2048, enforce_eager=False)
        print(good.generate("same prompt", sp), bad.generate("same prompt", sp))
    ''')
    result = import_repro(path)
    assert result.fields["model"] == "m/x"
    assert result.fields["prompts"] == ["same prompt"]  # the same requests to two engines count once
    assert "max_model_len" not in result.fields["engine_args"]
    eager, u = result.unknown                            # sorted by line, then field
    assert u.field == "engine_args.max_model_len" and u.line == 3
    assert "line 3: 1024" in u.reason and "line 4: 2048" in u.reason
    assert eager.field == "engine_args.enforce_eager" and "line 3: True" in eager.reason


def test_unsupported_dtype_and_token_ids(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        from vllm import LLM
        llm = LLM(model="m/x", dtype="float8_e4m3fn")
        llm.generate(prompt_token_ids=[[1, 2, 3]])
    ''')
    result = import_repro(path)
    fields = {u.field: u for u in result.unknown}
    assert fields["dtype"].line == 2 and "float8_e4m3fn" in fields["dtype"].reason
    assert result.fields["prompt_token_ids"] == [[1, 2, 3]]     # vLLM's older keyword: the ids, imported
    assert set(fields) == {"dtype"}


def test_script_is_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    path = _script(tmp_path, f'''
        open({str(marker)!r}, "w").write("ran")
        from vllm import LLM
        LLM(model="m/x").generate("hi")
    ''')
    result = import_repro(path)
    assert not marker.exists()
    assert result.fields["prompts"] == ["hi"]
    assert any("max_tokens" in n for n in result.notes)  # not set: the engine default, reported


def test_no_engine_call_is_bad_input(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        from transformers import pipeline
        pipe = pipeline("text-generation", model="gpt2")
        print(pipe("Hello"))
    ''', name="hf_only.py")
    with pytest.raises(BadInput) as err:
        import_repro(path)
    assert "hf_only.py has no LLM(...) or Engine(...) call" in err.value.message
    assert err.value.fix and "--model" in err.value.fix
    assert err.value.exit_code == 2


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        from vllm import LLM
        llm = LLM(model="m/x"
        prompts = ["a"]
        def broken(:
            pass
    ''', name="broken.py")
    with pytest.raises(BadInput) as err:
        import_repro(path)
    assert err.value.message.startswith(f"{path}:2:") and "syntax error" in err.value.message
    assert "line 2 of broken.py" in err.value.fix

    path = _script(tmp_path, "from vllm import LLM\n\nllm = = LLM('m/x')\n", name="broken2.py")
    with pytest.raises(BadInput, match=r"broken2\.py:3:\d+: syntax error: invalid syntax"):
        import_repro(path)


def test_missing_file_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="does not exist"):
        import_repro(tmp_path / "nope.py")
    with pytest.raises(BadInput, match="cannot be read"):
        import_repro(tmp_path)  # a directory


def test_to_toml_escapes_and_round_trips(tmp_path: Path) -> None:
    fields = {
        "model": "org/model",
        "target": "sglang",
        "reference": "hf",
        "dtype": "float32",
        "max_new_tokens": 7,
        "prompts": ['quote " backslash \\ newline\n tab\t', "ünïcødé ✓ 中文", "ctrl \x01 \x7f \x1b end",
                    "'''triple''' \"\"\"", "# not a comment", ""],
        "engine_args": {"max_model_len": 1024, "gpu_memory_utilization": 0.5, "enforce_eager": True,
                        "dotted.key": "v", "hf_overrides": {"rope_scaling": {"factor": 2.0, "type": "dynamic"}},
                        "cuda_graph_sizes": [1, 2, 4], "empty": {}, "neg": -3, "big": 1e-08},
    }
    text = to_toml(fields)
    assert tomllib.loads(text) == fields
    spec = DiagnosisSpec.from_toml(_write(tmp_path, text))
    assert spec == DiagnosisSpec(**fields)
    with pytest.raises(ValueError):
        to_toml({"model": "m", "prompts": ["a"], "bogus": 1})
    with pytest.raises(ValueError):
        to_toml({"model": "m", "prompts": ["a"], "engine_args": {"x": None}})


def test_to_toml_comments_cannot_break_the_file(tmp_path: Path) -> None:
    text = to_toml({"model": "m/x", "prompts": ["p"]}, comments=["two\nlines", "ctrl \x00 char"])
    assert tomllib.loads(text) == {"model": "m/x", "prompts": ["p"]}


def test_splats_joins_tuples_and_sampling_lists(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        from vllm import *

        MODEL: str = "org/m"
        MAX = 12
        engine_kwargs = dict(model=MODEL, max_model_len=512, **{"swap_space": 0})
        SYS = "\\n".join(["Line A", "Line B"])

        def run():
            llm = LLM(**engine_kwargs)
            sps = [SamplingParams(max_tokens=MAX, temperature=0)] * 2
            llm.generate((SYS, {"prompt": "dict prompt"}), sps)
            llm.generate([{"prompt": "img", "multi_modal_data": {"image": None}}], sps[0])
        run()
    ''')
    result = import_repro(path)
    assert result.fields["model"] == "org/m"
    assert result.fields["engine_args"] == {"max_model_len": 512, "swap_space": 0}
    assert result.fields["prompts"] == ["Line A\nLine B", "dict prompt"]
    assert result.fields["max_new_tokens"] == 12
    (u,) = result.unknown
    assert u.field == "prompts" and u.line == 12 and "multi_modal_data" in u.reason


def test_engine_passed_to_an_async_function(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        import asyncio
        import sglang as sgl

        async def main(engine):
            return await engine.async_generate("hello", {"max_new_tokens": 4, "temperature": 0})

        if __name__ == "__main__":
            engine = sgl.Engine(model_path="a/b")
            asyncio.run(main(engine))
    ''')
    result = import_repro(path)
    assert result.fields["prompts"] == ["hello"] and result.fields["target"] == "sglang"


def test_no_generate_call_found_lists_candidates(tmp_path: Path) -> None:
    path = _script(tmp_path, '''
        from vllm import LLM

        def bench(e, prompts):
            return e.generate(prompts)

        bench(LLM(model="m/x"), ["hi"])
    ''')
    result = import_repro(path)
    (u,) = result.unknown
    assert u.field == "prompts" and u.line == 6 and "line 4: e.generate(prompts)" in u.hint


def test_auto_dtype_resolved_from_a_local_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"model_type": "llama", "torch_dtype": "float16"}')
    path = _script(tmp_path, f'''
        from vllm import LLM, SamplingParams
        llm = LLM(model={str(ckpt)!r}, dtype="auto")
        llm.generate("hi", SamplingParams(temperature=0, max_tokens=3))
    ''')
    result = import_repro(path)
    assert result.fields["dtype"] == "float16"
    assert any("config.json" in n for n in result.notes)
    assert result.complete
    assert _roundtrip(tmp_path, result) == result.spec()
