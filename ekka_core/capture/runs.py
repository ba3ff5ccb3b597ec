"""The capture stage's runs: :func:`capture` (the traced comparison: the target traced, then the reference
teacher-forced on its tokens, in the same low precision and in fp32 — beside the engine, on the second core, when an
earlier run's tokens are given), :func:`run_engine` (one untraced engine run, scored against the reference:
:func:`score_run`, or later: :func:`keep_scores`) and :func:`load`. Each run happens in its own process
(``python -m ekka_core.capture.run_process``, forked from the warm host where it may be); runs are reused while
what they read is unchanged."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ekka_core.capture.external import external_target
from ekka_core.capture.run_host import run_hosted
from ekka_core.capture.run_process import REFERENCE_THREADS_ENV
from ekka_core.capture.scores import scores_from_traces
from ekka_core.capture.trace import INDEX, RunInfo, Trace
from ekka_core.capture.vllm_graphs import GRAPH_DIR_ENV, GRAPH_THRESHOLD_ENV, RESULT_FILE
from ekka_core.capture.vllm_plugin import LET_GO_WHILE_LOADING_ENV
from ekka_core.contracts.errors import EkkaError, InternalFailure
from ekka_core.contracts.graph import GraphLocalisation
from ekka_core.contracts.jsonable import from_json
from ekka_core.contracts.scores import SCORES_FILE, SCORES_SCHEMA, ReferenceScores
from ekka_core.contracts.serving import EngineOutputs
from ekka_core.contracts.spec import DiagnosisSpec

Progress = Callable[[str], None]


@dataclass
class CaptureResult:
    target: Path
    reference: Path
    reference_fp32: Path
    reused: bool = False
    # The reference was teacher-forced beside the engine on the tokens of the run ``capture(beside=…)`` named, and
    # the target fed the same: it is ``reference``/``reference_fp32``.
    reference_beside: bool = False
    # That run's scores, read from the reference made on its tokens (None: none was made, or it cannot score the run
    # — MoE routing ties, a positions-restricted trace — and a score run must).
    beside_scores: ReferenceScores | None = None


@dataclass
class EngineRun:
    """One engine configuration's run: what the engine produced and the reference's logprobs on the same tokens."""

    directory: Path
    outputs: EngineOutputs
    scores: ReferenceScores | None      # None only for a run made with ``score=False`` until it is scored
    reused: bool = False


def capture(spec: DiagnosisSpec, out_dir: Path, *, args: dict[str, Any] | None = None,
            changes: list[dict[str, Any]] | None = None, name: str = "", fresh: bool = False,
            progress: Progress = lambda msg: None, env: dict[str, str] | None = None,
            beside: Path | None = None) -> CaptureResult:
    """Trace the target with engine arguments ``args`` (``changes``: how they differ from the served configuration,
    recorded in the trace) and the reference teacher-forced on its tokens. ``name`` puts the three traces under
    ``traces/<name>/`` (the first traced configuration uses ``traces/`` itself).

    ``beside``: an untraced run of the same spec (its directory, ``outputs.json``) whose tokens are known already.
    While the target is traced, the reference runs on the second core teacher-forced on *those* tokens; when the
    traced target fed the model the same tokens (the usual case: same prompts, greedy), that is the reference trace
    and nothing waits for it afterwards; either way it scores that run (``CaptureResult.beside_scores``)."""
    out_dir = Path(out_dir)
    traces = out_dir / "traces" / name if name else out_dir / "traces"
    result = CaptureResult(traces / "target", traces / "reference", traces / "reference-fp32")
    stamp = traces / "spec.json"
    if spec.target_trace:
        result.target = Path(spec.target_trace)
    fingerprint = (spec.fingerprint(without=() if args is None else EXPLICIT_ARGS) + _env_fingerprint(env)
                   + _trace_fingerprint(spec.target_trace) + _args_fingerprint(args) + f"|recorded={RECORDED}")
    if not fresh and stamp.exists() and json.loads(stamp.read_text()).get("fingerprint") == fingerprint \
            and all(_complete(p) for p in (result.target, result.reference, result.reference_fp32)):
        progress("reusing traces (inputs unchanged; --fresh to re-capture)")
        result.reused = True
        return result
    traces.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    spec_file = traces / "spec.in.json"
    spec_file.write_text(json.dumps(spec.to_json()))

    if spec.target_trace:
        progress(f"using the target trace {spec.target_trace} (captured outside Ekka)")
        result.target = external_target(spec)
    else:
        progress(f"tracing the target ({spec.target}, {spec.dtype})")
        if args is None and spec.target == "vllm":
            args, changes = _traced_baseline_args(spec)
        run_file = traces / "run.in.json"
        run = {"args": args, "label": name or "traced", "trace": True, "changes": changes or []}
        reference_beside = made = beside_outputs = None
        if beside is not None and room_beside(spec, env):
            beside_outputs = EngineOutputs.load(beside)
            if spec.target == "vllm":
                # The traced run samples what that run sampled, so the reference made beside it on those tokens is
                # its reference (vllm_forcing; the engine samples its own where it cannot be forced).
                run.update(_forced_tokens(beside_outputs))
            progress("the reference (hf) runs beside the engine, on the served run's tokens")
            reference_beside = _Beside(spec_file, Path(beside), traces / "beside", env)
        run_file.write_text(json.dumps(run, default=str))
        # The engine lets go of its checkpoint's pages as it loads (the reference does too): two loads side by side
        # never hold two whole checkpoints.
        try:
            _worker("target", spec_file, result.target, {**(env or {}), LET_GO_WHILE_LOADING_ENV: "0.1"},
                    extra=[str(run_file)])
        finally:
            if reference_beside is not None:
                made = reference_beside.join()
        if made is not None:
            assert beside_outputs is not None
            _take_beside(result, beside_outputs, made, traces, progress)
    dtype = Trace(result.target).run.dtype.removeprefix("torch.")
    if not result.reference_beside:
        progress(f"tracing the reference (hf, {dtype} and float32, teacher-forced)")
        _worker("reference", spec_file, result.reference, env, extra=[str(result.target), str(result.reference_fp32)])
    stamp.write_text(json.dumps({"fingerprint": fingerprint, "spec": spec.to_json()}))
    return result


def _traced_baseline_args(spec: DiagnosisSpec) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The traced baseline for a caller that names no configuration: the spec's served arguments with every
    change tracing needs, each one recorded."""
    from dataclasses import asdict

    from ekka_core.capture.vllm_config import configuration, served_args
    served, machine = served_args(spec)
    args, changes = configuration(served, None)
    return args, [asdict(c) for c in machine + changes]


def _forced_tokens(outputs: EngineOutputs) -> dict[str, Any]:
    """The ``forced``/``forced_from`` entries of a target run's ``run.in.json``: per request index, the tokens
    ``outputs``' run sampled."""
    by_request = {r.request: r.generated for r in outputs.requests}
    forced = [by_request.get(i, []) for i in range(max(by_request, default=-1) + 1)]
    return {"forced": forced, "forced_from": outputs.label}


class _Beside:
    """The reference run in a thread of its own, on one torch thread (the engine runs on the other core), into
    ``scratch``/reference and ``scratch``/reference-fp32."""

    def __init__(self, spec_file: Path, run_dir: Path, scratch: Path, env: dict[str, str] | None):
        self.made, self.failed = (scratch / "reference", scratch / "reference-fp32"), False
        env = {**(env or {}), REFERENCE_THREADS_ENV: "1"}
        scratch.mkdir(parents=True, exist_ok=True)
        self.thread = threading.Thread(target=self._run, args=(spec_file, run_dir, env), daemon=True,
                                       name="ekka-reference-beside")
        self.thread.start()

    def _run(self, spec_file: Path, run_dir: Path, env: dict[str, str]) -> None:
        try:
            _worker("reference", spec_file, self.made[0], env, extra=[str(run_dir), str(self.made[1])],
                    log=self.made[0].parent / "reference.log")
        except EkkaError:       # the reference runs again after the engine, where its error is reported
            self.failed = True

    def join(self) -> tuple[Path, Path] | None:
        self.thread.join()
        return None if self.failed else self.made


def _take_beside(result: CaptureResult, outputs: EngineOutputs, made: tuple[Path, Path], traces: Path,
                 progress: Progress) -> None:
    """Score the run of ``outputs`` from the reference made on its tokens; keep it as the reference when the target
    fed the same tokens; remove the rest."""
    try:
        low, high = Trace(made[0]), Trace(made[1])
        result.beside_scores = scores_from_traces(outputs, low, high)
        same = _same_fed_tokens(low.run, Trace(result.target).run)
    except EkkaError:                              # an incomplete trace: the reference runs again after the engine
        same = False
    if same:
        progress("the reference ran beside the engine on the same tokens: reusing it")
        for path, kept in zip(made, (result.reference, result.reference_fp32)):
            shutil.rmtree(kept, ignore_errors=True)
            os.replace(path, kept)
        os.replace(made[0].parent / "reference.log", traces / "reference.log")
        result.reference_beside = True
    shutil.rmtree(made[0].parent, ignore_errors=True)


def room_beside(spec: DiagnosisSpec, env: dict[str, str] | None = None) -> bool:
    """Whether the reference may run beside an engine: a second core, and memory for the reference's fp32 copy of
    the weights, the engine's copy and its KV cache without either swapping (``EKKA_REFERENCE_BESIDE=0``: never)."""
    if {**os.environ, **(env or {})}.get("EKKA_REFERENCE_BESIDE") == "0" or (os.cpu_count() or 1) < 2:
        return False
    weights = sum(f.stat().st_size for f in Path(spec.model).glob("*.safetensors")) if Path(spec.model).is_dir() else 0
    available = _mem_available()
    return available is not None and weights > 0 and 2.5 * weights + 3 * 2**30 < available


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _same_fed_tokens(reference: RunInfo, target: RunInfo) -> bool:
    """Whether a reference trace was teacher-forced on exactly what the traced target fed its model."""
    return (reference.complete and reference.token_ids == target.token_ids
            and reference.prompt_lens == target.prompt_lens
            and reference.dtype.removeprefix("torch.") == target.dtype.removeprefix("torch."))


def run_engine(spec: DiagnosisSpec, directory: Path, args: dict[str, Any], *, label: str, fresh: bool = False,
               env: dict[str, str] | None = None, progress: Progress = lambda msg: None,
               score: bool = True) -> EngineRun:
    """One untraced engine run with exactly ``args`` (no hooks: what the user's server computes), then the
    reference's logprobs at every position the engine sampled. Reused while spec, arguments and engine
    environment are unchanged. ``score=False``: the engine run only (``scores`` None, unless the whole run is
    reused); the caller scores it later (:func:`keep_scores`), e.g. from a reference that ran beside another run."""
    directory = Path(directory)
    stamp = directory / "run.json"
    fingerprint = _run_fingerprint(spec, env, args)
    if not fresh and stamp.exists() and json.loads(stamp.read_text()).get("fingerprint") == fingerprint \
            and (directory / SCORES_FILE).exists():
        scores = ReferenceScores.load(directory)
        if scores is not None:
            return EngineRun(directory, EngineOutputs.load(directory), scores, reused=True)
        progress(f"scoring the {label} run again (its reference scores are from an older Ekka)")
        return EngineRun(directory, EngineOutputs.load(directory), score_run(spec, directory, env=env), reused=True)
    directory.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    spec_file = directory / "spec.in.json"
    spec_file.write_text(json.dumps(spec.to_json()))
    run_file = directory / "run.in.json"
    run_file.write_text(json.dumps({"args": args, "label": label, "trace": False, "changes": []}, default=str))
    progress(f"running {spec.target} untraced ({label})")
    _worker("target", spec_file, directory, env, extra=[str(run_file)], log=directory / "engine.log")
    if not score:
        return EngineRun(directory, EngineOutputs.load(directory), None)
    progress(f"scoring the {label} run against the reference (hf, teacher-forced)")
    _worker("score", spec_file, directory, env, log=directory / "score.log")
    stamp.write_text(json.dumps({"fingerprint": fingerprint}))
    return EngineRun(directory, EngineOutputs.load(directory), _stored_scores(directory))


def localise_compiled(spec: DiagnosisSpec, directory: Path, args: dict[str, Any], *, fresh: bool = False,
                      env: dict[str, str] | None = None, progress: Progress = lambda msg: None) -> GraphLocalisation:
    """One untraced engine run with exactly ``args`` (a compiled configuration) whose compiled graphs are localised
    in the engine process on its first step (:mod:`ekka_core.capture.vllm_graphs`); reused while spec, arguments and
    engine environment are unchanged. An engine that could not run, or wrote no localisation, gives a result that
    says so (``replayable`` False), never one that agrees."""
    directory = Path(directory)
    graphs, stamp = directory / "graphs", directory / "graph-run.json"
    # Unlike other runs this one reads the threshold (the localisation's limits): a threshold edit re-runs it.
    fingerprint = _run_fingerprint(spec, env, args) + f"|threshold={spec.threshold}"
    if not fresh and stamp.exists() and json.loads(stamp.read_text()).get("fingerprint") == fingerprint \
            and (graphs / RESULT_FILE).exists():
        return _graph_result(graphs / RESULT_FILE)
    stamp.unlink(missing_ok=True)
    shutil.rmtree(graphs, ignore_errors=True)
    # The spec's threshold travels to the engine: the limits there are max(threshold, the compile noise model's).
    graph_env = {**(env or {}), GRAPH_DIR_ENV: str(graphs), GRAPH_THRESHOLD_ENV: str(spec.threshold)}
    try:
        run_engine(spec, directory, args, label="in-graph localisation", fresh=True, env=graph_env,
                   progress=progress, score=False)
    except EkkaError as e:
        return GraphLocalisation.unreplayable(f"the engine run that localises its compiled graph failed: {e}",
                                              dtype=spec.declared_dtype())
    if not (graphs / RESULT_FILE).exists():
        return GraphLocalisation.unreplayable("the engine ran but wrote no graph localisation (Ekka's vLLM plugin "
                                              "was not loaded in the engine process)", dtype=spec.declared_dtype())
    stamp.write_text(json.dumps({"fingerprint": fingerprint}))
    return _graph_result(graphs / RESULT_FILE)


def _graph_result(path: Path) -> GraphLocalisation:
    return from_json(GraphLocalisation, json.loads(path.read_text()))


def keep_scores(spec: DiagnosisSpec, run: EngineRun, args: dict[str, Any], scores: ReferenceScores,
                env: dict[str, str] | None = None) -> None:
    """Store the scores of a run made with ``score=False`` and mark it complete (reused from now on)."""
    scores.save(run.directory)
    run.scores = scores
    (run.directory / "run.json").write_text(json.dumps({"fingerprint": _run_fingerprint(spec, env, args)}))


def _run_fingerprint(spec: DiagnosisSpec, env: dict[str, str] | None, args: dict[str, Any]) -> str:
    return spec.fingerprint(without=EXPLICIT_ARGS + TRACE_OPTIONS) + _env_fingerprint(env) + _args_fingerprint(args)


# What a run given its engine arguments does not read from the spec (the served configuration it was derived from
# is in the arguments), and what an untraced run does not read at all: an edit of either re-runs only what reads it.
EXPLICIT_ARGS = ("engine_args",)
TRACE_OPTIONS = ("trace_modules", "trace_store_dtype", "trace_positions", "target_trace")


def score_run(spec: DiagnosisSpec, directory: Path, *, env: dict[str, str] | None = None) -> ReferenceScores:
    """Score an engine run already on disk (``directory/outputs.json``) with a reference run of its own."""
    directory = Path(directory)
    spec_file = directory / "spec.in.json"
    spec_file.write_text(json.dumps(spec.to_json()))
    _worker("score", spec_file, directory, env, log=directory / "score.log")
    return _stored_scores(directory)


def _stored_scores(directory: Path) -> ReferenceScores:
    """The scores the score worker just wrote (it exited cleanly, so they are there, of this schema)."""
    scores = ReferenceScores.load(directory)
    if scores is None:
        raise InternalFailure(f"the score run wrote no {SCORES_SCHEMA} scores to {directory / SCORES_FILE}; "
                              f"log: {directory / 'score.log'}")
    return scores


# What a trace records beyond the spec's inputs; bump when the tracer starts recording something the later stages
# need, so traces captured before are captured again rather than reused without it (2: module weight owners; 3: the
# weights' order statistic).
RECORDED = 3


def _args_fingerprint(args: dict[str, Any] | None) -> str:
    if args is None:
        return ""
    return "|args=" + hashlib.sha256(json.dumps(args, sort_keys=True, default=str).encode()).hexdigest()[:16]


# Environment variables that change what the engine computes (the workers inherit the caller's environment).
# EKKA_TARGET_PYTHON: the target run's interpreter (another environment's vLLM; ekka_core.capture.interpreter).
ENGINE_ENV = ("EKKA_INJECT_BUG", "EKKA_TARGET_PYTHON")


def _env_fingerprint(env: dict[str, str] | None) -> str:
    effective = {**os.environ, **(env or {})}
    return "".join(f"|{k}={effective[k]}" for k in ENGINE_ENV if effective.get(k))


def _trace_fingerprint(path: str) -> str:
    index = Path(path) / INDEX if path else None
    return f"|trace={index.stat().st_mtime_ns}" if index is not None and index.exists() else ""


def _complete(path: Path) -> bool:
    try:
        return Trace(path).run.complete
    except EkkaError:
        return False


def _worker(role: str, spec_file: Path, out: Path, env: dict[str, str] | None, extra: list[str] = (),
            log: Path | None = None) -> None:
    full_env = {**os.environ, **(env or {})}
    python = sys.executable
    spec = json.loads(spec_file.read_text())
    if role == "target" and full_env.get("EKKA_TARGET_PYTHON"):
        from ekka_core.capture.interpreter import target_interpreter
        python, full_env = target_interpreter(full_env, spec.get("target", "vllm"))
    argv = [role, str(spec_file), str(out), *extra]
    hosted = None
    if python == sys.executable:       # a child of the warm host where it may be (run_host: imports paid once)
        run = json.loads(Path(extra[0]).read_text()) if role == "target" and extra else None
        hosted = run_hosted(role, argv, full_env, spec, run)
    if hosted is None:
        proc = subprocess.run([python, "-m", "ekka_core.capture.run_process", *argv], env=full_env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        hosted = (proc.returncode, proc.stdout, proc.stderr)
    returncode, stdout, stderr = hosted
    log = log or out.parent / f"{role}.log"
    log.write_text(stdout + stderr)
    if returncode == 0:
        return
    # The run's last stderr line is the error envelope when it failed cleanly.
    err = EkkaError.from_envelope_lines(stderr)
    if err is not None:
        raise err
    tail = "\n".join(stderr.strip().splitlines()[-5:])
    raise InternalFailure(f"the {role} run died (exit {returncode}); partial trace kept in {out}; log: {log}\n"
                          f"{tail}")


def load(result: CaptureResult) -> tuple[Trace, Trace, Trace]:
    return Trace(result.target), Trace(result.reference), Trace(result.reference_fp32)
