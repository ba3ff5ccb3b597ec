"""Target traces captured outside Ekka (``EKKA_TRACE_DIR`` under ``vllm serve``, a user's own script): a spec that
diagnoses one (:func:`spec_for_trace`), and the trace checked to be closed and to describe the diagnosis
(:func:`external_target`); a tensor-parallel trace's ranks are merged once."""

from __future__ import annotations

from pathlib import Path

from ekka_core.capture.trace import INDEX, Trace
from ekka_core.contracts.errors import BadInput
from ekka_core.contracts.spec import DiagnosisSpec


def spec_for_trace(trace_dir: Path, *, model: str | None = None, **fields: object) -> DiagnosisSpec:
    """A spec that diagnoses a target trace captured outside Ekka (EKKA_TRACE_DIR under ``vllm serve`` or a user's
    own script): model and dtype from the trace unless given; its requests are the prompt ids the engine fed (what
    the client sent is not in the trace, so the input pre-flight has only those ids to check)."""
    trace = _read_external(Path(trace_dir))
    run = trace.run
    ids = [list(t[:n]) for t, n in zip(run.token_ids, run.prompt_lens)]
    return DiagnosisSpec(model=model or run.model, prompt_token_ids=ids, target=run.framework,
                         dtype=run.dtype.removeprefix("torch."), max_new_tokens=max(1, max(
                             (len(g) for g in run.generated_ids), default=1)),
                         target_trace=str(trace_dir), **fields)  # type: ignore[arg-type]


def external_target(spec: DiagnosisSpec) -> Path:
    """The external target trace, checked to be closed and to describe this diagnosis (same model dtype)."""
    path = Path(spec.target_trace)
    run = _read_external(path).run
    if spec.dtype != "auto" and run.dtype.removeprefix("torch.") != spec.dtype:
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
