"""Stage 1 — capture: three traces on the same token sequence.

Entry point: :func:`capture`. The target generates greedily (X_T); the reference is then teacher-forced on the
target's prompt + generated tokens in the same low precision (X_R) and in fp32 (Y_R).

Each run happens in its own worker process (``python -m ekka_core.capture.worker``): an engine crash cannot take
the caller down, what it captured so far is kept on disk marked incomplete, and vLLM's process-wide settings
(threads, environment) never leak into the reference run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ekka_core.capture.trace import INDEX, Trace
from ekka_core.contracts.errors import BadInput, EkkaError, InternalFailure
from ekka_core.contracts.spec import DiagnosisSpec

Progress = Callable[[str], None]


@dataclass
class CaptureResult:
    target: Path
    reference: Path
    reference_fp32: Path
    reused: bool = False


def capture(spec: DiagnosisSpec, out_dir: Path, *, fresh: bool = False,
            progress: Progress = lambda msg: None, env: dict[str, str] | None = None) -> CaptureResult:
    out_dir = Path(out_dir)
    traces = out_dir / "traces"
    result = CaptureResult(traces / "target", traces / "reference", traces / "reference-fp32")
    stamp = traces / "spec.json"
    if spec.target_trace:
        result.target = Path(spec.target_trace)
    fingerprint = spec.fingerprint() + _env_fingerprint(env) + _trace_fingerprint(spec.target_trace)
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
        _worker("target", spec_file, result.target, env)
    progress(f"tracing the reference (hf, {spec.dtype} and float32, teacher-forced)")
    _worker("reference", spec_file, result.reference, env, extra=[str(result.target), str(result.reference_fp32)])
    stamp.write_text(json.dumps({"fingerprint": fingerprint, "spec": spec.to_json()}))
    return result


# Environment variables that change what the engine computes (the workers inherit the caller's environment).
ENGINE_ENV = ("EKKA_INJECT_BUG",)


def _env_fingerprint(env: dict[str, str] | None) -> str:
    effective = {**os.environ, **(env or {})}
    return "".join(f"|{k}={effective[k]}" for k in ENGINE_ENV if effective.get(k))


def _trace_fingerprint(path: str) -> str:
    index = Path(path) / INDEX if path else None
    return f"|trace={index.stat().st_mtime_ns}" if index is not None and index.exists() else ""


def spec_for_trace(trace_dir: Path, *, model: str | None = None, **fields: object) -> DiagnosisSpec:
    """A spec that diagnoses a target trace captured outside Ekka (EKKA_TRACE_DIR under ``vllm serve`` or a user's
    own script): model and dtype from the trace unless given; its requests stand in for the prompts."""
    trace = _read_external(Path(trace_dir))
    run = trace.run
    prompts = run.prompts or [f"(request {i}: {n} prompt tokens)" for i, n in enumerate(run.prompt_lens)]
    return DiagnosisSpec(model=model or run.model, prompts=prompts, target=run.framework,
                         dtype=run.dtype.removeprefix("torch."), max_new_tokens=max(1, max(
                             (len(g) for g in run.generated_ids), default=1)),
                         target_trace=str(trace_dir), **fields)  # type: ignore[arg-type]


def external_target(spec: DiagnosisSpec) -> Path:
    """The external target trace, checked to be closed and to describe this diagnosis (same model dtype)."""
    path = Path(spec.target_trace)
    run = _read_external(path).run
    if run.dtype.removeprefix("torch.") != spec.dtype:
        raise BadInput(f"the target trace {path} ran in {run.dtype}, the diagnosis asks for {spec.dtype}",
                       fix=f"pass --dtype {run.dtype.removeprefix('torch.')} (the reference must use the target's)")
    return path


def _read_external(path: Path) -> Trace:
    ranks = sorted(path.glob("rank-*/"), key=lambda d: int(d.name.removeprefix("rank-")))
    if ranks and not (path / INDEX).exists():        # tensor parallel: one trace per rank, merged once, kept
        from ekka_core.capture.unshard import unshard
        for r in ranks:
            _read_closed(r)
        unshard(ranks, path)
    return _read_closed(path)


def _read_closed(path: Path) -> Trace:
    trace = Trace(path)
    run = trace.run
    if not run.complete:
        raise BadInput(f"the target trace {path} is not usable: {run.failure or 'it was cut short'}",
                       fix="capture it again (Ekka's plugin closes an EKKA_TRACE_DIR trace after every engine step, "
                           "so this one stopped inside its first step or failed as said); the trace is kept")
    if not run.token_ids:
        raise BadInput(f"the target trace {path} does not say which tokens it ran",
                       fix="capture it with EKKA_TRACE_DIR and Ekka's vLLM plugin installed, or with ekka diagnose")
    return trace


def _complete(path: Path) -> bool:
    try:
        return Trace(path).run.complete
    except EkkaError:
        return False


def _worker(role: str, spec_file: Path, out: Path, env: dict[str, str] | None, extra: list[str] = ()) -> None:
    cmd = [sys.executable, "-m", "ekka_core.capture.worker", role, str(spec_file), str(out), *extra]
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = out.parent / f"{role}.log"
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode == 0:
        return
    # The worker's last stderr line is a JSON error record when it failed cleanly.
    for line in reversed(proc.stderr.strip().splitlines()):
        if line.startswith('{"ekka_error"'):
            err = json.loads(line)["ekka_error"]
            cls = BadInput if err["exit_code"] == 2 else InternalFailure
            raise cls(err["message"], fix=err.get("fix"))
    tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
    raise InternalFailure(f"the {role} run died (exit {proc.returncode}); partial trace kept in {out}; log: {log}\n"
                          f"{tail}")


def load(result: CaptureResult) -> tuple[Trace, Trace, Trace]:
    return Trace(result.target), Trace(result.reference), Trace(result.reference_fp32)


__all__ = ["capture", "CaptureResult", "load", "INDEX"]
