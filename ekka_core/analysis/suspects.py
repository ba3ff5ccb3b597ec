"""Ranked suspects: the module, or the code between two modules, that introduces the error, and what encloses it.

**Where it was introduced.** At the first sustained red observation:

* the *output* of a module whose input agrees (input ratio, or the observation just before it, ≤ threshold): that
  module's own computation introduced the error (``kind="module"``);
* the *input* of a module while the observation just before it — the output of the last module that completed —
  agrees: no traced module ran in between, so the code of the innermost module whose forward runs both calls did
  (``kind="glue"``): the suspect is that parent, with the source lines between the two call sites. This is also what
  catches a parent bug hidden by a scale-invariant child (an RMSNorm's output agrees although its input was scaled).

Other modules that introduce an error of their own later on (input agrees, output does not) follow as independent
sources, then the modules enclosing the top suspect.

Every evidence sentence states what its numbers say: "agrees" only with a ratio at or below the threshold.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

from ekka_core.analysis.observations import _introduced_here, _Obs, _previous
from ekka_core.contracts.ranking import PairResult, Suspect

# (innermost module running both calls, its child containing the first, its child containing the second) → the
# forward's file and the first and last source line between the two call sites; supplied by the pipeline (the
# static source index of the tree stage).
GlueLocator = Callable[[str, str, str], "tuple[str, int, int] | None"]


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
