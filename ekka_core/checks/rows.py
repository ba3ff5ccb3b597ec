"""The row-level check: a module wrong on a handful of rows (a request, a block boundary, the first decode step,
positions past a scaling threshold) that its pooled error ratio averages away — a module wrong on 1 row in 100 by
10× reads about 1.4 pooled, under the threshold.

Per row (request, token position) analysis already has the error ratio against the reference's own low-precision
error on that row (``PairResult.token_ratios``). Single rows are noisier than a pooled norm, so a row counts as
*far* only beyond the per-row noise model (:data:`ROW_NOISE`, the largest clean statistic over every zoo
architecture, with a margin: ``row_noise.json``, measured by ``benchmarks/convention_noise.py``), and only when it
*persists*: the same row is still far at the last decoder layer's output (the residual stream carries an upstream
error to the end; a noisy row at one module does not) — for the modules after it (final norm, logits), at the last
compared pair. The statistic of a row at a module is therefore
``min(r_module, r_last_layer)``, and the first module, in execution order, with a far row is the finding.

It only looks where the pooled comparison found nothing: a module the pooled ratio already blames is ranked there.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ekka_core.checks.base import ComparisonCheck, Evidence, source_location
from ekka_core.contracts.checks import CheckOutcome
from ekka_core.contracts.ranking import PairResult, Ranking, Suspect
from ekka_core.contracts.report import CheckRecord, RowFinding

NAME = "rows"
NOISE_FILE = Path(__file__).with_name("row_noise.json")
NOISE_MARGIN = 2.0        # the row noise bound is this × the largest clean statistic measured
ROWS_NAMED = 8
# The narrowest rows the noise model was measured on (the zoo's MoE routers: 4 experts). A row of fewer features — a
# scalar gate, one logit per token — is a ratio of one or two rounding errors, heavy-tailed; no per-row claim on it.
MIN_ROW_WIDTH = 4
_LAYER = re.compile(r"(^|.*\.)layers\.\d+$")


def _row_noise() -> float | None:
    try:
        measured = json.loads(NOISE_FILE.read_text())["largest_clean_statistic"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return NOISE_MARGIN * float(measured)


ROW_NOISE = _row_noise()


def row_statistics(ranking: Ranking) -> list[tuple[PairResult, dict[tuple[int, int], float]]]:
    """Per compared pair, in execution order: row → ``min(r_pair, r_last_layer)`` (the persisting row ratio).
    Empty when no decoder layer's output was compared (nothing to say what persists)."""
    layers = [p for p in ranking.pairs if _LAYER.fullmatch(p.component)]
    if not layers:
        return []
    last_layer = max(layers, key=lambda p: p.order)
    ordered = sorted(ranking.pairs, key=lambda p: p.order)
    # After the last decoder layer (final norm, logits) the end of the stream is the last compared pair.
    ends = {id(end): {(s, pos): r for s, pos, r in end.token_ratios} for end in (last_layer, ordered[-1])}
    out = []
    for p in ordered:
        at_end = ends[id(last_layer if p.order <= last_layer.order else ordered[-1])]
        out.append((p, {(s, pos): min(r, at_end[(s, pos)]) for s, pos, r in p.token_ratios if (s, pos) in at_end}))
    return out


def largest_statistic(stats: list[tuple[PairResult, dict[tuple[int, int], float]]]) -> float:
    """What the noise model is measured on: the largest persisting row ratio of a run (a clean one)."""
    return round(max((r for _, rows in stats for r in rows.values()), default=0.0), 4)


class RowCheck(ComparisonCheck):
    name = NAME

    def judge(self, ranking: Ranking, evidence: Evidence) -> CheckOutcome:
        if ranking.suspects:
            return CheckOutcome(CheckRecord(NAME, "skipped", "the pooled comparison already diverges"))
        stats = row_statistics(ranking)
        if not stats:
            return CheckOutcome(CheckRecord(NAME, "skipped", "no decoder layer output was compared"))
        if ROW_NOISE is None:
            return CheckOutcome(CheckRecord(NAME, "skipped", f"no row noise model ({NOISE_FILE.name}) is shipped",
                                            statistic=largest_statistic(stats)))
        n_rows = max(len(rows) for _, rows in stats)
        largest = largest_statistic(stats)
        ties = _routing_ties(evidence)
        for pair, rows in stats:
            if _row_width(evidence, pair.component) < MIN_ROW_WIDTH:
                continue
            far = sorted((k for k, r in rows.items() if r > ROW_NOISE and not _after_tie(k, pair.order, ties)))
            if not far:
                continue
            named = [RowFinding(s, pos, round(rows[(s, pos)], 3)) for s, pos in far]
            return CheckOutcome(CheckRecord(NAME, "diverges", f"{pair.component} diverges at {len(far)} of "
                                                              f"{len(rows)} rows", compared=n_rows,
                                            statistic=largest),
                                findings=[_suspect(evidence, pair, named, len(rows))])
        return CheckOutcome(CheckRecord(NAME, "agrees", f"no row beyond the per-row noise ({ROW_NOISE:.3g}) at any "
                                                        "module", compared=n_rows, statistic=largest))


def _routing_ties(evidence: Evidence) -> dict[int, list[tuple[int, int]]]:
    """Per sequence: (position, module order) of every MoE token whose expert choice is a tie within the reference's
    rounding (the aligner's exclusions)."""
    out: dict[int, list[tuple[int, int]]] = {}
    for (seq, pos), (order, _why) in (getattr(evidence.aligned, "excluded", None) or {}).items():
        out.setdefault(seq, []).append((pos, order))
    return out


def _after_tie(row: tuple[int, int], order: int, ties: dict[int, list[tuple[int, int]]]) -> bool:
    """A row at or after a tied token of its sequence, at a module after that router: a correct engine may route the
    tie elsewhere, and attention carries that to every later position — no per-row claim there (the pooled ratio
    and the output checks still see these rows)."""
    seq, pos = row
    return any(p0 <= pos and o0 <= order for p0, o0 in ties.get(seq, ()))


def _row_width(evidence: Evidence, component: str) -> int:
    """Features per row of the module's first output in the target trace (unknown: as wide as the noise model)."""
    calls_of = getattr(getattr(getattr(evidence.aligned, "traces", None), "target", None), "calls_of", None)
    calls = calls_of(component) if calls_of is not None else []
    shape = next((o.shape for o in calls[0].outputs if getattr(o, "shape", None)), None) if calls else None
    return int(shape[-1]) if shape else MIN_ROW_WIDTH


def _suspect(evidence: Evidence, pair: PairResult, rows: list[RowFinding], total: int) -> Suspect:
    file, line, ffile, fline = source_location(evidence, pair.component)
    where = ", ".join(f"request {r.request} token {r.position}" for r in rows[:ROWS_NAMED])
    more = f" and {len(rows) - ROWS_NAMED} more" if len(rows) > ROWS_NAMED else ""
    pattern = _pattern([r.position for r in rows])
    return Suspect(rank=0, module=pair.component, cls=pair.cls, file=file, line=line, forward_file=ffile,
                   forward_line=fline, reference_modules=list(pair.reference_modules), error_ratio=pair.error_ratio,
                   input_ratio=pair.input_ratio, onset_token=min(r.position for r in rows), onset_phase=None,
                   kind="rows", rows=rows[:ROWS_NAMED * 4],
                   evidence=f"diverges at {len(rows)} of {total} rows ({where}{more}{pattern}), each beyond the "
                            f"per-row noise ({ROW_NOISE:.3g}) here and still at the last decoder layer; the pooled "
                            f"ratio {pair.error_ratio:.3g} averages them away")


def _pattern(positions: list[int]) -> str:
    """A shape the positions share that points at a mechanism: a common block multiple, or a range's start."""
    ps = sorted(set(positions))
    if len(ps) >= 2:
        for block in (256, 128, 64, 32, 16):
            if all(p % block == 0 for p in ps):
                return f" — positions that are multiples of {block}"
        if ps == list(range(ps[0], ps[-1] + 1)) and len(ps) >= 3:
            return f" — every position from {ps[0]} to {ps[-1]}"
    return ""
