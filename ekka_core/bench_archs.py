"""``ekka bench --archs``: Ekka on every text-decoder architecture both the installed vLLM and HF Transformers
implement natively (:mod:`ekka_core.zoo.sweep`), not only the ten its zoo was tuned to.

For each architecture: build its tiny checkpoint from the generated recipe; **probe** it without Ekka's diagnosis
(does vLLM-CPU start; vLLM's greedy tokens and logprobs against HF teacher-forced on them, bf16 and fp32 — an
architecture where they really differ is a finding, printed, not hidden); then, where it starts and agrees, a clean
``diagnose`` (served as the traced baseline, so the served run *is* the traced run: one engine run) that must be
``consistent``, and two injected ones (:mod:`ekka_core.bugs.generic`): the output of layer 1's MLP/MoE block scaled,
then the output of layer 1's attention output projection — each scored by the rank of the injected module among the
report's suspects (rank 1 expected). The modules are chosen from the clean diagnosis's vLLM model tree
(:func:`injection_targets`).
"""

from __future__ import annotations

import math
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from ekka_core.contracts.errors import EkkaError
from ekka_core.contracts.report import Report

SCALE = 1.5                 # the injected bugs' factor
PROBE_NEW_TOKENS = 8        # greedy tokens compared by the probe
DIAGNOSIS_NEW_TOKENS = 4    # as `ekka bench`

# The sweep's default slice for a full run (diverse families: MoE ×3, dense with odd structure ×3).
DEFAULT_SLICE = ["mixtral", "qwen2_moe", "olmoe", "cohere", "falcon", "stablelm"]


@dataclass
class Probe:
    """vLLM-CPU against HF on the bench prompts, untraced (the traced baseline's engine arguments)."""

    built: bool = False
    started: bool = False
    agrees: bool | None = None            # the logits-level check within the threshold (None: could not run)
    ratio: float | None = None            # its ratio ‖vLLM − fp32‖ / ‖HF-bf16 − fp32‖ (1: as good as HF bf16)
    same_dtype: float | None = None
    greedy_fp32: str = ""                 # "k/n": vLLM's greedy tokens that are HF-fp32's argmax too
    greedy_low: str = ""                  # … HF-bf16's
    max_lp_diff_fp32: float | None = None     # max |logprob vLLM − HF fp32| over vLLM's top-k at sampled steps
    max_lp_diff_low: float | None = None      # … − HF bf16
    max_lp_noise: float | None = None         # max |HF bf16 − HF fp32| on the same tokens (the reference's own)
    seconds: float = 0.0
    error: str = ""                       # why it did not build / start / score, in one line
    # config attributes vLLM's model file reads that HF's native config lacks (zoo.sweep.vllm_reads_missing)
    vllm_reads_missing: list[str] = field(default_factory=list)


@dataclass
class Injected:
    bug: str
    module: str
    verdict: str = ""
    rank: int | None = None               # rank of the injected module among report.suspects
    top: str | None = None                # the rank-1 suspect
    top_reference: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""
    # How the diagnosis's mapping (mapping.json) paired the injected module and the rank-1 suspect: "relation rule →
    # reference modules", or why it is unmapped
    module_mapping: str = ""
    top_mapping: str = ""

    @property
    def passed(self) -> bool:
        return self.verdict == "divergent" and self.rank == 1


@dataclass
class ArchResult:
    model_type: str
    vllm_class: str
    family: str
    probe: Probe
    clean_verdict: str | None = None
    clean_top: str | None = None
    clean_seconds: float = 0.0
    mlp: Injected | None = None
    attn: Injected | None = None
    checked: int = 0                      # component pairs the clean diagnosis compared
    unmapped: list[str] = field(default_factory=list)       # "module: reason" the clean report did not compare
    missing: list[str] = field(default_factory=list)        # what the clean report could not observe
    seconds: float = 0.0
    error: str = ""

    @property
    def passed(self) -> bool:
        return self.clean_verdict == "consistent" and all(i is not None and i.passed for i in (self.mlp, self.attn))

    @staticmethod
    def from_json(d: dict[str, Any]) -> "ArchResult":
        d = dict(d)
        d["probe"] = Probe(**d["probe"])
        for k in ("mlp", "attn"):
            if d.get(k) is not None:
                d[k] = Injected(**d[k])
        return ArchResult(**d)


def spec_for(model: Path, *, max_new_tokens: int, one_run: bool = True) -> Any:
    from ekka_core import bugs
    from ekka_core.capture.vllm_config import traced_baseline
    from ekka_core.contracts.spec import DiagnosisSpec

    return DiagnosisSpec(model=str(model), prompts=list(bugs.DEFAULT_PROMPTS), dtype="bfloat16",
                         max_new_tokens=max_new_tokens,
                         engine_args=traced_baseline(str(model)) if one_run else {})


# -- the probe ----------------------------------------------------------------------------------------------------
def probe(model_type: str, out: Path, *, fresh: bool = False) -> tuple[Probe, Path | None]:
    """Build the checkpoint and run vLLM on it untraced, scored against HF (no module tracing, no diagnosis)."""
    from ekka_core.capture import run_engine
    from ekka_core.capture.vllm_config import configuration, served_args
    from ekka_core.symptom import check_symptom
    from ekka_core.zoo import build_model

    t0 = time.perf_counter()
    p = Probe()
    try:
        model = build_model(f"sweep:{model_type}")
    except Exception as e:  # noqa: BLE001 - any failure to build is the finding
        p.error = f"build: {_one_line(e)}"
        p.seconds = time.perf_counter() - t0
        return p, None
    p.built = True
    from ekka_core.zoo.sweep import vllm_reads_missing

    p.vllm_reads_missing = vllm_reads_missing(model_type)
    spec = spec_for(model, max_new_tokens=PROBE_NEW_TOKENS)
    args, _ = served_args(spec)
    traced, _ = configuration(args, None)
    try:
        run = run_engine(spec, out / "probe", traced, label="probe", fresh=fresh)
    except EkkaError as e:
        scored = (out / "probe" / "score.log").exists()          # the engine ran; the HF scoring run failed
        p.error = _failure_line(e, out / "probe" / ("score.log" if scored else "engine.log"))
        p.started = scored or not re.search(r"failed to start|cannot load|cannot start", p.error)
        p.error = f"{'score' if scored else 'start' if not p.started else 'generate'}: {p.error}"
        p.seconds = time.perf_counter() - t0
        return p, model
    p.started = True
    check = check_symptom(run.outputs, run.scores, threshold=spec.threshold, label="probe")
    p.agrees, p.ratio, p.same_dtype = not check.diverges, check.ratio, check.same_dtype
    _logprob_stats(p, run.outputs, run.scores)
    p.seconds = time.perf_counter() - t0
    return p, model


def _logprob_stats(p: Probe, outputs: Any, scores: Any) -> None:
    low, high = scores.low.steps(), scores.fp32.steps()
    n = ok_fp32 = ok_low = 0
    d_fp32 = d_low = noise = 0.0
    for r in outputs.requests:
        for j, (top, x, y) in enumerate(zip(r.logprobs, low.get(r.request, []), high.get(r.request, []))):
            if j >= len(r.generated):
                break
            n += 1
            ok_fp32 += r.generated[j] == y.argmax
            ok_low += r.generated[j] == x.argmax
            for t, lx, ly in zip(x.tokens, x.logprobs, y.logprobs):
                if t in top:
                    d_fp32 = max(d_fp32, abs(top[t] - ly))
                    d_low = max(d_low, abs(top[t] - lx))
                noise = max(noise, abs(lx - ly))
    p.greedy_fp32, p.greedy_low = f"{ok_fp32}/{n}", f"{ok_low}/{n}"
    p.max_lp_diff_fp32, p.max_lp_diff_low, p.max_lp_noise = d_fp32, d_low, noise


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {clean_error(str(e))}"[:300]


_ERROR_LINE = re.compile(r"(Error|Exception|NotImplemented|not supported|Unsupported|assert)", re.I)


def _failure_line(e: EkkaError, log: Path) -> str:
    """The root cause of a failed engine run, in one line: the error's own message where it names one ("vLLM failed
    to start: …"), else the last error line of the run's log (vLLM prints the cause last)."""
    message = clean_error(str(e))
    if "died (exit" not in message:
        return message
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    for ln in reversed(lines):
        if _ERROR_LINE.search(ln) and not ln.startswith(("File ", "Traceback", "raise ", "^", "{")) \
                and "ekka: error" not in ln:
            return re.sub(r"^\(\w+ pid=\d+\)\s*", "", ln)[:300]
    return message


def clean_error(text: str) -> str:
    """One line of an error: an error envelope (``{"ekka_error": {"message": …}}``) read for its message."""
    import json

    text = text.strip()
    start = text.find('{"ekka_error"')
    if start >= 0:
        try:
            text = json.loads(text[start:])["ekka_error"]["message"]
        except (ValueError, KeyError, TypeError):
            pass
    first = text.splitlines()[0] if text else ""
    return first[:300]


# -- the diagnoses ------------------------------------------------------------------------------------------------
def injection_targets(trace_dir: Path) -> tuple[str | None, str | None]:
    """From the clean diagnosis's vLLM trace: (layer 1's MLP/MoE block, layer 1's attention output projection) —
    the child of the second decoder layer that owns the MLP weights, and the row-parallel linear (the output
    projection) inside its attention child."""
    from ekka_core.capture.trace import Trace
    from ekka_core.tree import build_tree

    tree = build_tree(Trace(trace_dir))
    return choose_targets(tree.modules)


_MLP_NAMES = ("mlp", "block_sparse_moe", "feed_forward", "moe", "ffn", "mlp_block", "experts")
_NORM = re.compile(r"norm", re.I)


def choose_targets(modules: dict[str, Any]) -> tuple[str | None, str | None]:
    """``modules``: a ModelTree's nodes by name (each with ``cls`` and ``weights``). The decoder layers are the
    shortest ``<prefix>.<i>`` family whose ``<prefix>.0`` and ``<prefix>.1`` both ran."""
    names = list(modules)
    layer = min((n for n in names if re.fullmatch(r".+\.1", n) and n[:-1] + "0" in modules),
                key=lambda n: (n.count("."), names.index(n)), default=None)
    if layer is None:
        return None, None
    children = [n for n in names if n.startswith(layer + ".") and n.count(".") == layer.count(".") + 1]

    def subtree(child: str) -> list[str]:
        return [n for n in names if n == child or n.startswith(child + ".")]

    def is_attention(child: str) -> bool:
        return any("attention" in modules[n].cls.lower() or n.rsplit(".", 1)[-1] in ("attn", "self_attn")
                   for n in subtree(child))

    def weighted(child: str) -> bool:
        return bool(modules[child].weights)

    attn_child = next((c for c in children if is_attention(c) and weighted(c)), None)
    rest = [c for c in children if c != attn_child and weighted(c) and not _NORM.search(modules[c].cls)
            and not _NORM.search(c.rsplit(".", 1)[-1])]
    mlp = next((c for c in rest if c.rsplit(".", 1)[-1] in _MLP_NAMES), None) or (rest[-1] if rest else None)
    attn = None
    if attn_child is not None:
        inner = subtree(attn_child)
        row = [n for n in inner if modules[n].cls == "RowParallelLinear"]
        linear = [n for n in inner if "Linear" in modules[n].cls and modules[n].weights]
        attn = row[-1] if row else (linear[-1] if linear else None)
    return mlp, attn


def diagnose_clean(model: Path, out: Path, *, fresh: bool = True) -> Report:
    from ekka_core.pipeline import diagnose

    return diagnose(spec_for(model, max_new_tokens=DIAGNOSIS_NEW_TOKENS), out, fresh=fresh).report


def diagnose_injected(model: Path, module: str, out: Path, *, fresh: bool = True) -> Injected:
    from ekka_core import bugs
    from ekka_core.bugs.generic import scale_output_name
    from ekka_core.pipeline import diagnose

    name = scale_output_name(module, SCALE)
    t0 = time.perf_counter()
    result = Injected(name, module)
    try:
        report = diagnose(spec_for(model, max_new_tokens=DIAGNOSIS_NEW_TOKENS), out, env={bugs.ENV_VAR: name},
                          fresh=fresh).report
    except EkkaError as e:
        result.verdict, result.error = "error", _one_line(e)
        result.seconds = time.perf_counter() - t0
        return result
    result.verdict = report.verdict
    result.rank = next((s.rank for s in report.suspects if s.target.module == module), None)
    if report.suspects:
        result.top = report.suspects[0].target.module
        result.top_reference = list(report.suspects[0].reference.modules)
    result.module_mapping = mapping_of(out / "mapping.json", module)
    if result.top is not None:
        result.top_mapping = mapping_of(out / "mapping.json", result.top)
    result.seconds = time.perf_counter() - t0
    return result


def mapping_of(path: Path, module: str) -> str:
    """How ``mapping.json`` pairs the vLLM module ``module``: each pair naming it ("relation rule → reference
    modules"), or its unmapped entry; "" when the file is absent, "not in the mapping" when it does not name it."""
    from ekka_core.contracts.mapping import Mapping

    try:
        mapping = Mapping.load(Path(path))
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    found = [f"{p.relation} [{p.rule}] → {', '.join(p.reference.modules) or '—'}"
             + (f" (component {p.component})" if p.component != module else "")
             for p in mapping.pairs if module in p.target.modules]
    found += [f"unmapped ({u.status}): {u.reason}" for u in mapping.unmapped if u.module == module]
    return "; ".join(found) or "not in the mapping"


def run_arch(model_type: str, out_root: Path, *, diagnoses: bool = True,
             stage: Callable[[str, str], None] = lambda arch, what: None) -> ArchResult:
    from ekka_core.zoo.sweep import candidate

    t0 = time.perf_counter()
    c = candidate(model_type)
    out = out_root / model_type
    stage(model_type, "probe: build, vLLM-CPU vs HF")
    p, model = probe(model_type, out)
    result = ArchResult(model_type, c.vllm_class, c.family, p)
    if not diagnoses or not p.agrees or model is None:
        result.seconds = time.perf_counter() - t0
        return result
    stage(model_type, "clean diagnosis")
    t1 = time.perf_counter()
    try:
        report = diagnose_clean(model, out / "clean")
        result.clean_verdict = report.verdict
        result.clean_top = report.top.target.module if report.top else None
        result.checked = report.checked
        result.unmapped = [f"{u.module or '(root)'}: {u.reason}" for u in report.unchecked]
        result.missing = list(report.missing)
    except EkkaError as e:
        # (an alignment proof that fails is the clean diagnosis's own finding: the injected ones still run, on the
        # targets read from the trace it captured)
        result.clean_verdict, result.error = "error", _one_line(e)
    result.clean_seconds = time.perf_counter() - t1
    try:
        mlp, attn = injection_targets(out / "clean" / "traces" / "target")
    except (EkkaError, OSError):
        mlp = attn = None                     # no trace to read them from (the clean run did not get that far)
    if mlp is None or attn is None:
        result.error = "; ".join(filter(None, [result.error, f"no injection target found in the vLLM tree (MLP "
                                                             f"{mlp}, attention projection {attn})"]))
    if mlp is not None:
        stage(model_type, f"injected: {mlp} ×{SCALE:g}")
        result.mlp = diagnose_injected(model, mlp, out / "inject-mlp")
    if attn is not None:
        stage(model_type, f"injected: {attn} ×{SCALE:g}")
        result.attn = diagnose_injected(model, attn, out / "inject-attn")
    result.seconds = time.perf_counter() - t0
    return result


def run_archs(model_types: list[str], out_root: Path, *, diagnoses: bool = True,
              on_result: Callable[[ArchResult], None] = lambda r: None,
              stage: Callable[[str, str], None] = lambda arch, what: None) -> dict[str, Any]:
    results = []
    for mt in model_types:
        r = run_arch(mt, out_root, diagnoses=diagnoses, stage=stage)
        results.append(r)
        on_result(r)
    return summarize(results, diagnoses=diagnoses)


def summarize(results: list[ArchResult], *, diagnoses: bool) -> dict[str, Any]:
    from ekka_core.zoo.sweep import candidates

    probed = [r.probe for r in results]
    diagnosed = [r for r in results if r.clean_verdict is not None]
    injected = [i for r in diagnosed for i in (r.mlp, r.attn) if i is not None]
    excluded = [asdict(c) for c in candidates() if not c.included]
    return {
        "archs": [asdict(r) for r in results],
        "diagnoses": diagnoses,
        "built": f"{sum(p.built for p in probed)}/{len(probed)}",
        "started": f"{sum(p.started for p in probed)}/{len(probed)}",
        "agree": f"{sum(bool(p.agrees) for p in probed)}/{len(probed)}",
        "clean_consistent": f"{sum(r.clean_verdict == 'consistent' for r in diagnosed)}/{len(diagnosed)}",
        "injected_rank1": f"{sum(i.passed for i in injected)}/{len(injected)}",
        "median_seconds": statistics.median(r.seconds for r in results) if results else None,
        "excluded": excluded,
    }


# -- tables -------------------------------------------------------------------------------------------------------
def _f(x: float | None, spec: str = ".2f") -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def probe_table(summary: dict[str, Any]) -> str:
    rows = [ArchResult.from_json(a) for a in summary["archs"]]
    lines = ["| architecture | vLLM class | family | builds | starts | agrees | ratio | greedy = HF fp32 / bf16 | "
             "max Δlogprob vs fp32 / bf16 (HF's own bf16 noise) | s | why not |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r.probe
        yes = lambda b: "✓" if b else ("✗" if b is not None else "—")  # noqa: E731
        lines.append(f"| {r.model_type} | {r.vllm_class} | {r.family} | {yes(p.built)} | "
                     f"{yes(p.started) if p.built else '—'} | {yes(p.agrees) if p.started else '—'} | "
                     f"{_f(p.ratio)} | {p.greedy_fp32 or '—'} / {p.greedy_low or '—'} | "
                     f"{_f(p.max_lp_diff_fp32, '.3f')} / {_f(p.max_lp_diff_low, '.3f')} "
                     f"({_f(p.max_lp_noise, '.3f')}) | {p.seconds:.0f} | {_cell(_why_not(p))} |")
    lines.append("")
    lines.append(f"builds {summary['built']} · starts on vLLM-CPU {summary['started']} · agrees with HF "
                 f"{summary['agree']}")
    return "\n".join(lines)


def markdown_table(summary: dict[str, Any]) -> str:
    rows = [ArchResult.from_json(a) for a in summary["archs"]]
    if not summary.get("diagnoses", True):
        return probe_table(summary)
    lines = ["| architecture | vLLM class | probe | clean verdict | injected MLP: verdict, rank | injected attention "
             "projection: verdict, rank | s | not mapped / not compared |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r.probe
        probe_cell = ("agrees" if p.agrees else "differs" if p.started and p.agrees is False
                      else "does not start" if p.built else "does not build")
        if p.ratio is not None:
            probe_cell += f" (ratio {p.ratio:.2f})"
        mark = "" if r.passed else " ✗"
        lines.append(f"| {r.model_type}{mark} | {r.vllm_class} | {probe_cell} | {r.clean_verdict or '—'} | "
                     f"{_inj(r.mlp)} | {_inj(r.attn)} | {r.seconds:.0f} | {_cell(_not_mapped(r)) or '—'} |")
    lines.append("")
    lines.append(f"probe agrees {summary['agree']} · clean consistent {summary['clean_consistent']} · injected module "
                 f"at rank 1 {summary['injected_rank1']} · median {_f(summary['median_seconds'], '.0f')} s per "
                 f"architecture")
    for r in rows:
        for i in (r.mlp, r.attn):
            if i is not None and not i.passed:
                lines.append(f"- ✗ {r.model_type}: injected `{i.module}` → {i.verdict}, rank {i.rank or '—'}; rank 1 "
                             f"`{i.top or '—'}` (reference {', '.join(i.top_reference) or '—'})"
                             + (f" — {i.error}" if i.error else "")
                             + (f"\n  - mapping of `{i.module}`: {i.module_mapping}" if i.module_mapping else "")
                             + (f"\n  - mapping of `{i.top}`: {i.top_mapping}"
                                if i.top_mapping and i.top != i.module else ""))
        if r.clean_verdict not in (None, "consistent"):
            lines.append(f"- ✗ {r.model_type}: clean verdict {r.clean_verdict} (rank 1 `{r.clean_top or '—'}`)"
                         + (f"; missing: {'; '.join(r.missing)}" if r.missing else ""))
        if r.error:
            lines.append(f"- ✗ {r.model_type}: {r.error}")
    return "\n".join(lines)


def _why_not(p: Probe) -> str:
    words = clean_error(p.error)
    if p.vllm_reads_missing and p.built and not p.started:
        words += ("; " if words else "") + f"vLLM reads config attributes HF's lacks: {', '.join(p.vllm_reads_missing)}"
    return words


def _not_mapped(r: ArchResult) -> str:
    """The clean report's modules not compared (their reasons are in bench-archs.json), and what it could not
    observe."""
    names = [u.split(": ", 1)[0] for u in r.unmapped]
    return ", ".join(f"`{n}`" for n in names) + (f"; missing: {'; '.join(r.missing)}" if r.missing else "")


def _inj(i: Injected | None) -> str:
    if i is None:
        return "—"
    return f"{i.verdict}, rank {i.rank or '—'}" + ("" if i.passed else f" (top `{i.top or '—'}`)")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:240]
