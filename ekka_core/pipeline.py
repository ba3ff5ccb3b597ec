"""One diagnosis, end to end.

    symptom (served configuration, untraced) ─▶ inputs pre-flight ─▶ capture (traced baseline) ─▶ tree ─▶ mapping
        ─▶ align ─▶ analysis ─▶ [triage ─▶ capture under the culprit ─▶ … ─▶ analysis] ─▶ report

1. **Symptom check in the served configuration.** The engine runs exactly as the user serves it (their engine
   arguments; none: vLLM's defaults — compiled, prefix caching, chunked prefill, batched), untraced, and its sampled
   logprobs are compared with the reference teacher-forced on the same ids (:mod:`ekka_core.symptom`).
2. **Input fidelity.** The ids the engine's request path actually fed the model, for every request, against what the
   reference's own tokenizer or chat template makes of the same input: any difference is ``inputs-differ``, before
   any tensor is compared.
3. **The traced comparison** in the traced baseline (:mod:`ekka_core.capture.vllm_config`: eager, no prefix cache,
   whole prompts, one request at a time), every change from the served configuration recorded with why.
4. **Triage** when exactly one of the served and the traced configuration diverges at the output level: delta
   debugging over the features in which they differ finds the culprit, and the comparison is traced again with the
   culprit's features on wherever hooks can see them (:mod:`ekka_core.triage`).

The shells (CLI, language server) call :func:`diagnose` and nothing else.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from ekka_core import __version__
from ekka_core.agent import AgentConfig, AgentOutcome, complete_mapping
from ekka_core.align import Traces, align
from ekka_core.analysis import Ranking, analyse, convention_noise
from ekka_core.capture import CaptureResult, EngineRun, capture, load, run_engine, score_run
from ekka_core.capture.scores import scores_from_traces
from ekka_core.capture.trace import Trace
from ekka_core.capture.vllm_config import configuration, factor_values, served_args
from ekka_core.contracts.errors import EkkaError
from ekka_core.contracts.serving import FACTORS, TRACEABLE_FACTORS, EngineOutputs, SymptomCheck, Trial, Triage
from ekka_core.contracts.spec import DiagnosisSpec
from ekka_core.mapping import map_components, rules_enabled
from ekka_core.report import build_report, write_report
from ekka_core.symptom import check_symptom
from ekka_core.tree import build_tree, call_site, forward_span
from ekka_core.triage import triage

Progress = Callable[[str, str], None]   # (stage, message)

# How far a correct engine's sampled logprobs are from the reference's in the same dtype, in units of that reference's
# own rounding error (SymptomCheck.same_dtype): the largest clean value over every zoo architecture, from the noise
# model (benchmarks/convention_noise.py), with a margin. Above it, an output-level difference needs an explanation.
OUTPUT_SAME_DTYPE_NOISE = 1.25 * (convention_noise().get("output_same_dtype") or 1.2)


@dataclass
class Diagnosis:
    report: dict[str, Any]
    paths: dict[str, Path]


@dataclass
class Serving:
    """What the diagnosis learnt about the configurations it ran: the report's ``serving`` section."""

    served_args: dict[str, Any]
    served: EngineRun | None = None
    served_check: SymptomCheck | None = None
    traced_check: SymptomCheck | None = None
    traced_args: dict[str, Any] | None = None
    changes: list[dict[str, Any]] | None = None
    machine_changes: list[dict[str, Any]] | None = None   # what this machine forces on every run (said out loud)
    traced_resolved: dict[str, Any] | None = None
    triage: Triage | None = None

    def to_json(self) -> dict[str, Any]:
        return {"served_args": self.served_args,
                "served_resolved": self.served.outputs.resolved if self.served else self.traced_resolved,
                "served": asdict(self.served_check) if self.served_check else None,
                "traced": asdict(self.traced_check) if self.traced_check else None,
                "traced_args": self.traced_args, "changes": self.changes or [],
                "triage": asdict(self.triage) if self.triage else None}


def diagnose(spec: DiagnosisSpec, out_dir: Path, *, fresh: bool = False,
             progress: Progress = lambda stage, msg: None, env: dict[str, str] | None = None,
             agent_config: AgentConfig | None = None) -> Diagnosis:
    """``env`` adds to the environment the engines and the stages read (EKKA_INJECT_BUG, EKKA_MAPPING_RULES,
    ANTHROPIC_API_KEY, …); ``agent_config`` replaces the agent's configuration read from it."""
    spec.validate()
    environ = {**os.environ, **(env or {})}
    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    run = _Run(spec, out_dir, fresh, progress, env, environ, agent_config, t0)
    return run.diagnose()


class _Run:
    """One diagnosis' state while it runs (the stages' artefacts, in order)."""

    def __init__(self, spec: DiagnosisSpec, out_dir: Path, fresh: bool, progress: Progress,
                 env: dict[str, str] | None, environ: dict[str, str], agent_config: AgentConfig | None, t0: float):
        self.spec, self.out_dir, self.fresh, self.progress = spec, out_dir, fresh, progress
        self.env, self.environ, self.agent_config, self.t0 = env, environ, agent_config, t0
        self.serving: Serving | None = None
        self.meta: dict[str, Any] = {"ekka_version": __version__}

    # -- the whole diagnosis ----------------------------------------------------------------------------------
    def diagnose(self) -> Diagnosis:
        spec = self.spec
        served_first = spec.target == "vllm" and not spec.target_trace
        one_run = False
        if served_first:
            args, machine = served_args(spec)
            self.serving = Serving(served_args=args, changes=[asdict(c) for c in machine],
                                   machine_changes=[asdict(c) for c in machine])
            # A served configuration that already is the traced baseline needs no run of its own: the traced run is
            # the served run (hooks do not change what the engine computes).
            one_run = not configuration(args, None)[1]
            resolved = None
            if not one_run:
                served = self._symptom(args)
                differ = preflight_inputs(spec, served.outputs, served.scores["own_prompt_token_ids"])
                if differ:
                    return self._inputs_differ(differ, where="served")
                resolved = served.outputs.resolved
            traced_args, changes = configuration(args, resolved)
            self.serving.traced_args = traced_args
            self.serving.changes = [asdict(c) for c in machine + changes]
            captured = capture(spec, self.out_dir, args=traced_args, changes=self.serving.changes, fresh=self.fresh,
                               progress=lambda m: self.progress("capture", m), env=self.env)
        else:
            captured = capture(spec, self.out_dir, fresh=self.fresh, progress=lambda m: self.progress("capture", m),
                               env=self.env)
        target, reference, reference_fp32 = load(captured)
        self.meta.update({"target": _describe(target), "reference": _describe(reference),
                          "traces": str(captured.target.parent), "reused_traces": captured.reused})
        differ = preflight_inputs(spec, _trace_outputs(target), reference.run.own_prompt_token_ids,
                                  fed_from="the trace")
        if differ:
            return self._inputs_differ(differ, where="traced")
        ranking, agent, tree = self._compare(target, reference, reference_fp32, name="")
        if self.serving is not None:
            self.serving.traced_check = self._traced_check(captured, target, reference, reference_fp32)
            if one_run:
                self.serving.served_check = self.serving.traced_check
                self.serving.served_check.label = "served configuration (= the traced baseline: one run)"
            else:
                ranking, agent = self._triage(ranking, agent)
        self._combine(ranking)
        return self._finish(ranking, agent)

    # -- 1. symptom in the served configuration -------------------------------------------------------------
    def _symptom(self, args: dict[str, Any]) -> EngineRun:
        say = lambda m: self.progress("capture", m)   # noqa: E731 - progress shows it as part of capture
        say("symptom check: the served configuration, untraced")
        served = run_engine(self.spec, self.out_dir / "runs" / "served", args, label="served", fresh=self.fresh,
                            env=self.env, progress=say)
        assert self.serving is not None
        self.serving.served = served
        self.serving.served_check = check_symptom(served.outputs, served.scores, threshold=self.spec.threshold,
                                                  label="served configuration")
        say(self.serving.served_check.words())
        return served

    def _traced_check(self, captured: CaptureResult, target: Trace, reference: Trace, reference_fp32: Trace
                      ) -> SymptomCheck:
        outputs = EngineOutputs.load(captured.target)
        assert self.serving is not None
        self.serving.traced_resolved = outputs.resolved
        scores = scores_from_traces(outputs, reference, reference_fp32)
        if scores is None:     # a restricted trace lacks logits rows: score with a reference run of its own
            scores = score_run(self.spec, captured.target, env=self.env)
        return check_symptom(outputs, scores, threshold=self.spec.threshold, label="traced baseline")

    # -- 3. the traced comparison ----------------------------------------------------------------------------
    def _compare(self, target: Trace, reference: Trace, reference_fp32: Trace, *, name: str
                 ) -> tuple[Ranking, AgentOutcome, Any]:
        spec, progress = self.spec, self.progress
        progress("tree", "building model trees")
        t_tree, r_tree = build_tree(target), build_tree(reference)
        progress("mapping", "mapping components")
        mapping = map_components(t_tree, r_tree, rules=rules_enabled(self.environ))
        traces = Traces(target, reference, reference_fp32)
        # What the rules left with "no rule": knowledge base first ($0), then the agent if a key is set. Never
        # raises. A session that calls the API leaves its transcript next to the report.
        agent = complete_mapping(mapping, t_tree, r_tree, traces=traces,
                                 config=self.agent_config if self.agent_config is not None
                                 else AgentConfig.from_env(self.environ), transcript_dir=self.out_dir)
        if agent.status != "nothing-to-do":
            progress("mapping", agent.summary())
        mapping.save(self.out_dir / (f"mapping-{name}.json" if name else "mapping.json"))
        progress("align", "aligning activations and proving the alignment")
        aligned = align(mapping, traces)
        progress("analysis", "computing error ratios and the first divergence")
        classes = _classes(target, t_tree)
        unchecked = [{"module": u.module, "reason": u.reason} for u in mapping.unmapped]
        dtype = target.run.dtype.removeprefix("torch.")
        entered = {m: calls[0].entered_after for m, calls in target.by_module().items()}

        def locate(owner: str, child_from: str, child_to: str) -> tuple[str, int, int] | None:
            c = classes.get(owner)
            return forward_span(c["cls"], c["qualname"], c["file"], child_from, child_to) if c else None

        ranking = analyse(aligned, threshold=spec.threshold, dtype=dtype, target_classes=classes,
                          prompt_lens=target.run.prompt_lens, unchecked=unchecked, entered=entered, locate=locate)
        for suspect in ranking.suspects:
            site = call_site(t_tree, suspect.module)
            if site:
                suspect.call_file, suspect.call_line = site
        for (seq, pos), (_, why) in sorted(aligned.excluded.items()):
            ranking.notes.append(f"prompt {seq}, token {pos} excluded from there on — {why}")
        cached = [n for n in target.run.cached_tokens if n]
        if cached:
            ranking.notes.append("positions served from the prefix cache were not computed for their request and "
                                 "are not compared: " + ", ".join(
                                     f"request {s}: tokens 0–{n - 1}" for s, n in enumerate(target.run.cached_tokens)
                                     if n))
        return ranking, agent, t_tree

    # -- 4. triage ---------------------------------------------------------------------------------------------
    def _triage(self, ranking: Ranking, agent: AgentOutcome) -> tuple[Ranking, AgentOutcome]:
        serving = self.serving
        assert serving is not None and serving.served is not None and serving.served_check is not None
        served_check, traced_check = serving.served_check, serving.traced_check
        assert traced_check is not None
        if served_check.diverges == traced_check.diverges:
            if served_check.diverges:
                serving.triage = Triage(served_check, traced_check, direction="both",
                                        words="diverges in the served configuration and in the traced baseline "
                                              "alike: no served feature is needed to show it")
            return ranking, agent
        self.progress("capture", "configuration triage: which served feature makes the difference")
        traced_outputs = EngineOutputs.load(Path(self.meta["traces"]) / "target")
        differing, ruled_out = differing_factors(self.spec, serving.served.outputs, traced_outputs)
        resolved = serving.served.outputs.resolved
        trials: list[int] = []

        def run_trial(keep: list[str]) -> tuple[SymptomCheck | None, Trial]:
            trials.append(1)
            args, _ = configuration(serving.served_args, resolved, keep)
            label = f"trial {len(trials)}: baseline + {', '.join(keep) or 'nothing'}"
            try:
                trial_run = run_engine(self.spec, self.out_dir / "runs" / f"trial-{'+'.join(sorted(keep))}", args,
                                       label=label, fresh=self.fresh, env=self.env,
                                       progress=lambda m: self.progress("capture", m))
            except EkkaError as e:
                return None, Trial(keep, args, None, None, error=str(e))
            check = check_symptom(trial_run.outputs, trial_run.scores, threshold=self.spec.threshold, label=label)
            self.progress("capture", check.words())
            return check, Trial(keep, args, check.ratio, check.diverges, seconds=trial_run.outputs.seconds)

        result = triage(served_check, traced_check, differing, ruled_out, run_trial)
        serving.triage = result
        if "compilation" in result.culprit:
            self._narrow_compilation(result, resolved)
        keep = [f for f in result.culprit if f in TRACEABLE_FACTORS]
        if result.direction != "served-diverges" or not keep:
            return ranking, agent
        # Trace again with the culprit's features on, where hooks can see them.
        args, changes = configuration(serving.served_args, resolved, keep)
        self.progress("capture", f"tracing again with {', '.join(keep)} as served")
        captured = capture(self.spec, self.out_dir, args=args,
                           changes=(serving.machine_changes or []) + [asdict(c) for c in changes], name="culprit",
                           fresh=self.fresh, progress=lambda m: self.progress("capture", m), env=self.env)
        target, reference, reference_fp32 = load(captured)
        culprit_ranking, culprit_agent, _ = self._compare(target, reference, reference_fp32, name="culprit")
        result.traced_under = keep
        self.meta["culprit_traces"] = str(captured.target.parent)
        self.meta["culprit_target"] = _describe(target)
        return culprit_ranking, culprit_agent

    def _narrow_compilation(self, result: Triage, resolved: dict[str, Any]) -> None:
        """Hooks cannot see into a compiled graph; narrow it as far as the engine allows: the culprit configuration
        with torch.compile's ``eager`` backend (Dynamo captures the same graphs, Inductor generates no code)."""
        serving = self.serving
        assert serving is not None
        args, _ = configuration(serving.served_args, resolved, result.culprit)
        args["compilation_config"] = {**args.get("compilation_config", {}), "backend": "eager"}
        label = "culprit with compile backend eager"
        try:
            narrow = run_engine(self.spec, self.out_dir / "runs" / "trial-compile-backend-eager", args, label=label,
                                fresh=self.fresh, env=self.env, progress=lambda m: self.progress("capture", m))
        except EkkaError as e:
            result.trials.append(Trial(result.culprit + ["backend=eager"], args, None, None, error=str(e)))
            return
        check = check_symptom(narrow.outputs, narrow.scores, threshold=self.spec.threshold, label=label)
        result.trials.append(Trial(result.culprit + ["backend=eager"], args, check.ratio, check.diverges,
                                   seconds=narrow.outputs.seconds))
        result.words += ("; with torch.compile's eager backend (Dynamo graphs, no Inductor code) it still diverges: "
                         "the graph capture or vLLM's own passes, not Inductor's generated code"
                         if check.diverges else
                         "; with torch.compile's eager backend (Dynamo graphs, no Inductor code) it does not: "
                         "Inductor's generated code makes the difference")

    def _combine(self, ranking: Ranking) -> None:
        """The verdict says what users see: a served configuration that diverges at the output level is divergent
        even where no traceable module explains it (a compiled graph); that is never reported as consistent."""
        self._conventions_decide(ranking)
        serving = self.serving
        if serving is None or serving.served_check is None:
            return
        served = serving.served_check
        if served.diverges and ranking.verdict == "consistent":
            ranking.verdict = "divergent"
            why = serving.triage.words if serving.triage and serving.triage.words else \
                "no traced module departs from the reference"
            ranking.notes.insert(0, f"the served configuration diverges at the output level (ratio {served.ratio:.2f}) "
                                    f"but {why}")

    def _conventions_decide(self, ranking: Ranking) -> None:
        """Departures from the reference's own rounding rank below ratio-level divergences, which decide the verdict
        when there are any. Otherwise a departure decides it — the engine's output differs from the reference's in
        the same dtype, and nothing else explains that — when it is beyond the noise of correct engines: at a step
        correct engines reproduce bit for bit (clean noise 0 in the noise model: any departure is a different
        computation), or with logprobs farther from the same-dtype reference than correct engines' ever are
        (:data:`OUTPUT_SAME_DTYPE_NOISE`). A departure within noise is listed, and the verdict stays consistent."""
        if not ranking.conventions:
            return
        if ranking.verdict == "divergent":
            for i, c in enumerate(ranking.conventions, len(ranking.suspects) + 1):
                c.rank = i
            return
        checks = [c for c in ((self.serving.served_check, self.serving.traced_check) if self.serving else ())
                  if c is not None and c.same_dtype is not None]
        apart = max((c.same_dtype for c in checks), default=None)
        exact = [c for c in ranking.conventions if c.noise == 0.0]
        differs = apart is None or apart > 0
        for i, c in enumerate(ranking.conventions, 1):
            c.rank = i
        if differs and (exact or (apart is not None and apart > OUTPUT_SAME_DTYPE_NOISE)):
            ranking.verdict = "divergent"
            ranking.suspects = list(ranking.conventions)
            why = (f"correct engines reproduce this step bit for bit (noise model: 0 over clean runs of every zoo "
                   f"architecture), this one does not" if exact else
                   f"the engine's logprobs are {apart:.2f}× the reference's own rounding away from the reference's "
                   f"{ranking.dtype} run (correct engines: ≤ {OUTPUT_SAME_DTYPE_NOISE:.2f})")
            out = f" (its logprobs are {apart:.2f}× the reference's rounding from the {ranking.dtype} reference)" \
                if apart is not None else ""
            ranking.notes.insert(0, f"no module departs from fp32 more than the reference does, but the engine "
                                    f"departs from the reference's {ranking.dtype} rounding{out}: {why}")
        else:
            ranking.notes.append("departures from the reference's rounding were found (listed), within the noise of "
                                 "correct engines and without an output-level effect beyond it: not a divergence")

    # -- endings -----------------------------------------------------------------------------------------------
    def _inputs_differ(self, differ: list[dict[str, Any]], *, where: str) -> Diagnosis:
        ranking = Ranking(verdict="inputs-differ", threshold=self.spec.threshold, dtype=self.spec.declared_dtype(),
                          inputs_differ=differ)
        ranking.notes.append(f"the ids the engine fed the model ({'served run' if where == 'served' else 'traced run'})"
                             " differ from what the reference's own tokenizer / chat template makes of the same "
                             "input: fix the engine's request path (special tokens, BOS, chat template, truncation) "
                             "and diagnose again")
        return self._finish(ranking, None)

    def _finish(self, ranking: Ranking, agent: AgentOutcome | None) -> Diagnosis:
        self.progress("report", "writing report.json, report.md, report.html")
        self.meta["seconds"] = round(time.perf_counter() - self.t0, 2)
        report = build_report(ranking, spec=self.spec.to_json(), meta=self.meta,
                              serving=self.serving.to_json() if self.serving else None)
        if agent is not None:
            report["agent"] = agent.to_json()
        return Diagnosis(report, write_report(report, self.out_dir))


def differing_factors(spec: DiagnosisSpec, served: EngineOutputs, traced: EngineOutputs
                      ) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The factors whose resolved values differ between the two runs, minus those that cannot matter for these
    requests (with why): no request hit the prefix cache; every wave's prompts fit one chunk; one request per wave."""
    sv, tv = factor_values(served.resolved), factor_values(traced.resolved)
    differing = {f: {"served": sv[f], "baseline": tv[f]} for f in FACTORS if sv[f] != tv[f]}
    ruled_out: dict[str, str] = {}
    if "prefix_caching" in differing and not any(r.num_cached_tokens for r in served.requests):
        ruled_out["prefix_caching"] = "no request hit the prefix cache in the served run"
    waves: dict[int, list[int]] = {}
    for r in served.requests:
        waves.setdefault(r.wave, []).append(len(r.prompt_token_ids))
    budget = served.resolved.get("max_num_batched_tokens") or 0
    if "chunked_prefill" in differing and all(sum(lens) <= budget for lens in waves.values()):
        ruled_out["chunked_prefill"] = f"every wave's prompts fit one chunk of {budget} tokens"
    if "batching" in differing and all(len(lens) == 1 for lens in waves.values()):
        ruled_out["batching"] = "every wave holds a single request"
    for f in ruled_out:
        differing.pop(f)
    return differing, ruled_out


def preflight_inputs(spec: DiagnosisSpec, fed: EngineOutputs, own: list[list[int]], *, fed_from: str = "the engine"
                     ) -> list[dict[str, Any]]:
    """Per request: the ids the engine fed the model against the reference's own rendering of the same input. Any
    difference is reported with the first differing position, both id sequences and the tokens around it."""
    decode = _decoder(spec.model)
    requests = spec.request_list()
    differ = []
    for outcome in fed.requests:
        a = outcome.prompt_token_ids
        b = own[outcome.request] if outcome.request < len(own) else []
        if a == b:
            continue
        pos = next((j for j, (u, v) in enumerate(zip(a, b)) if u != v), min(len(a), len(b)))
        lo = max(0, pos - 3)
        req = requests[outcome.request] if outcome.request < len(requests) else None
        differ.append({"prompt": outcome.request, "request": req.id if req else str(outcome.request),
                       "input": req.kind if req else "?", "position": pos, "fed_from": fed_from,
                       "target": a[:pos + 8], "reference": b[:pos + 8], "target_len": len(a), "reference_len": len(b),
                       "target_ids": a, "reference_ids": b,
                       "target_tokens": decode(a[lo:pos + 4]), "reference_tokens": decode(b[lo:pos + 4]),
                       "window_start": lo})
    return differ


def _decoder(model: str) -> Callable[[list[int]], list[str]]:
    """Token ids → their text, one string per id (the checkpoint's tokenizer.json through `tokenizers`, no torch)."""
    path = Path(model) / "tokenizer.json"
    if not path.exists():
        return lambda ids: [str(i) for i in ids]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    return lambda ids: [tok.id_to_token(i) or str(i) for i in ids]


def _trace_outputs(trace: Trace) -> EngineOutputs:
    """What a target trace says the engine fed (for a trace Ekka's runner wrote, its outputs.json; for a served
    trace, the prompt ids its rows carried)."""
    try:
        return EngineOutputs.load(trace.dir)
    except EkkaError:
        from ekka_core.contracts.serving import RequestOutcome
        run = trace.run
        return EngineOutputs(run.framework, run.framework_version, "served trace", {}, {}, run.dtype, requests=[
            RequestOutcome(i, list(ids[:n]), list(g)) for i, (ids, n, g) in
            enumerate(zip(run.token_ids, run.prompt_lens, run.generated_ids or [[]] * len(run.token_ids)))])


def _classes(target: Trace, tree: Any) -> dict[str, dict[str, Any]]:
    """Class and source of every target module: those that ran (the tree) and those whose hooks never fire (a model
    wrapped by vLLM's compile decorator), which can still own the code between two children."""
    classes = {n: {"cls": c[0], "qualname": c[1], "file": c[2], "line": c[3], "forward_file": c[4],
                   "forward_line": c[5]} for n, c in target.run.module_classes.items()}
    classes.update({n: {"cls": m.cls, "qualname": m.qualname, "file": m.class_file, "line": m.class_line,
                        "forward_file": m.forward_file, "forward_line": m.forward_line}
                    for n, m in tree.modules.items()})
    return classes


def _describe(trace: Trace) -> dict[str, Any]:
    r = trace.run
    return {"framework": r.framework, "version": r.framework_version, "dtype": r.dtype,
            "attn_implementation": r.attn_implementation, "engine_args": r.engine_args,
            "resolved_config": r.resolved_config, "config_changes": r.config_changes}
