"""The capture stage's runs: :func:`capture` (the traced comparison: the target traced, then the reference
teacher-forced on its tokens, in the same low precision and in fp32), :func:`run_engine` (one untraced engine run,
scored against the reference: :func:`score_run`) and :func:`load`. Each run happens in its own process
(``python -m ekka_core.capture.run_process``); runs are reused while their inputs are unchanged."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ekka_core.capture.external import external_target
from ekka_core.capture.run_host import run_hosted
from ekka_core.capture.trace import INDEX, Trace
from ekka_core.contracts.errors import EkkaError, InternalFailure
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


@dataclass
class EngineRun:
    """One engine configuration's run: what the engine produced and the reference's logprobs on the same tokens."""

    directory: Path
    outputs: EngineOutputs
    scores: ReferenceScores
    reused: bool = False


def capture(spec: DiagnosisSpec, out_dir: Path, *, args: dict[str, Any] | None = None,
            changes: list[dict[str, Any]] | None = None, name: str = "", fresh: bool = False,
            progress: Progress = lambda msg: None, env: dict[str, str] | None = None) -> CaptureResult:
    """Trace the target with engine arguments ``args`` (``changes``: how they differ from the served configuration,
    recorded in the trace) and the reference teacher-forced on its tokens. ``name`` puts the three traces under
    ``traces/<name>/`` (the first traced configuration uses ``traces/`` itself)."""
    out_dir = Path(out_dir)
    traces = out_dir / "traces" / name if name else out_dir / "traces"
    result = CaptureResult(traces / "target", traces / "reference", traces / "reference-fp32")
    stamp = traces / "spec.json"
    if spec.target_trace:
        result.target = Path(spec.target_trace)
    fingerprint = (spec.fingerprint() + _env_fingerprint(env) + _trace_fingerprint(spec.target_trace)
                   + _args_fingerprint(args) + f"|recorded={RECORDED}")
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
        run_file.write_text(json.dumps({"args": args, "label": name or "traced", "trace": True,
                                        "changes": changes or []}, default=str))
        _worker("target", spec_file, result.target, env, extra=[str(run_file)])
    dtype = Trace(result.target).run.dtype.removeprefix("torch.")
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


def run_engine(spec: DiagnosisSpec, directory: Path, args: dict[str, Any], *, label: str, fresh: bool = False,
               env: dict[str, str] | None = None, progress: Progress = lambda msg: None) -> EngineRun:
    """One untraced engine run with exactly ``args`` (no hooks: what the user's server computes), then the
    reference's logprobs at every position the engine sampled. Reused while spec, arguments and engine
    environment are unchanged."""
    directory = Path(directory)
    stamp = directory / "run.json"
    fingerprint = spec.fingerprint() + _env_fingerprint(env) + _args_fingerprint(args)
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
    progress(f"scoring the {label} run against the reference (hf, teacher-forced)")
    _worker("score", spec_file, directory, env, log=directory / "score.log")
    stamp.write_text(json.dumps({"fingerprint": fingerprint}))
    return EngineRun(directory, EngineOutputs.load(directory), _stored_scores(directory))


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
