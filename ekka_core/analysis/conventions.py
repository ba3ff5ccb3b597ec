"""Departures from the reference's own rounding convention, and the shipped noise model they are measured against.

**The reference's own rounding convention.** A checkpoint is trained with its reference's rounding (a constant or an
intermediate rounded to bf16 on purpose). An engine that keeps it in fp32 is *closer* to fp32 than the reference, so
r stays below 1. Where target and low-precision reference were fed the same tensor (input distance ≈ 0 in units of
the reference's rounding), a correct engine lands within a few ulps of X_R; one that departs from X_R by as much as
the reference's own rounding error (``same_dtype`` ≥ :data:`CONVENTION_DISTANCE`) *and* is clearly closer to fp32
(r ≤ :data:`CONVENTION_CLOSER`) follows another rounding convention (``kind="convention"``). These findings rank
below ratio-level divergences; the pipeline lets them decide the verdict only when nothing else explains an
output-level difference (see :mod:`ekka_core.pipeline`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ekka_core.analysis.observations import _Obs, _previous
from ekka_core.analysis.suspects import GlueLocator, _glue_suspect
from ekka_core.contracts.ranking import PairResult, Suspect

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
