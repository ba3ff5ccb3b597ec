"""Input fidelity: the ids the engine's request path fed the model, per request, against what the reference's own
tokenizer or chat template makes of the same input (prompt text, chat messages, token ids). Any difference is
``inputs-differ`` before any tensor is compared: a BOS, a chat template or a truncation is not a numerical bug.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ekka_core.contracts.checks import CheckOutcome
from ekka_core.contracts.report import CheckRecord, InputsDiffer
from ekka_core.contracts.serving import EngineOutputs
from ekka_core.contracts.spec import DiagnosisSpec

NAME = "inputs"


def check_inputs(spec: DiagnosisSpec, fed: EngineOutputs, own: list[list[int]], *, where: str,
                 fed_from: str = "the engine") -> tuple[CheckOutcome, list[InputsDiffer]]:
    """``where``: which run fed them ("served run", "traced run")."""
    differ = preflight_inputs(spec, fed, own, fed_from=fed_from)
    n = len(fed.requests)
    if not differ:
        return CheckOutcome(CheckRecord(NAME, "agrees", f"{where}: the engine fed every request the ids the "
                                                        f"reference makes of it", compared=n)), differ
    note = (f"the ids the engine fed the model ({where}) differ from what the reference's own tokenizer / chat "
            "template makes of the same input: fix the engine's request path (special tokens, BOS, chat template, "
            "truncation) and diagnose again")
    return CheckOutcome(CheckRecord(NAME, "diverges", f"{where}: {len(differ)} of {n} request(s) fed other ids",
                                    compared=n), notes=[note]), differ


def preflight_inputs(spec: DiagnosisSpec, fed: EngineOutputs, own: list[list[int]], *, fed_from: str = "the engine"
                     ) -> list[InputsDiffer]:
    """Per request: the ids the engine fed the model against the reference's own rendering of the same input. Any
    difference is reported with the first differing position, both id sequences and the tokens around it."""
    decode = _decoder(spec.model)
    requests = spec.request_list()
    differ = []
    for outcome in fed.requests:
        a = outcome.prompt_token_ids
        b = own[outcome.request] if outcome.request < len(own) else []
        if a == b:
            continue
        pos = next((j for j, (u, v) in enumerate(zip(a, b)) if u != v), min(len(a), len(b)))
        lo = max(0, pos - 3)
        req = requests[outcome.request] if outcome.request < len(requests) else None
        differ.append(InputsDiffer(
            prompt=outcome.request, request=req.id if req else str(outcome.request), input=req.kind if req else "?",
            position=pos, fed_from=fed_from, target=a[:pos + 8], reference=b[:pos + 8], target_len=len(a),
            reference_len=len(b), target_ids=a, reference_ids=b, target_tokens=decode(a[lo:pos + 4]),
            reference_tokens=decode(b[lo:pos + 4]), window_start=lo))
    return differ


def _decoder(model: str) -> Callable[[list[int]], list[str]]:
    """Token ids → their text, one string per id (the checkpoint's tokenizer.json through `tokenizers`, no torch)."""
    path = Path(model) / "tokenizer.json"
    if not path.exists():
        return lambda ids: [str(i) for i in ids]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    return lambda ids: [tok.id_to_token(i) or str(i) for i in ids]
