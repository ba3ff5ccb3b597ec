"""``python -m ekka_core.capture.run_process ROLE SPEC.json OUT [args]``: one capture run in a fresh process.

Started by :func:`ekka_core.capture.capture` (one process per run, so an engine crash or vLLM's process-wide
settings never reach the caller). A failure ends the process with its exit code (2 bad input, 3 internal failure)
and the error envelope (:meth:`~ekka_core.contracts.errors.EkkaError.envelope_line`) as the last line on stderr.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

from ekka_core.contracts.errors import EkkaError, internal_error
from ekka_core.contracts.spec import DiagnosisSpec


def main(argv: list[str]) -> int:
    role, spec_path, out = argv[0], Path(argv[1]), Path(argv[2])
    spec = DiagnosisSpec.from_json(json.loads(spec_path.read_text()))
    try:
        if role == "target":
            # argv[3]: {"args": engine arguments, "label", "trace": bool, "changes": [ConfigChange], and optionally
            # "forced": per request the tokens to sample, "forced_from": the label of the run that sampled them}
            run = json.loads(Path(argv[3]).read_text())
            if spec.target == "vllm":
                from ekka_core.capture import vllm_runner
                vllm_runner.run(spec, out, run["args"], label=run["label"], trace=run["trace"],
                                config_changes=run["changes"], forced=run.get("forced"),
                                forced_from=run.get("forced_from", ""))
            else:
                from ekka_core.capture import sglang_runner
                sglang_runner.run(spec, out)
        elif role == "reference":
            from ekka_core.capture import hf_runner
            threads = os.environ.get(REFERENCE_THREADS_ENV)
            if threads:                  # beside an engine run: the core the engine leaves free
                import torch
                torch.set_num_threads(int(threads))
            ids, lens, dtype = _fed_tokens(Path(argv[3]))
            fp32_out = Path(argv[4])
            # The low precision first: the fp32 trace is stored over it (its float32 tensors as bf16 differences:
            # half the bytes), and its weight sums serve the fp32 run too (they are of the bf16-rounded values, the
            # same for both copies of one checkpoint).
            sums = hf_runner.run(spec, ids, lens, dtype, "reference", out)["weight_sums"]
            hf_runner.run(spec, ids, lens, "float32", "reference-fp32", fp32_out, weight_sums=sums, delta_base=out)
        elif role == "score":
            from ekka_core.capture import hf_runner
            from ekka_core.contracts.serving import EngineOutputs
            hf_runner.reference_scores(spec, EngineOutputs.load(out)).save(out)
        else:
            raise ValueError(f"unknown role {role}")
    except EkkaError as e:
        print(e.envelope_line(), file=sys.stderr)
        return e.exit_code
    except Exception as e:  # noqa: BLE001 - report anything else as an internal failure with its traceback
        tb = traceback.format_exc()
        print(tb, file=sys.stderr)
        print(internal_error(e).envelope_line(traceback=tb), file=sys.stderr)
        return 3
    return 0


# The reference's torch threads when it runs beside an engine (``capture(beside=…)``).
REFERENCE_THREADS_ENV = "EKKA_REFERENCE_THREADS"


def _fed_tokens(target: Path) -> tuple[list[list[int]], list[int], str]:
    """What the engine fed the model, per request (the prompt and every generated token but the last), the prompt
    lengths and the dtype the engine really ran in: from its trace, or from an untraced run's ``outputs.json``."""
    from ekka_core.capture.trace import INDEX, Trace
    if (target / INDEX).exists() or not (target / "outputs.json").exists():
        run = Trace(target).run
        return run.token_ids, run.prompt_lens, run.dtype.removeprefix("torch.")
    from ekka_core.contracts.serving import EngineOutputs
    outputs = EngineOutputs.load(target)
    return [r.fed_token_ids for r in outputs.requests], [len(r.prompt_token_ids) for r in outputs.requests], outputs.dtype.removeprefix("torch.")


def _has_child_processes() -> bool:
    """Whether this process started processes that are still running (a tensor-parallel engine's workers): True
    when it cannot tell."""
    try:
        tasks = Path(f"/proc/{os.getpid()}/task")
        return any((t / "children").read_text().strip() for t in tasks.iterdir())
    except OSError:
        return True


def exit_now(code: int) -> None:
    """End the run. Everything it writes is on disk and closed when :func:`main` returns; what the interpreter's
    teardown still does (vLLM's atexit shutdown, freeing the KV cache, torch's thread pools) took 4.5 s of a 36 s
    engine run, measured, and writes nothing. So the process leaves at once — unless it has child processes (an
    engine's workers), which that shutdown is what stops."""
    sys.stdout.flush()
    sys.stderr.flush()
    if _has_child_processes():
        sys.exit(code)
    os._exit(code)


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))
