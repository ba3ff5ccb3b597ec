"""How far a *correct* engine lands from the low-precision reference where both were fed the same tensor — the
noise model behind analysis' reference-convention check (``ekka_core/analysis/convention_noise.json``).

For each zoo architecture, a clean diagnosis in bf16 (served eager, so the run is quick); for every compared pair
whose input is identical to the reference's low-precision run (input distance ≤ CONVENTION_IDENTICAL), the output's
same-dtype distance d = ‖X_T − X_R‖ / ‖X_R − Y_R‖, per target class; for the code between two modules (an input
observed right after an identical output), the same for the input. The noise model is the largest clean d per class
(and for glue code), and the largest output-level same-dtype distance of the sampled logprobs. The same runs measure
the row-level check's noise model (``ekka_core/checks/row_noise.json``): the largest persisting row ratio
(``checks/rows.py``). ``--write`` stores both where the checks read them, ``--write-rows`` only the second. ``--bug NAME`` runs one benchmark case instead, to see the signature of a real departure.

    .venv/bin/python benchmarks/convention_noise.py [--arch llama ...] [--write | --write-rows] [--bug NAME]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ekka_core import bugs
from ekka_core.analysis import CONVENTION_IDENTICAL
from ekka_core.checks.rows import NAME as ROWS_CHECK
from ekka_core.checks.rows import NOISE_FILE as ROW_NOISE_FILE
from ekka_core.contracts.report import Report, SeriesPoint
from ekka_core.contracts.spec import DiagnosisSpec
from ekka_core.pipeline import diagnose
from ekka_core.zoo import build_model, known_architectures


def pairs_of(report: Report) -> list[SeriesPoint]:
    return [s for s in report.plots.series if s.input_same_dtype is not None
            and s.input_same_dtype <= CONVENTION_IDENTICAL]


def clean_distances(report: Report) -> tuple[dict[str, float], list[float]]:
    """Largest same-dtype distance per class on identical inputs, and the distances of glue transitions (an input
    observed just after an output, on the completion clock, that was identical)."""
    per_class: dict[str, float] = {}
    series = report.plots.series
    for s in pairs_of(report):
        per_class[s.cls] = max(per_class.get(s.cls, 0.0), s.same_dtype or 0.0)
    glue = []
    for s in series:
        if s.input_same_dtype is None or s.entered_after is None:
            continue
        before = [t for t in series if t.order <= s.entered_after and t is not s
                  and not s.component.startswith(t.component + ".")]
        if before:
            prev = max(before, key=lambda t: t.order)
            if prev.same_dtype is not None and prev.same_dtype <= CONVENTION_IDENTICAL:
                glue.append(s.input_same_dtype)
    return per_class, glue


def row_statistic(report: Report) -> float | None:
    """The row-level check's statistic on this run (the largest persisting row ratio), what its noise model is."""
    return next((c.statistic for c in report.checks if c.check == ROWS_CHECK), None)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", action="append")
    ap.add_argument("--bug", default=None)
    ap.add_argument("--out", type=Path, default=Path("ekka-out/convention-noise"))
    ap.add_argument("--write", action="store_true", help="store both noise models (conventions and rows)")
    ap.add_argument("--write-rows", action="store_true", help="store only the row-level check's noise model")
    args = ap.parse_args()
    model: dict = {"classes": {}, "glue": 0.0, "output_same_dtype": 0.0}
    row_model: dict = {"largest_clean_statistic": 0.0}
    cases = []
    if args.bug:
        bug = bugs.get(args.bug)
        cases.append((bug.arch, bug.zoo_overrides or None, {bugs.ENV_VAR: bug.name}, bug.dtype))
    else:
        cases = [(a, None, None, "bfloat16") for a in (args.arch or known_architectures())]
    worst = 0
    for arch, overrides, env, dtype in cases:
        spec = DiagnosisSpec(model=str(build_model(arch, overrides=overrides)), prompts=bugs.DEFAULT_PROMPTS,
                             dtype=dtype, max_new_tokens=3, engine_args={"enforce_eager": True})
        report = diagnose(spec, args.out / (args.bug or arch), env=env).report
        rows = pairs_of(report)
        per_class, glue = clean_distances(report)
        for cls, d in per_class.items():
            model["classes"][cls] = round(max(model["classes"].get(cls, 0.0), d), 4)
        model["glue"] = round(max([model["glue"], *glue]), 4)
        checks = [c for c in (report.serving.served, report.serving.traced) if c is not None] if report.serving \
            else []
        model["output_same_dtype"] = round(max([model["output_same_dtype"]] + [c.same_dtype or 0.0 for c in checks]), 4)
        row_stat = row_statistic(report)
        if row_stat is not None:
            row_model["largest_clean_statistic"] = round(max(row_model["largest_clean_statistic"], row_stat), 4)
        flagged = report.conventions
        worst += len(flagged) if not args.bug else 0
        rows.sort(key=lambda s: -(s.same_dtype or 0.0))
        outs = {"served": checks[0].same_dtype if checks else None,
                "traced": report.serving.traced.same_dtype if report.serving and report.serving.traced else None}
        print(f"{arch}: verdict {report.verdict}, {len(rows)} pairs with identical inputs, "
              f"{len(flagged)} convention finding(s); output-level same-dtype distance served "
              f"{outs['served']}, traced {outs['traced']}; largest persisting row ratio {row_stat}; "
              f"largest output distances:")
        for s in rows[:6]:
            print(f"   {s.component:<48} d={s.same_dtype:.3f}  r={s.error_ratio:.3f}  "
                  f"(input d={s.input_same_dtype:.3f})")
        for c in report.conventions:
            print("   finding:", c)
        sys.stdout.flush()
    print(json.dumps({"false_findings": worst}))
    print(json.dumps(model, indent=1))
    print(json.dumps({"rows": row_model}))
    if (args.write or args.write_rows) and not args.bug:
        import datetime

        from ekka_core.analysis import NOISE_MODEL_FILE
        measured = (f"benchmarks/convention_noise.py, {datetime.date.today()}, clean bf16 runs of "
                    f"{', '.join(a for a, *_ in cases)}")
        if args.write:
            model["measured"] = measured
            NOISE_MODEL_FILE.write_text(json.dumps(model, indent=1, sort_keys=True) + "\n")
            print(f"wrote {NOISE_MODEL_FILE}")
        row_model["measured"] = measured
        ROW_NOISE_FILE.write_text(json.dumps(row_model, indent=1, sort_keys=True) + "\n")
        print(f"wrote {ROW_NOISE_FILE}")
    return 0 if worst == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
