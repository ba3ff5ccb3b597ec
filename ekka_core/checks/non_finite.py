"""The non-finite check: the first module, in execution order, whose output holds NaN or Inf where the fp32
reference's is finite — the fp16-overflow class (activations past 65504) that every tensor-dump tool checks first.

A non-finite output has no error ratio (analysis reports it as the ratio sentinel); this check re-reads only the
candidate pairs' tensors, first to last, and stops at the first one whose non-finite values the reference does not
share. Its input being finite there makes it the module that produced them.
"""

from __future__ import annotations

import torch

from ekka_core.align import AlignedPairs, AlignmentError, align_pair
from ekka_core.checks.base import ComparisonCheck, Evidence, source_location
from ekka_core.contracts.checks import CheckOutcome
from ekka_core.contracts.ranking import NON_FINITE_RATIO, Ranking, Suspect
from ekka_core.contracts.report import CheckRecord, RowFinding

NAME = "non-finite"
ROWS_NAMED = 8          # rows listed in the finding (all are counted)


class NonFiniteCheck(ComparisonCheck):
    name = NAME
    needs = ("ranking", "aligned")

    def judge(self, ranking: Ranking, evidence: Evidence) -> CheckOutcome:
        aligned = evidence.aligned
        assert aligned is not None
        candidates = sorted((p for p in ranking.pairs if not p.error_ratio < NON_FINITE_RATIO), key=lambda p: p.order)
        n = len(ranking.pairs)
        for p in candidates:
            found = _non_finite_rows(aligned, p.component)
            if found is None:
                continue
            count, rows, input_finite = found
            return CheckOutcome(CheckRecord(NAME, "diverges", f"{p.component} outputs {count} NaN/Inf value(s) "
                                                              "where the reference's are finite", compared=n),
                                findings=[_suspect(evidence, p.component, p.cls, p.reference_modules, count, rows,
                                                   input_finite)], precedence=0)
        return CheckOutcome(CheckRecord(NAME, "agrees", "no module outputs NaN/Inf where the reference is finite",
                                        compared=n))


def _non_finite_rows(aligned: AlignedPairs, component: str) -> tuple[int, list[RowFinding], bool] | None:
    """(non-finite values, the rows holding them, whether the module's input was finite there) — None when the
    target's non-finite values are the reference's too (or the pair cannot be re-read)."""
    pair = next((q for q in aligned.mapping.pairs if q.component == component), None)
    if pair is None:
        return None
    try:
        ap = align_pair(pair, aligned.traces, aligned.order.get(component, -1))
    except AlignmentError:
        return None
    bad = ~torch.isfinite(ap.target.float()) & torch.isfinite(ap.reference_fp32.float())
    if not bool(bad.any()):
        return None
    per_row = bad.reshape(bad.shape[0], -1).sum(dim=1)
    rows = [RowFinding(request=ap.keys[i][0], position=ap.keys[i][1], ratio=NON_FINITE_RATIO)
            for i in torch.nonzero(per_row).flatten().tolist()]
    input_finite = ap.inputs is None or bool(torch.isfinite(ap.inputs[0][per_row > 0].float()).all())
    return int(bad.sum()), rows, input_finite


def _suspect(evidence: Evidence, module: str, cls: str, reference_modules: list[str], count: int,
             rows: list[RowFinding], input_finite: bool) -> Suspect:
    file, line, ffile, fline = source_location(evidence, module)
    first = rows[0]
    where = ", ".join(f"request {r.request} token {r.position}" for r in rows[:ROWS_NAMED])
    more = f" and {len(rows) - ROWS_NAMED} more" if len(rows) > ROWS_NAMED else ""
    blame = ("its input is finite there: this module produces them" if input_finite else
             "its input is already non-finite there: the module feeding it is not compared")
    return Suspect(rank=0, module=module, cls=cls, file=file, line=line, forward_file=ffile, forward_line=fline,
                   reference_modules=list(reference_modules), error_ratio=NON_FINITE_RATIO, input_ratio=None,
                   onset_token=first.position, onset_phase=None, kind="non-finite", rows=rows[:ROWS_NAMED * 4],
                   non_finite=count,
                   evidence=f"{count} NaN/Inf output value(s) in {len(rows)} row(s) where the fp32 reference is "
                            f"finite ({where}{more}); {blame}")
