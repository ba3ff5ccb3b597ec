"""Stage 5 — analysis: error ratios, the first sustained divergence, where it was introduced, ranked suspects.

Entry point: :func:`analyse`.

**Error ratio** (Ekka paper): ``r = ‖X_T − Y_R‖ / max(‖X_R − Y_R‖, floor)``. X_T is the target in the low precision
under test, X_R the reference in that precision, Y_R the reference in fp32. r ≈ 1 when the target is as close to
fp32 as the reference's own low-precision run; a bug lifts it far above (paper: correct ≤ 1.5, buggy 3.1–1093).
The floor (:func:`~ekka_core.contracts.ranking.noise_floor`) keeps r finite where the low-precision reference
happens to equal fp32.

**Observations in time order.** Every compared pair gives an observation when its module completes (its output)
and, where its inputs are comparable, one when it starts (its input) — on one clock, the completion order of the
target's calls (a module's input is observed after the last call that completed before it started). Errors
propagate and grow, so the *maximum* is usually far downstream of the cause: change-point detection with ruptures'
PELT on log10(r) along that clock finds the first *sustained* shift (``l2`` cost = shifts in mean; penalty
``2·σ²·ln n`` with σ² the noise variance of log r from successive differences, floored so that a flat clean series
gives no breakpoint; ``min_size=1`` so the very last module, the logits, can be a segment of its own). The shift
must be sustained: the median ratio from there to the end stays above the threshold.

**Where it was introduced.** At the first sustained red observation:

* the *output* of a module whose input agrees (input ratio, or the observation just before it, ≤ threshold): that
  module's own computation introduced the error (``kind="module"``);
* the *input* of a module while the observation just before it — the output of the last module that completed —
  agrees: no traced module ran in between, so the code of the innermost module whose forward runs both calls did
  (``kind="glue"``): the suspect is that parent, with the source lines between the two call sites. This is also what
  catches a parent bug hidden by a scale-invariant child (an RMSNorm's output agrees although its input was scaled).

Other modules that introduce an error of their own later on (input agrees, output does not) follow as independent
sources, then the modules enclosing the top suspect.

**The reference's own rounding convention.** A checkpoint is trained with its reference's rounding (a constant or an
intermediate rounded to bf16 on purpose). An engine that keeps it in fp32 is *closer* to fp32 than the reference, so
r stays below 1. Where target and low-precision reference were fed the same tensor (input distance ≈ 0 in units of
the reference's rounding), a correct engine lands within a few ulps of X_R; one that departs from X_R by as much as
the reference's own rounding error (``same_dtype`` ≥ :data:`CONVENTION_DISTANCE`) *and* is clearly closer to fp32
(r ≤ :data:`CONVENTION_CLOSER`) follows another rounding convention (``kind="convention"``). These findings rank
below ratio-level divergences; the pipeline lets them decide the verdict only when nothing else explains an
output-level difference (see :mod:`ekka_core.pipeline`).

Every evidence sentence states what its numbers say: "agrees" only with a ratio at or below the threshold.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ekka_core.align import AlignedPair, AlignedPairs
from ekka_core.contracts.ranking import NON_FINITE_RATIO, PairResult, Ranking, Suspect, noise_floor

__all__ = ["NON_FINITE_RATIO", "PairResult", "Ranking", "Suspect", "analyse", "error_ratio", "GlueLocator",
           "CONVENTION_IDENTICAL", "CONVENTION_DISTANCE", "CONVENTION_CLOSER"]

# Reference-convention check. Inputs count as identical below this distance (in units of the reference's own
# rounding error) …
CONVENTION_IDENTICAL = 0.05
# … and an output departs from the reference's rounding when it is farther from X_R than correct engines ever are for
# that class — at least this far, and several times the class's clean maximum (the noise model, measured on clean
# runs of every zoo architecture by benchmarks/convention_noise.py and shipped as convention_noise.json) …
CONVENTION_DISTANCE = 0.25
CONVENTION_NOISE_FACTOR = 4.0
# … while being closer to fp32 than X_R is.
CONVENTION_CLOSER = 0.95
# A class with no clean measurement has no noise model: no claim is made about it.
NOISE_MODEL_FILE = Path(__file__).with_name("convention_noise.json")


def convention_noise() -> dict[str, Any]:
    """The shipped noise model: {"classes": {target class: largest clean distance}, "glue": …, "measured": …}."""
    try:
        return json.loads(NOISE_MODEL_FILE.read_text())
    except (OSError, ValueError):
        return {"classes": {}, "glue": None}


def departure_distance(noise: float | None) -> float | None:
    """How far from X_R an output must be to depart from the reference's rounding, given a class's clean noise."""
    return None if noise is None else max(CONVENTION_DISTANCE, CONVENTION_NOISE_FACTOR * noise)

# (innermost module running both calls, its child containing the first, its child containing the second) → the
# forward's file and the first and last source line between the two call sites; supplied by the pipeline (the
# static source index of the tree stage).
GlueLocator = Callable[[str, str, str], "tuple[str, int, int] | None"]


def error_ratio(x_t: torch.Tensor, x_r: torch.Tensor, y_r: torch.Tensor, dtype: str, dim: int | None = None
                ) -> torch.Tensor:
    """The error ratio, overall (``dim`` None) or along ``dim``."""
    if dim is None:
        num, den, ref = (x_t - y_r).norm(), (x_r - y_r).norm(), y_r.norm()
    else:
        num, den, ref = (x_t - y_r).norm(dim=dim), (x_r - y_r).norm(dim=dim), y_r.norm(dim=dim)
    return num / torch.maximum(den, (noise_floor(dtype) * ref).clamp_min(1e-30))


@dataclass
class _Obs:
    """One observation on the completion clock: a pair's output (at its completion) or input (at its start)."""

    pair: int
    port: str            # "output" | "input"
    time: float
    ratio: float
    same: float | None = None    # distance from the low-precision reference, in units of its own rounding error


def analyse(aligned: AlignedPairs, *, threshold: float, dtype: str, target_classes: dict[str, dict[str, Any]],
            prompt_lens: list[int], unchecked: list[dict[str, str]] | None = None,
            entered: dict[str, int | None] | None = None, locate: GlueLocator | None = None) -> Ranking:
    """``target_classes``: module path → {cls, file, line, forward_file, forward_line} for every module of the
    target (traced or not: a parent whose hooks never fire can still own the code between two children);
    ``entered``: module path → ``entered_after`` of its first call; ``locate``: see :data:`GlueLocator`."""
    results: list[PairResult] = []
    for ap in aligned:
        pr = _pair_result(ap, dtype, target_classes)
        pr.entered_after = (entered or {}).get(pr.component)
        results.append(pr)
    ranking = Ranking(verdict="consistent", threshold=threshold, dtype=dtype, pairs=results,
                      unchecked=list(unchecked or []), prompt_lens=prompt_lens)
    ranking.unchecked += [f.unchecked() for f in aligned.failures]
    ranking.notes.append("post-logits sampling (temperature, top-p, penalties) is outside per-module comparison")
    if not results:
        ranking.notes.append("no mapped pair could be compared")
        return ranking
    observations = _observations(results)
    ranking.conventions = _conventions(results, observations, target_classes, dtype, locate)
    log_r = np.log10(np.array([max(_finite(o.ratio), 1e-6) for o in observations]))
    start = _first_sustained_shift(log_r, math.log10(threshold))
    if start is None:
        above = sorted({results[o.pair].component for o in observations if o.ratio > threshold})
        if above:
            ranking.notes.append(f"isolated ratios above {threshold} that do not persist downstream "
                                 f"(treated as noise): {', '.join(above[:5])}")
        return ranking
    ranking.verdict = "divergent"
    ranking.suspects = _rank(results, observations, start, threshold, target_classes, prompt_lens, locate)
    first = observations[start]
    ranking.change_point = first.pair
    return ranking


def _finite(r: float) -> float:
    return r if math.isfinite(r) else NON_FINITE_RATIO


def _ratios(x_t: torch.Tensor, x_r: torch.Tensor, y_r: torch.Tensor, dtype: str
            ) -> tuple[float, list[float], float, float]:
    """Overall ratio, per-row ratios, ‖X_T − Y_R‖/‖Y_R‖ and the same-dtype distance ‖X_T − X_R‖ / ‖X_R − Y_R‖, from
    one pass over the differences (a Frobenius norm is the 2-norm of the row norms)."""
    rows = error_ratio(x_t, x_r, y_r, dtype, dim=1)
    overall = float(error_ratio(x_t, x_r, y_r, dtype))
    den = torch.maximum((x_r - y_r).norm(), (noise_floor(dtype) * y_r.norm()).clamp_min(1e-30))
    same = float((x_t - x_r).norm() / den)
    return overall, rows.tolist(), float((x_t - y_r).norm() / y_r.norm().clamp_min(1e-30)), same


def _pair_result(ap: AlignedPair, dtype: str, classes: dict[str, dict[str, Any]]) -> PairResult:
    overall, rows, rel, same = _ratios(ap.target, ap.reference, ap.reference_fp32, dtype)
    rin = rin_same = None
    if ap.inputs is not None:
        rin_overall, _, _, rin_same = _ratios(*ap.inputs, dtype)
        rin = _finite(rin_overall)
    per_tok = [_finite(v) for v in rows]
    return PairResult(component=ap.pair.component, cls=classes.get(ap.pair.component, {}).get("cls", "?"),
                      order=ap.order, reference_modules=list(ap.pair.reference.modules), rule=ap.pair.rule,
                      error_ratio=_finite(overall), input_ratio=rin, rel_error=rel,
                      token_ratios=[(s, p, float(v)) for (s, p), v in zip(ap.keys, per_tok)],
                      same_dtype=_finite(same), input_same_dtype=None if rin_same is None else _finite(rin_same))


def _observations(results: list[PairResult]) -> list[_Obs]:
    """Outputs at their completion, inputs when their module started (just after the call completed before it;
    an outer module's input before an inner one's at the same moment), sorted on that one clock."""
    obs = []
    for i, p in enumerate(results):
        obs.append(_Obs(i, "output", float(p.order), p.error_ratio, p.same_dtype))
        if p.input_ratio is not None and p.entered_after is not None:
            obs.append(_Obs(i, "input", p.entered_after + 0.5 + 1e-3 * p.component.count("."), p.input_ratio,
                            p.input_same_dtype))
    obs.sort(key=lambda o: (o.time, o.port != "input"))
    return obs


def _first_sustained_shift(log_r: np.ndarray, log_thr: float) -> int | None:
    log_r = np.nan_to_num(np.asarray(log_r, dtype=float), nan=math.log10(NON_FINITE_RATIO),
                          posinf=math.log10(NON_FINITE_RATIO), neginf=-6.0)
    n = len(log_r)
    if n == 0 or not (log_r > log_thr).any():
        return None
    import ruptures as rpt   # only when something exceeds the threshold: a clean run never pays for it

    diffs = np.diff(log_r)
    sigma = 1.4826 * np.median(np.abs(diffs - np.median(diffs))) / math.sqrt(2) if n > 2 else 0.0
    sigma = max(sigma, 0.1)     # 0.1 in log10 ≈ 25 % ratio jitter: what bf16 noise does to r
    pen = 2 * sigma ** 2 * math.log(max(n, 2))
    bkps = [0] + rpt.Pelt(model="l2", min_size=1, jump=1).fit(log_r.reshape(-1, 1)).predict(pen=pen)
    for a, b in zip(bkps, bkps[1:]):
        if np.median(log_r[a:b]) > log_thr:
            first = a + int(np.argmax(log_r[a:b] > log_thr))
            if np.median(log_r[first:]) > log_thr:
                return first
    # No segment stands out on its own, but a single sustained tail may still exist (short series).
    for i in range(n):
        if log_r[i] > log_thr and np.median(log_r[i:]) > log_thr:
            return i
    return None


# ---------------------------------------------------------------------------------------------------------------
def _introduced_here(results: list[PairResult], obs: list[_Obs], k: int, threshold: float) -> str | None:
    """Why observation ``k`` (red) is where the error was introduced, or None when something before it was red
    already: "module" (its module's input agrees), "glue" (a module's input departs while the output observed just
    before agrees)."""
    o = obs[k]
    if o.ratio <= threshold:
        return None
    p = results[o.pair]
    prev = _previous(results, obs, k)
    if o.port == "input":
        return "glue" if prev is None or prev.ratio <= threshold else None
    if p.input_ratio is not None:
        return "module" if p.input_ratio <= threshold else None
    return "module" if prev is None or prev.ratio <= threshold else None


def _previous(results: list[PairResult], obs: list[_Obs], k: int) -> _Obs | None:
    """The observation just before ``k`` that is not part of ``k``'s own module (a parent completes after its
    children, so a parent's output never stands in for its own input)."""
    name = results[obs[k].pair].component
    for j in range(k - 1, -1, -1):
        q = obs[j]
        other = results[q.pair].component
        if q.pair == obs[k].pair:
            continue
        if obs[k].port == "output" and other.startswith(name + "."):
            continue
        return q
    return None


def _rank(results: list[PairResult], obs: list[_Obs], start: int, threshold: float,
          classes: dict[str, dict[str, Any]], prompt_lens: list[int], locate: GlueLocator | None) -> list[Suspect]:
    """Rank 1: the first observation at or after the change point where the error is introduced (a module, or the
    glue code between two modules). Then: later modules that introduce an error of their own (independent second
    sources), in execution order. Then the modules enclosing rank 1, nearest first."""
    causes: list[tuple[int, str]] = []
    for k in range(start, len(obs)):
        why = _introduced_here(results, obs, k, threshold)
        if why is None:
            continue
        name = results[obs[k].pair].component
        # A module enclosing an already chosen suspect inherits its error; it is not a second source.
        if any(results[obs[j].pair].component.startswith(name + ".") for j, _ in causes):
            continue
        if why == "glue" and causes:
            continue                      # only the first glue finding is located; later ones are downstream
        causes.append((k, why))
        if len(causes) >= 3:
            break
    suspects: list[Suspect] = []
    if not causes:   # nothing introduces it on its own: name the change point, saying what its numbers say
        suspects.append(_module_suspect(results, obs, start, 1, threshold, classes, prompt_lens, "change point"))
    for k, why in causes:
        label = "change point" if not suspects else "introduces an error of its own"
        if why == "glue":
            glue = _glue_suspect(results, obs, k, len(suspects) + 1, threshold, classes, prompt_lens, locate)
            if glue is not None:
                suspects.append(glue)
                continue
        suspects.append(_module_suspect(results, obs, k, len(suspects) + 1, threshold, classes, prompt_lens, label))
    top = suspects[0]
    if top.kind == "module":
        _add_enclosing(suspects, results, classes, prompt_lens, threshold)
    return suspects


def _add_enclosing(suspects: list[Suspect], results: list[PairResult], classes: dict[str, dict[str, Any]],
                   prompt_lens: list[int], threshold: float) -> None:
    """The nearest module enclosing rank 1 (not a ModuleList entry): the bug may sit in its forward around it."""
    top = suspects[0].module
    by_name = {p.component: p for p in results}
    parts = top.split(".")
    named = {s.module for s in suspects}
    for k in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:k])
        if parent in named:
            return
        if re.fullmatch(r".*\.\d+", parent) is None and parent in classes and len(suspects) < 5:
            pr = by_name.get(parent)
            c = classes[parent]
            if pr is not None:
                onset, phase = _onset(pr, threshold, prompt_lens)
                ratio_words = (f"its output departs too (error ratio {pr.error_ratio:.1f})" if pr.error_ratio > threshold
                               else f"its output agrees with the reference (ratio {pr.error_ratio:.2f})")
                s = Suspect(len(suspects) + 1, parent, pr.cls, c.get("file"), c.get("line"), c.get("forward_file"),
                            c.get("forward_line"), pr.reference_modules, pr.error_ratio, pr.input_ratio, onset, phase,
                            f"encloses {top}; its own forward code runs around it; {ratio_words}")
            else:
                s = Suspect(len(suspects) + 1, parent, c["cls"], c.get("file"), c.get("line"), c.get("forward_file"),
                            c.get("forward_line"), [], float("nan"), None, None, None,
                            f"encloses {top}; its own forward code runs around it (not compared itself)")
            suspects.append(s)
            return


def _module_suspect(results: list[PairResult], obs: list[_Obs], k: int, rank: int, threshold: float,
                    classes: dict[str, dict[str, Any]], prompt_lens: list[int], why: str) -> Suspect:
    p = results[obs[k].pair]
    c = classes.get(p.component, {})
    onset, phase = _onset(p, threshold, prompt_lens)
    prev = _previous(results, obs, k)
    if p.input_ratio is not None:
        inp = (f"its input agrees with the reference (input ratio {p.input_ratio:.2f})" if p.input_ratio <= threshold
               else f"its input already departs from the reference (input ratio {p.input_ratio:.2f}): the error "
                    f"arose before it, where no compared module shows it")
    elif prev is not None:
        before = f"{results[prev.pair].component} ({prev.port})"
        inp = (f"the observation before it, {before}, agrees with the reference (ratio {prev.ratio:.2f})"
               if prev.ratio <= threshold else
               f"the observation before it, {before}, already departs (ratio {prev.ratio:.2f})")
    else:
        inp = "nothing is compared before it"
    where = f" from token {onset} ({phase})" if onset is not None else ""
    ratio = p.error_ratio if obs[k].port == "output" else (p.input_ratio or p.error_ratio)
    evidence = (f"{why}: output error ratio {ratio:.1f} (threshold {threshold}) while {inp}; diverges{where}; "
                f"compared with {', '.join(p.reference_modules) or '—'} via rule '{p.rule}'")
    return Suspect(rank, p.component, p.cls, c.get("file"), c.get("line"), c.get("forward_file"),
                   c.get("forward_line"), p.reference_modules, p.error_ratio, p.input_ratio, onset, phase, evidence,
                   same_dtype=p.same_dtype)


def _ancestor(a: str, b: str) -> str:
    """The innermost module path enclosing both ``a`` and ``b`` (``""``: the root)."""
    pa, pb = a.split(".") if a else [], b.split(".") if b else []
    common = []
    for x, y in zip(pa, pb):
        if x != y:
            break
        common.append(x)
    return ".".join(common)


CONTAINERS = ("ModuleList", "ModuleDict")


def _real_module(path: str, classes: dict[str, dict[str, Any]]) -> str:
    """``path`` or its nearest enclosing module that has a forward of its own (a ModuleList has none)."""
    while path and (path not in classes or classes[path].get("cls") in CONTAINERS):
        path = path.rsplit(".", 1)[0] if "." in path else ""
    return path


def _glue_suspect(results: list[PairResult], obs: list[_Obs], k: int, rank: int, threshold: float,
                  classes: dict[str, dict[str, Any]], prompt_lens: list[int], locate: GlueLocator | None
                  ) -> Suspect | None:
    o = obs[k]
    p = results[o.pair]
    prev = _previous(results, obs, k)
    before = results[prev.pair].component if prev is not None else ""
    # What was executing when the first call completed and the second started: the parents of each.
    after_prev = before if prev is not None and prev.port == "input" else before.rsplit(".", 1)[0] if "." in before \
        else ""
    at_next = p.component.rsplit(".", 1)[0] if "." in p.component else ""
    owner = _real_module(_ancestor(after_prev, at_next) if prev is not None else at_next, classes)
    c = classes.get(owner, {})
    if not c:
        return None
    child_from = _child_of(owner, before) if prev is not None else ""
    child_to = _child_of(owner, p.component)
    located = locate(owner, child_from, child_to) if locate else None
    onset, phase = _onset(p, threshold, prompt_lens)
    first_words = (f"the output of {before} agrees with the reference (ratio {prev.ratio:.2f})"
                   if prev is not None and prev.port == "output" else
                   f"the input of {before} agrees with the reference (ratio {prev.ratio:.2f})" if prev is not None
                   else "nothing before it is compared")
    lines = ""
    if located:
        file, a, b = located
        lines = f" — {file.rsplit('/', 1)[-1]}:{a}–{b}"
    evidence = (f"code between two modules: {first_words}, but the input of {p.component} already departs "
                f"(input ratio {o.ratio:.1f}, threshold {threshold}); no traced module runs in between, so the "
                f"forward of {owner or 'the model'} ({c.get('cls', '?')}) introduces it between "
                f"{child_from or 'its start'} and {child_to}{lines}")
    s = Suspect(rank, owner, c.get("cls", "?"), c.get("file"), c.get("line"), c.get("forward_file"),
                c.get("forward_line"), [], o.ratio, prev.ratio if prev is not None else None, onset, phase, evidence,
                kind="glue", between=[before, p.component], same_dtype=p.input_same_dtype)
    if located:
        s.forward_file, s.lines = located[0], [located[1], located[2]]
    return s


def _child_of(owner: str, path: str) -> str:
    """The child of ``owner`` that contains ``path`` (its attribute path, e.g. ``layers.0`` → ``layers``)."""
    rest = path[len(owner) + 1:] if owner else path
    return rest.split(".", 1)[0] if rest else ""


def _onset(p: PairResult, threshold: float, prompt_lens: list[int]) -> tuple[int | None, str | None]:
    """First token position where this pair's ratio rises above the threshold and stays there (per sequence)."""
    best: int | None = None
    best_seq = 0
    by_seq: dict[int, list[tuple[int, float]]] = {}
    for s, pos, r in p.token_ratios:
        by_seq.setdefault(s, []).append((pos, r))
    for s, rows in by_seq.items():
        rows.sort()
        vals = np.array([r for _, r in rows])
        for j, (pos, r) in enumerate(rows):
            if r > threshold and np.median(vals[j:]) > threshold:
                if best is None or pos < best:
                    best, best_seq = pos, s
                break
    if best is None:
        return None, None
    prompt_len = prompt_lens[best_seq] if best_seq < len(prompt_lens) else best + 1
    return best, "prefill" if best < prompt_len else f"decode:{best - prompt_len + 1}"


# ---------------------------------------------------------------------------------------------------------------
def _conventions(results: list[PairResult], obs: list[_Obs], classes: dict[str, dict[str, Any]], dtype: str,
                 locate: GlueLocator | None) -> list[Suspect]:
    """Where the target was fed the same tensor as the low-precision reference and yet departs from it by as much
    as the reference's own rounding, towards fp32 (see the module docstring): a module's computation (its input, or
    the observation just before it, identical) or the code a parent runs between two children (the output just
    before identical, the next input departing). Only in a low precision: in fp32 the reference's two runs are one.
    At most one finding per module, in execution order."""
    if dtype == "float32":
        return []
    model = convention_noise()
    found: list[Suspect] = []
    seen: set[str] = set()
    for k, o in enumerate(obs):
        p = results[o.pair]
        noise = model.get("glue") if o.port == "input" else model.get("classes", {}).get(p.cls)
        needed = departure_distance(noise)
        if needed is None or o.same is None or o.same < needed or o.ratio > CONVENTION_CLOSER:
            continue
        if o.port == "output" and p.input_same_dtype is not None:
            fed, fed_words = p.input_same_dtype, "fed the same input as"
        else:
            prev = _previous(results, obs, k)
            if prev is None or prev.same is None:
                continue
            fed = prev.same
            fed_words = (f"right after {results[prev.pair].component}'s {prev.port}, which is identical to"
                         if o.port == "input" else "its input identical to")
        if fed > CONVENTION_IDENTICAL:
            continue
        where = _glue_suspect(results, obs, k, 0, float("inf"), classes, [], locate) if o.port == "input" else None
        module = where.module if where is not None else p.component
        if module in seen:
            continue
        seen.add(module)
        c = classes.get(module, {})
        what = (f"the input of {p.component}" if o.port == "input" else "its output")
        kind_words = "code between two modules" if o.port == "input" else f"a {p.cls}"
        evidence = (f"departs from the reference's {dtype} rounding: {fed_words} the reference's {dtype} run "
                    f"(distance {fed:.2f}), {what} differs from that run by {o.same:.2f}× the reference's own "
                    f"rounding error (correct engines: at most {noise:.2f} for {kind_words}), and is closer to fp32 "
                    f"than the reference (error ratio {o.ratio:.2f}): it keeps a precision the checkpoint's reference "
                    f"rounds away (a constant or intermediate kept in fp32)")
        s = Suspect(0, module, c.get("cls", p.cls), c.get("file"), c.get("line"), c.get("forward_file"),
                    c.get("forward_line"), p.reference_modules, o.ratio, p.input_ratio, None, None, evidence,
                    kind="convention", same_dtype=o.same, noise=noise)
        if where is not None:
            s.between, s.lines, s.forward_file = where.between, where.lines, where.forward_file or s.forward_file
            s.evidence += f"; in {module}'s forward between {where.between[0] or 'its start'} and {where.between[1]}"
            if where.lines:
                s.evidence += f" ({(s.forward_file or '').rsplit('/', 1)[-1]}:{where.lines[0]}–{where.lines[1]})"
        found.append(s)
        if len(found) >= 3:
            break
    return found
