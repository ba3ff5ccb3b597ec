"""The bisection: diagnose releases until the last good and first bad are adjacent (and, when the newest is
consistent again, the last bad and first good: the fix), skipping those that cannot be diagnosed, then diff what
changed for the first bad release's rank-1 suspect."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ekka_core.bisect.candidates import Candidate
from ekka_core.contracts.errors import BadInput, EkkaError, InternalFailure
from ekka_core.contracts.report import BisectFix, BisectSection, BisectSuspect, BisectTried, Report
from ekka_core.contracts.spec import DiagnosisSpec

SCHEMA = BisectSection.schema
# Verdicts that say nothing about good or bad: the engine did not run ("error") or the diagnosis could not observe
# what a verdict needs ("inconclusive"). Such a release is skipped, as `git bisect skip` does.
UNTESTABLE = ("error", "inconclusive")
Progress = Callable[[str], None]


Tried = BisectTried          # one release diagnosed (the report's ``bisect.tried[]``)


@dataclass
class BisectResult:
    report: Report
    paths: dict[str, Path]
    tried: list[Tried] = field(default_factory=list)


def bisect(spec: DiagnosisSpec, out_dir: Path, candidates: list[Candidate], *, env_root: Path | None = None,
           package: str | None = None, fresh: bool = False, progress: Progress = lambda m: None,
           env: dict[str, str] | None = None, check_index: bool = True, bad: str | None = None,
           cache_dir: Path | None = None) -> BisectResult:
    """Find the last good and first bad of ``candidates`` (ordered oldest first) and what changed between them.

    ``bad``: the release where the problem shows (default the newest); releases after it, when the newest is
    consistent again, are bisected for the fix too (``bisect.fix``). Each release's diagnosis is kept under
    ``cache_dir`` (default ``ENV_ROOT/diagnoses/<spec fingerprint>/``) and reused by any later bisection of the same
    diagnosis."""
    from ekka_core.bisect import envs as envs_mod
    from ekka_core.capture.interpreter import TARGET_PYTHON_ENV, probe

    spec.validate()
    out_dir = Path(out_dir)
    package = package or envs_mod.default_package()
    root = Path(env_root or envs_mod.default_root())
    t_start = time.perf_counter()
    # Everything that can be checked before anything runs: interpreters given, releases on the index.
    for c in candidates:
        if c.python:
            info = probe(c.python, spec.target)
            c.label = c.label or (info[spec.target]["version"] or Path(c.python).parent.parent.name)
    labels = [c.label for c in candidates]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise BadInput(f"two entries are both labelled {dup[0]}", fix="label them: --env LABEL=PATH")
    if check_index:
        missing = [c for c in candidates if c.release and envs_mod.load_env(root, package, c.release) is None]
        if missing:
            check_on_index([c.release for c in missing], package, root, progress)  # type: ignore[misc]

    cache = Path(cache_dir) if cache_dir else root / "diagnoses" / _sha(spec.fingerprint() + repr(sorted(
        (env or {}).items())))[:16]
    tried: dict[int, Tried] = {}
    reports: dict[int, Report] = {}
    pythons: dict[int, str] = {}

    def test(i: int) -> bool | None:
        """True: consistent · False: divergent / inputs-differ · None: the release could not be diagnosed, or its
        diagnosis was inconclusive (skipped, as `git bisect skip`)."""
        if i in tried:
            return None if tried[i].verdict in UNTESTABLE else tried[i].verdict == "consistent"
        c = candidates[i]
        t0 = time.perf_counter()
        env_s, env_reused = 0.0, True
        if c.python:
            python = c.python
        else:
            built = envs_mod.ensure_env(c.release, root=root, package=package, progress=progress)  # type: ignore
            python, env_reused = built.python, built.reused
            env_s = 0.0 if built.reused else round(time.perf_counter() - t0, 1)
        pythons[i] = python
        progress(f"[{c.label}] diagnosing with {python}")
        t1 = time.perf_counter()
        from ekka_core.pipeline import diagnose
        where = cache / f"{_safe(c.label)}-{_sha(python)[:8]}"
        failed = where / "bisect-error.json"        # a release that could not be diagnosed is not retried
        if failed.exists() and not fresh:
            tried[i] = Tried(label=c.label, verdict="error", seconds=0.0, env_seconds=env_s, env_reused=env_reused,
                             traces_reused=True, python=python, error=json.loads(failed.read_text())["error"])
            progress(f"[{c.label}] could not be diagnosed before (--fresh to retry): {tried[i].error}")
            return None
        try:
            result = diagnose(spec, where, fresh=fresh,
                              env={**(env or {}), TARGET_PYTHON_ENV: python},
                              progress=lambda stage, msg: progress(f"[{c.label}] {stage}: {msg}"))
        except InternalFailure as e:
            # The engine does not start or crashes at this release: untestable, skipped (as `git bisect skip`).
            tried[i] = Tried(label=c.label, verdict="error", seconds=round(time.perf_counter() - t1, 1),
                             env_seconds=env_s, env_reused=env_reused, python=python,
                             top_suspect=None, error=str(e).splitlines()[0][:300])
            progress(f"[{c.label}] could not be diagnosed, skipped: {str(e).splitlines()[0][:200]}")
            where.mkdir(parents=True, exist_ok=True)
            failed.write_text(json.dumps({"error": tried[i].error}))
            return None
        except EkkaError as e:
            e.message = f"release {c.label}: {e.message}"
            raise
        report = result.report
        reports[i] = report
        top = report.top.target.module if report.top else None
        engine = report.meta.target
        tried[i] = Tried(label=c.label, verdict=report.verdict, seconds=round(time.perf_counter() - t1, 1),
                         env_seconds=env_s, env_reused=env_reused, traces_reused=report.meta.reused_traces,
                         python=python, engine_version=engine.version if engine else "",
                         top_suspect=top, report=str(result.paths["json"]))
        progress(f"[{c.label}] {report.verdict}" + (f" (rank 1: {top})" if top else ""))
        if report.verdict == "inconclusive":
            progress(f"[{c.label}] inconclusive, skipped: {'; '.join(report.missing)}")
            return None
        return report.verdict == "consistent"

    bad_i = len(candidates) - 1 if bad is None else _index_of(candidates, bad)
    order: list[int] = []

    def run(i: int) -> bool | None:
        good = test(i)
        if i not in order:
            order.append(i)
        return good

    section = BisectSection(package=None if all(c.python for c in candidates) else package, candidates=labels,
                            bad_given=candidates[bad_i].label if bad is not None else None)
    # Regression: between the oldest that can be diagnosed (must be good) and the release seen bad (must be bad).
    oldest = 0
    while oldest < bad_i and run(oldest) is None:
        oldest += 1
    if bad_i != oldest and run(bad_i) is None:
        raise InternalFailure(f"release {labels[bad_i]} (the one seen bad) could not be diagnosed: "
                              f"{tried[bad_i].error or 'inconclusive'}")
    if not run(oldest):
        if tried[oldest].verdict in UNTESTABLE:
            raise InternalFailure(f"no release up to {labels[bad_i]} could be diagnosed: {tried[oldest].error}")
        outcome, shown = "bad-from-start", oldest
        section.first_bad = labels[oldest]
        section.note = (f"already {reports[oldest].verdict} at the oldest release diagnosed "
                        f"({labels[oldest]}): add older releases to find where it broke")
    elif bad_i == oldest or run(bad_i):
        outcome, shown = "no-regression", bad_i
        section.last_good = labels[bad_i]
        section.note = (f"{labels[bad_i]} is consistent too: nothing to bisect"
                        + ("" if bad is not None else " (if the problem shows in a release in between, name it "
                                                      "with --bad RELEASE)"))
    else:
        lo, hi = _search(run, oldest, bad_i, good_at_lo=True)
        outcome, shown = "regression-found", hi
        section.last_good, section.first_bad = labels[lo], labels[hi]
        if hi - lo > 1:
            section.note = (f"the releases between {labels[lo]} and {labels[hi]} could not be diagnosed: the "
                            "change is in one of them or in " + labels[hi])
        _diff_into(section, reports[hi], pythons[lo], pythons[hi], labels[lo], labels[hi], progress)
    skipped = [labels[i] for i in order if tried[i].verdict in UNTESTABLE]
    if skipped:
        section.note = _joined(section.note, f"could not be diagnosed (engine failed, or inconclusive), skipped: "
                                              f"{', '.join(skipped)}")
    # Fix: releases after the one seen bad, when the newest is good again.
    if outcome != "no-regression" and bad_i < len(candidates) - 1 and run(len(candidates) - 1):
        lo, hi = _search(run, bad_i, len(candidates) - 1, good_at_lo=False)
        fix = BisectFix(last_bad=labels[lo], first_good=labels[hi])
        _diff_into(fix, reports[lo], pythons[hi], pythons[lo], labels[hi], labels[lo], progress, reverse=True)
        section.fix = fix

    section.outcome = outcome
    section.tried = [tried[i] for i in order]
    section.seconds = round(time.perf_counter() - t_start, 1)
    report = dataclasses.replace(reports[shown], bisect=section)
    from ekka_core.report import write_report
    paths = write_report(report, out_dir)
    return BisectResult(report, paths, [tried[i] for i in order])


def _index_of(candidates: list[Candidate], label: str) -> int:
    for i, c in enumerate(candidates):
        if c.label == label or c.release == label:
            return i
    raise BadInput(f"--bad {label} is not one of the releases given", fix="name one of: "
                   + ", ".join(c.label for c in candidates))


def _search(run: Callable[[int], bool | None], lo: int, hi: int, *, good_at_lo: bool) -> tuple[int, int]:
    """Bisect ``[lo, hi]`` whose ends differ (good at ``lo`` for a regression, bad at ``lo`` for a fix) down to
    two adjacent releases. A release that cannot be diagnosed (``run`` → None) is skipped: the nearest other one
    to the middle is tried instead; if every release between is skipped, the window stays wider than one step."""
    skipped: set[int] = set()
    while True:
        inside = [i for i in range(lo + 1, hi) if i not in skipped]
        if not inside:
            return lo, hi
        mid = (lo + hi) // 2
        pick = min(inside, key=lambda i: (abs(i - mid), i))
        got = run(pick)
        if got is None:
            skipped.add(pick)
        elif got == good_at_lo:
            lo = pick
        else:
            hi = pick


def _joined(*notes: str) -> str:
    return " ".join(n for n in notes if n)


def _diff_into(into: BisectSection | BisectFix, bad_report: Report, good_python: str, bad_python: str, good: str,
               bad: str, progress: Progress, *, reverse: bool = False) -> None:
    """What changed for the bad release's rank-1 suspect, set on ``into`` (``reverse``: the good release is the
    newer one)."""
    from ekka_core.bisect.changes import what_changed

    top = bad_report.top
    if top is None:
        into.note = _joined(into.note, f"{bad} is {bad_report.verdict} with no ranked suspect: nothing to diff")
        return
    t = top.target
    older, newer = (bad, good) if reverse else (good, bad)
    progress(f"diffing {t.cls} and the engine functions it calls: {older} → {newer}")
    try:
        found = what_changed(t, bad_python if reverse else good_python, good_python if reverse else bad_python)
    except (OSError, subprocess.CalledProcessError, ValueError) as e:
        raise InternalFailure(f"could not diff the suspect's sources between the two releases: {e}") from e
    into.suspect = BisectSuspect(module=t.module, cls=t.cls, file=t.file, line=t.line)
    into.changes, into.compared, into.custom_ops = found.changes, found.compared, found.custom_ops
    into.note = _joined(into.note, found.note)


def _sha(text: str) -> str:
    import hashlib
    return hashlib.sha256(text.encode()).hexdigest()


def _safe(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-+" else "_" for ch in label) or "release"


def check_on_index(releases: list[str], package: str, root: Path, progress: Progress = lambda m: None) -> None:
    """Bad input naming the first release the package index does not have (metadata only; nothing installed)."""
    from ekka_core.bisect.envs import _reason, find_uv

    uv = find_uv(root, progress)
    env = {**os.environ, "UV_CACHE_DIR": str(root / "cache" / "uv"), "UV_NO_PROGRESS": "1"}
    for r in releases:
        proc = subprocess.run([uv, "pip", "compile", "--no-deps", "--quiet", "--no-header", "-"],
                              input=f"{package}=={r}\n", capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise BadInput(f"--releases: {package} {r} cannot be installed from the package index: "
                           f"{_reason(proc.stderr)}",
                           fix=f"list releases that exist (pip index versions {package}); nothing was built")
