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
5. **The checks and the verdict.** What each step's evidence means is its check's (:mod:`ekka_core.checks`: inputs,
   the output checks, the module comparison, then :data:`~ekka_core.checks.AFTER_COMPARISON`); the verdict is the
   composer's (:mod:`ekka_core.checks.verdict`). This module only sequences the stages and hands the evidence on.

The shells (CLI, language server) call :func:`diagnose` and nothing else.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ekka_core import __version__
from ekka_core.agent import AgentConfig, AgentOutcome
from ekka_core.capture import (CaptureResult, EngineRun, capture, keep_scores, load, localise_compiled, run_engine,
                               score_run)
from ekka_core.capture.scores import scores_from_traces
from ekka_core.capture.trace import Trace
from ekka_core.capture.vllm_config import configuration, served_args
from ekka_core.checks import AFTER_COMPARISON, Evidence, conclude, run_check
from ekka_core.checks.inputs import check_inputs
from ekka_core.checks.modules import Comparison, ModuleCheck, compare_modules, describe
from ekka_core.contracts.checks import CheckOutcome
from ekka_core.contracts.env import INJECT_BUG
from ekka_core.contracts.errors import BadInput, EkkaError
from ekka_core.contracts.jsonable import to_json
from ekka_core.contracts.ranking import Ranking
from ekka_core.contracts.report import ConfigChange, InputsDiffer, Report, RunMeta, ServingSection
from ekka_core.contracts.serving import TRACEABLE_FACTORS, EngineOutputs, SymptomCheck, Trial, Triage
from ekka_core.contracts.spec import DiagnosisSpec
from ekka_core.report import build_report, write_report
from ekka_core.symptom import check_symptom
from ekka_core.triage import compile_backend_words, differing_factors, kept_as_served, triage

Progress = Callable[[str, str], None]   # (stage, message)


@dataclass
class Diagnosis:
    report: Report
    paths: dict[str, Path]


@dataclass
class Serving:
    """What the diagnosis learnt about the configurations it ran: the report's ``serving`` section."""

    served_args: dict[str, Any]
    served: EngineRun | None = None
    served_check: SymptomCheck | None = None
    traced_check: SymptomCheck | None = None
    traced_args: dict[str, Any] | None = None
    changes: list[ConfigChange] = field(default_factory=list)
    machine_changes: list[ConfigChange] = field(default_factory=list)   # what this machine forces on every run
    traced_resolved: dict[str, Any] | None = None
    triage: Triage | None = None

    def section(self) -> ServingSection:
        return ServingSection(served_args=self.served_args,
                              served_resolved=self.served.outputs.resolved if self.served else self.traced_resolved,
                              served=self.served_check, traced=self.traced_check, traced_args=self.traced_args,
                              changes=list(self.changes), triage=self.triage)


def diagnose(spec: DiagnosisSpec, out_dir: Path, *, fresh: bool = False,
             progress: Progress = lambda stage, msg: None, env: dict[str, str] | None = None,
             agent_config: AgentConfig | None = None) -> Diagnosis:
    """``env`` adds to the environment the engines and the stages read (EKKA_INJECT_BUG, EKKA_MAPPING_RULES,
    ANTHROPIC_API_KEY, …); ``agent_config`` replaces the agent's configuration read from it."""
    spec.validate()
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise BadInput(f"--out {out_dir} is a file, not a directory", fix="pass a directory (new or existing) for "
                                                                         "the report and traces")
    environ = {**os.environ, **(env or {})}
    run = _Run(spec, out_dir, fresh, progress, env, environ, agent_config)
    return run.diagnose()


class _Run:
    """One diagnosis while it runs: it sequences the stages and the checks, and holds what they produced. What each
    check concludes is the check's (``ekka_core/checks/``); the verdict is the composer's (``checks/verdict.py``)."""

    def __init__(self, spec: DiagnosisSpec, out_dir: Path, fresh: bool, progress: Progress,
                 env: dict[str, str] | None, environ: dict[str, str], agent_config: AgentConfig | None):
        self.spec, self.out_dir, self.fresh, self.progress = spec, out_dir, fresh, progress
        self.env, self.environ, self.agent_config = env, environ, agent_config
        self.t0 = time.perf_counter()
        self.serving: Serving | None = None
        self.meta = RunMeta(ekka_version=__version__)
        self.evidence = Evidence(spec)

    def _say(self, message: str) -> None:
        self.progress("capture", message)

    def _record(self, outcome: CheckOutcome) -> CheckOutcome:
        self.evidence.outcomes.append(outcome)
        return outcome

    # -- the whole diagnosis ----------------------------------------------------------------------------------
    def diagnose(self) -> Diagnosis:
        spec = self.spec
        served_first = spec.target == "vllm" and not spec.target_trace
        one_run = False
        if served_first:
            args, machine = served_args(spec)
            self.serving = Serving(served_args=args, changes=list(machine), machine_changes=list(machine))
            # A served configuration that already is the traced baseline needs no run of its own: the traced run is
            # the served run (hooks do not change what the engine computes).
            one_run = not configuration(args, None)[1]
            resolved = served = None
            if not one_run:
                served = self._serve(args)
                if served.scores is not None and (ended := self._served_inputs_differ(served)) is not None:
                    return ended
                resolved = served.outputs.resolved
            traced_args, changes = configuration(args, resolved)
            self.serving.traced_args = traced_args
            self.serving.changes = list(machine) + list(changes)
            # An unscored served run has its reference run beside the traced engine, on the served tokens.
            beside = served.directory if served is not None and served.scores is None else None
            captured = capture(spec, self.out_dir, args=traced_args, changes=to_json(self.serving.changes),
                               fresh=self.fresh, progress=self._say, env=self.env, beside=beside)
            if beside is not None:
                assert served is not None
                self._score_served(served, args, captured)
                if (ended := self._served_inputs_differ(served)) is not None:
                    return ended
        else:
            captured = capture(spec, self.out_dir, fresh=self.fresh, progress=self._say, env=self.env)
        target, reference, reference_fp32 = load(captured)
        if self.serving is not None:
            # What the traced run changed on its own (the served run's tokens, forced: vllm_forcing) is said too.
            said = {c.arg for c in self.serving.changes}
            recorded = [ConfigChange(**c) for c in target.run.config_changes]
            self.serving.changes += [c for c in recorded if c.arg not in said]
        self.meta.target, self.meta.reference = describe(target), describe(reference)
        self.meta.traces, self.meta.reused_traces = str(captured.target.parent), captured.reused
        outcome, differ = check_inputs(spec, _trace_outputs(target), reference.run.own_prompt_token_ids,
                                       where="traced run", fed_from="the trace")
        if self._record(outcome).status == "diverges":
            return self._inputs_differ(differ)
        comparison = self._compare(target, reference, reference_fp32, name="")
        if self.serving is not None:
            self.serving.traced_check = self._traced_check(captured, target, reference, reference_fp32)
            self.evidence.traced_check = self.serving.traced_check
            if one_run:
                self.serving.served_check = self.serving.traced_check
                self.serving.served_check.label = "served configuration (= the traced baseline: one run)"
                self.evidence.served_check = self.serving.served_check
            else:
                comparison = self._triage(comparison)
        return self._finish(comparison)

    # -- the symptom in the served configuration -------------------------------------------------------------
    def _serve(self, args: dict[str, Any]) -> EngineRun:
        """The served configuration, untraced; scored here only when the whole run is reused (otherwise by the
        reference that runs beside the traced engine: :meth:`_score_served`)."""
        self._say("symptom check: the served configuration, untraced")
        served = run_engine(self.spec, self.out_dir / "runs" / "served", args, label="served", fresh=self.fresh,
                            env=self.env, progress=self._say, score=False)
        assert self.serving is not None
        self.serving.served = served
        if served.scores is not None:
            self._served_symptom(served)
        return served

    def _score_served(self, served: EngineRun, args: dict[str, Any], captured: CaptureResult) -> None:
        """Score the served run from the reference traces made on its tokens beside the traced engine; from a
        reference run of its own where there are none (no room beside, a reference that failed there) or they
        cannot score it (MoE routing ties: the score run's second noise floor)."""
        scores = captured.beside_scores
        if scores is None:
            self._say("scoring the served run against the reference (hf, teacher-forced)")
            scores = score_run(self.spec, served.directory, env=self.env)
        keep_scores(self.spec, served, args, scores, env=self.env)
        self._served_symptom(served)

    def _served_symptom(self, served: EngineRun) -> None:
        assert self.serving is not None and served.scores is not None
        self.serving.served_check = check_symptom(served.outputs, served.scores, threshold=self.spec.threshold,
                                                  label="served configuration")
        self.evidence.served_check = self.serving.served_check
        self._say(self.serving.served_check.words())

    def _served_inputs_differ(self, served: EngineRun) -> Diagnosis | None:
        """The input-fidelity check of the served run (recorded): the diagnosis that ends here when its inputs
        differ from the reference's own, else None."""
        assert served.scores is not None
        outcome, differ = check_inputs(self.spec, served.outputs, served.scores.own_prompt_token_ids,
                                       where="served run")
        return self._inputs_differ(differ) if self._record(outcome).status == "diverges" else None

    def _traced_check(self, captured: CaptureResult, target: Trace, reference: Trace, reference_fp32: Trace
                      ) -> SymptomCheck:
        outputs = EngineOutputs.load(captured.target)
        assert self.serving is not None
        self.serving.traced_resolved = outputs.resolved
        scores = scores_from_traces(outputs, reference, reference_fp32)
        if scores is None:     # a restricted trace lacks logits rows: score with a reference run of its own
            scores = score_run(self.spec, captured.target, env=self.env)
        return check_symptom(outputs, scores, threshold=self.spec.threshold, label="traced baseline")

    # -- the traced comparison ----------------------------------------------------------------------------------
    def _compare(self, target: Trace, reference: Trace, reference_fp32: Trace, *, name: str) -> Comparison:
        return compare_modules(target, reference, reference_fp32, threshold=self.spec.threshold,
                               out_dir=self.out_dir, environ=self.environ, agent_config=self.agent_config,
                               progress=self.progress, name=name)

    # -- triage -------------------------------------------------------------------------------------------------
    def _triage(self, comparison: Comparison) -> Comparison:
        serving = self.serving
        assert serving is not None and serving.served is not None and serving.served_check is not None
        served_check, traced_check = serving.served_check, serving.traced_check
        assert traced_check is not None
        if served_check.diverges == traced_check.diverges:
            if served_check.diverges:
                serving.triage = Triage(served_check, traced_check, direction="both",
                                        words="diverges in the served configuration and in the traced baseline "
                                              "alike: no served feature is needed to show it")
                self.evidence.triage = serving.triage
            return comparison
        self._say("configuration triage: which served feature makes the difference")
        assert self.meta.traces is not None
        traced_outputs = EngineOutputs.load(Path(self.meta.traces) / "target")
        differing, ruled_out = differing_factors(serving.served.outputs, traced_outputs)
        resolved = serving.served.outputs.resolved
        # The same computation for these requests whatever a trial keeps, and part of vLLM's compile cache key.
        as_served = kept_as_served(ruled_out)
        trials: list[int] = []

        def trial_args(keep: list[str]) -> dict[str, Any]:
            return configuration(serving.served_args, resolved, [*keep, *as_served])[0]

        def run_trial(keep: list[str]) -> tuple[SymptomCheck | None, Trial]:
            trials.append(1)
            label = f"trial {len(trials)}: baseline + {', '.join(keep) or 'nothing'}"
            check, trial, _run = self._trial(trial_args(keep), label, keep, f"trial-{'+'.join(sorted(keep))}")
            return check, trial

        result = triage(served_check, traced_check, differing, ruled_out, run_trial)
        result.kept_as_served = as_served
        serving.triage = self.evidence.triage = result
        if "compilation" in result.culprit:
            culprit_args = trial_args(result.culprit)
            self._narrow_compilation(result, culprit_args)
            if result.direction == "served-diverges":
                self._localise_in_graph(result, culprit_args)
        keep = [f for f in result.culprit if f in TRACEABLE_FACTORS]
        if result.direction != "served-diverges" or not keep:
            return comparison
        # Trace again with the culprit's features on, where hooks can see them.
        args, changes = configuration(serving.served_args, resolved, keep)
        self._say(f"tracing again with {', '.join(keep)} as served")
        # The trial of this configuration ran untraced: its tokens let the reference run beside the engine.
        trial = self.out_dir / "runs" / f"trial-{'+'.join(sorted(keep))}"
        captured = capture(self.spec, self.out_dir, args=args, changes=to_json(serving.machine_changes + list(changes)),
                           name="culprit", fresh=self.fresh, progress=self._say, env=self.env,
                           beside=trial if (trial / "outputs.json").exists() else None)
        target, reference, reference_fp32 = load(captured)
        culprit = self._compare(target, reference, reference_fp32, name="culprit")
        result.traced_under = keep
        self.meta.culprit_traces = str(captured.target.parent)
        self.meta.culprit_target = describe(target)
        return culprit

    def _trial(self, args: dict[str, Any], label: str, factors: list[str], run_dir: str
               ) -> tuple[SymptomCheck | None, Trial, EngineRun | None]:
        """One untraced engine run of a triage trial, its symptom check and the run (None: the configuration could
        not run)."""
        try:
            trial_run = run_engine(self.spec, self.out_dir / "runs" / run_dir, args, label=label, fresh=self.fresh,
                                   env=self.env, progress=self._say)
        except EkkaError as e:
            return None, Trial(factors, args, None, None, error=str(e)), None
        check = check_symptom(trial_run.outputs, trial_run.scores, threshold=self.spec.threshold, label=label)
        self._say(check.words())
        return check, Trial(factors, args, check.ratio, check.diverges, seconds=trial_run.outputs.seconds,
                            compiled_graph=trial_run.outputs.resolved.get("compile_cache") or ""), trial_run

    def _narrow_compilation(self, result: Triage, culprit_args: dict[str, Any]) -> None:
        """Hooks cannot see into a compiled graph; narrow it as far as the engine allows: the culprit configuration
        with torch.compile's ``eager`` backend (Dynamo captures the same graphs, Inductor generates no code)."""
        args = {**culprit_args,
                "compilation_config": {**culprit_args.get("compilation_config", {}), "backend": "eager"}}
        check, trial, run = self._trial(args, "culprit with compile backend eager", result.culprit + ["backend=eager"],
                                        "trial-compile-backend-eager")
        result.trials.append(trial)
        if check is not None and run is not None:
            result.words += compile_backend_words(check, run.outputs.resolved.get("compilation_backend"))

    def _localise_in_graph(self, result: Triage, culprit_args: dict[str, Any]) -> None:
        """Hooks stop at the compiled graph; the graph itself does not: the culprit configuration once more, its
        compiled graph replayed piece by piece against itself run eagerly, inside the engine (the graph check reads
        it)."""
        self._say("in-graph localisation: the compiled graph, piece by piece, against itself run eagerly")
        graph = localise_compiled(self.spec, self.out_dir / "runs" / "graph-localisation", culprit_args,
                                  fresh=self.fresh, env=self.env, progress=self._say)
        # Which configuration the graph came from is said with it (the report lists triage's trials, not this run).
        graph.notes.insert(0, f"in-graph localisation ran the traced baseline with {' and '.join(result.culprit)} "
                              f"as served (engine arguments {culprit_args})")
        self.evidence.graph = graph
        if graph.departs and graph.suspect is not None:
            self._say(f"the compiled graph departs at {graph.suspect.module}")

    # -- endings -----------------------------------------------------------------------------------------------
    def _inputs_differ(self, differ: list[InputsDiffer]) -> Diagnosis:
        ranking = Ranking(verdict="inputs-differ", threshold=self.spec.threshold, dtype=self.spec.declared_dtype(),
                          inputs_differ=differ)
        return self._report(ranking, None)

    def _finish(self, comparison: Comparison) -> Diagnosis:
        """The checks that read the comparison, then the composer's verdict."""
        evidence, ranking = self.evidence, comparison.ranking
        evidence.ranking, evidence.aligned = ranking, comparison.aligned
        self._record(run_check(ModuleCheck(), evidence))
        for check in AFTER_COMPARISON:
            self._record(run_check(check, evidence))
        return self._report(ranking, comparison.agent)

    def _report(self, ranking: Ranking, agent: AgentOutcome | None) -> Diagnosis:
        evidence = self.evidence
        composed = conclude(evidence, ranking)
        injected = self.environ.get(INJECT_BUG)
        if injected:
            # A benchmark bug re-injected into the engine (Ekka's plugin reads it in every engine process): said first
            # wherever the report is read, so a variable left in a shell never passes for the engine's own behaviour.
            self.meta.injected_bug = injected
            ranking.notes.insert(0, f"{INJECT_BUG}={injected} was set: the engine ran with Ekka's re-injected "
                                    f"benchmark bug {injected!r}, not as released — unset {INJECT_BUG} to "
                                    "diagnose the engine itself")
        self.progress("report", "writing report.json, report.md, report.html")
        self.meta.seconds = round(time.perf_counter() - self.t0, 2)
        report = build_report(ranking, spec=self.spec, meta=self.meta,
                              serving=self.serving.section() if self.serving else None,
                              agent=agent.to_report() if agent is not None else None, missing=composed.missing,
                              checks=[o.record for o in evidence.outcomes], graph=evidence.graph)
        return Diagnosis(report, write_report(report, self.out_dir))


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
