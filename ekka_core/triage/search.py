"""Delta debugging over the served features: the smallest set that makes the difference (Zeller's ddmin).

Each trial is one untraced engine run scored against the reference; the caller supplies it, so this module stays an
algorithm with no engine in it.
"""

from __future__ import annotations

from typing import Callable

from ekka_core.contracts.serving import FACTORS, TRACEABLE_FACTORS, SymptomCheck, Trial, Triage

# One untraced run of the baseline plus these served factors → its symptom check (None: it could not run).
RunTrial = Callable[[list[str]], tuple[SymptomCheck | None, Trial]]


def trial_cost(factors: list[str]) -> int:
    """How dear a trial of these factors is, as an order: a configuration that keeps compilation starts by compiling
    its graph or loading it from vLLM's compile cache (up to a cold served run: 0.62× measured for one that compiled),
    an eager one does neither (about 0.13×)."""
    return int("compilation" in factors)


def triage(served: SymptomCheck, baseline: SymptomCheck, differing: dict[str, dict], ruled_out: dict[str, str],
           run_trial: RunTrial, *, max_trials: int = 12) -> Triage:
    result = Triage(served=served, baseline=baseline, differing=dict(differing), ruled_out=dict(ruled_out))
    if served.diverges and baseline.diverges:
        result.direction = "both"
        result.words = ("diverges in the served configuration and in the traced baseline alike: no served feature "
                        "is needed to show it")
        return result
    if not served.diverges and not baseline.diverges:
        result.direction = "neither"
        result.words = "neither the served configuration nor the traced baseline diverges at the output level"
        return result
    result.direction = "served-diverges" if served.diverges else "traced-diverges"
    factors = [f for f in FACTORS if f in differing]
    if not factors:
        result.words = ("the served and the traced configuration differ in no feature Ekka controls, yet only one "
                        "diverges: the difference is run-to-run (check for nondeterminism)")
        return result
    want = served.diverges      # the outcome the served features produce

    def test(subset: list[str]) -> bool | None:
        if len(result.trials) >= max_trials:
            result.exhausted = True       # a trial ddmin wanted was not run: the set it returns is not minimal
            return None
        check, trial = run_trial(subset)
        result.trials.append(trial)
        return None if check is None else check.diverges == want

    culprit = _ddmin(factors, test)
    result.culprit = culprit
    result.untraceable = [f for f in culprit if f not in TRACEABLE_FACTORS]
    result.exhausted = result.exhausted and len(culprit) > 1
    result.words = _words(result)
    return result


def _ddmin(factors: list[str], test: Callable[[list[str]], bool | None]) -> list[str]:
    """Zeller's ddmin: a 1-minimal subset of ``factors`` for which ``test`` holds (it holds for all of them — the
    served run — and not for none — the baseline). A trial that cannot run (None) counts as not reproducing.

    Within a round ddmin may test its subsets (and then their complements) in any order: it takes the first that
    reproduces. Cheaper trials go first (:func:`trial_cost`, order kept among equals), so a compiled configuration
    runs only when no eager one of the round settled it."""
    current, n = list(factors), 2
    while len(current) >= 2:
        size = len(current)
        subsets = sorted((current[i * size // n:(i + 1) * size // n] for i in range(n)), key=trial_cost)
        for subset in subsets:
            if test(subset):
                current, n = subset, 2
                break
        else:
            complements = [[f for f in current if f not in subset] for subset in subsets] if n > 2 else []
            for rest in sorted(complements, key=trial_cost):   # with two halves a complement is the other half
                if test(rest):
                    current, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= size:
                    break
                n = min(size, 2 * n)
    return current


def _words(t: Triage) -> str:
    names = " and ".join(FACTORS[f] for f in t.culprit) or "no single feature"
    if t.exhausted:
        return (f"not narrowed: the {len(t.trials)} trials allowed ran out before delta debugging isolated a "
                f"minimal set — the difference is somewhere in {names} (one or more of them; diagnose again with "
                "fewer served features changed to narrow it)")
    if t.direction == "served-diverges":
        text = f"diverges only with {names} on"
        if "prefix_caching" in t.culprit:
            text += f", on requests that hit the cache ({t.served.cached_tokens} prompt tokens came from it)"
    else:
        text = f"diverges only in the traced baseline; the served configuration avoids it through {names}"
    if t.untraceable:
        text += ("; hooks cannot see inside a torch.compile'd graph, so the module-level comparison below is the "
                 "last traceable configuration")
    return text
