"""The proof that the three traces describe the same computation, before anything is compared: complete traces of
one model, the same token ids, embeddings equal, and layer *i*'s output is layer *i+1*'s input in each framework."""

from __future__ import annotations

import torch

from ekka_core.align.rows import Rows, gather_rows, rows_of
from ekka_core.align.traces import AlignmentError, Traces
from ekka_core.capture.trace import Trace
from ekka_core.contracts.errors import BadInput
from ekka_core.mapping import Endpoint


def prove_alignment(traces: Traces) -> None:
    t, r, y = traces.target, traces.reference, traces.reference_fp32
    for tr in (t, r, y):
        if not tr.run.complete:
            raise BadInput(f"trace {tr.dir} is incomplete ({tr.run.failure or 'cut short'})",
                           fix="re-run the capture (`--fresh`); the partial trace is kept for inspection")
    if r.run.model != t.run.model or y.run.model != t.run.model:
        raise BadInput(f"the traces are of different models: target {t.run.model}, reference {r.run.model}, "
                       f"fp32 reference {y.run.model}", fix="capture all three runs from the same model")
    for name, other in (("reference", r), ("fp32 reference", y)):
        if len(other.run.token_ids) != len(t.run.token_ids):
            raise BadInput(f"the target ran {len(t.run.token_ids)} sequences, the {name} "
                           f"{len(other.run.token_ids)}", fix="capture all runs from the same prompts")
        for i, (a, b) in enumerate(zip(t.run.token_ids, other.run.token_ids)):
            if a != b:
                at = next((j for j, (u, v) in enumerate(zip(a, b)) if u != v), min(len(a), len(b)))
                raise BadInput(f"sequence {i}: the {name} was fed different tokens than the target from position "
                               f"{at} (lengths {len(b)} vs {len(a)})",
                               fix="teacher-force the reference on the target's tokens (re-run with --fresh)")
    _prove_embeddings_equal(t, r)
    t.stream_summed = stream_summed(t)
    for tr in (t, r):
        _prove_layer_chain(tr)


def stream_summed(trace: Trace) -> bool:
    """Whether the engine's decoder layers return (delta, residual) — the stream is their sum — or the stream itself
    first, read from the trace alone: the model's final norm normalises the stream leaving the last layer, so its
    output is an affine function, feature by feature, of that stream normalised (RMS or mean/variance). The
    reconstruction the norm's output fits is the engine's convention. Undecided (no final norm traced, or neither
    fits clearly better): summed, the vLLM convention of most models."""
    layers = _decoder_layers(trace)
    if not layers:
        return True
    last = trace.calls_of(layers[-1])[-1]
    norm = next((c.module for c in trace.calls[last.index + 1:] if "Norm" in c.cls and not _in_layer(c.module)),
                None)
    if norm is None:
        return True
    summed = gather_rows(trace, Endpoint([layers[-1]], select="stream"))
    first = gather_rows(trace, Endpoint([layers[-1]], select="first"))
    normed = gather_rows(trace, Endpoint([norm], select="first"))
    keys = sorted(set(summed) & set(normed))
    if not keys or summed[keys[0]].shape != normed[keys[0]].shape:
        return True
    y = torch.stack([normed[k] for k in keys]).double()
    fit_summed = _norm_fit(torch.stack([summed[k] for k in keys]).double(), y)
    fit_first = _norm_fit(torch.stack([first[k] for k in keys]).double(), y)
    return not (fit_first < 0.05 and fit_first * 4 < fit_summed)


def _norm_fit(stream: torch.Tensor, normed: torch.Tensor) -> float:
    """How well ``normed`` is w ⊙ normalise(stream) + b (per-feature least squares, the better of RMS and
    mean/variance normalisation): the relative residual."""
    best = float("inf")
    for centre in (False, True):
        x = stream - stream.mean(-1, keepdim=True) if centre else stream
        x = x / x.pow(2).mean(-1, keepdim=True).clamp_min(1e-30).sqrt()
        xm, ym = x.mean(0), normed.mean(0)
        w = ((x - xm) * (normed - ym)).sum(0) / (x - xm).pow(2).sum(0).clamp_min(1e-30)
        fit = w * (x - xm) + ym
        best = min(best, float((normed - fit).norm() / normed.norm().clamp_min(1e-30)))
    return best


def _decoder_layers(trace: Trace) -> list[str]:
    return sorted({c.module for c in trace.calls if c.module.rsplit(".", 1)[-1].isdigit()
                   and (c.cls.endswith("DecoderLayer") or c.cls.endswith("Block"))},
                  key=lambda m: int(m.rsplit(".", 1)[-1]))


def _in_layer(module: str) -> bool:
    return any(part.isdigit() for part in module.split("."))


def _first_output(trace: Trace, module: str) -> Rows | None:
    if not trace.calls_of(module):
        return None
    return rows_of(trace, Endpoint([module]))


def _prove_embeddings_equal(t: Trace, r: Trace) -> None:
    """An embedding lookup is a copy: the same token ids must give the same rows (up to the normaliser some
    engines fold into the parent's forward, and one rounding of it)."""
    name = next((c.module for c in t.calls if c.module.endswith("embed_tokens")), None)
    if name is None:
        return
    a, b = _first_output(t, name), _first_output(r, name)
    if a is None or b is None:
        return
    scale = t.run.declared.get("embedding_normalizer")
    # The rows both traces hold (all of them, unless the capture was restricted to some token positions).
    common = sorted(set(a.index) & set(b.index))
    ta, tb = a.take(common), b.take(common)
    if tb.shape != ta.shape:
        raise BadInput(f"embeddings have different shapes: target {list(ta.shape)}, reference {list(tb.shape)}",
                       fix="the traces are of different models; capture both from the same checkpoint")
    if scale and not torch.allclose(ta, tb, rtol=1e-2, atol=1e-6):
        ta = ta * scale
    err = (ta - tb).norm() / tb.norm().clamp_min(1e-12)
    if err > 2e-2:
        # A constant the engine folds into the parent's forward where the reference's module applies it (MiniCPM's
        # scale_emb, declared nowhere): the rows are proportional. Measured, it becomes the pair's scale.
        factor = float((ta * tb).sum() / (ta * ta).sum().clamp_min(1e-30))
        if abs(factor - 1) > 1e-3 and float((ta * factor - tb).norm() / tb.norm().clamp_min(1e-12)) <= 2e-2:
            t.embedding_scale = (name, factor)
            return
        raise BadInput(f"embedding proof failed: {name} differs between target and reference on the same token "
                       f"ids (relative difference {err:.3g})",
                       fix="the traces are of different models or different weights; capture both from one checkpoint")


def _prove_layer_chain(trace: Trace) -> None:
    """Within one framework, layer i's output is layer i+1's input: checks the stream reconstruction."""
    layers = [m for m in _decoder_layers(trace) if trace.calls_of(m)[0].cls.endswith("DecoderLayer")]
    for a, b in zip(layers, layers[1:]):
        out = gather_rows(trace, Endpoint([a], select="stream"))
        inp = gather_rows(trace, Endpoint([b], port="input", select="stream"))
        keys = sorted(set(out) & set(inp))
        if not keys:
            continue
        o = torch.stack([out[k] for k in keys])
        i = torch.stack([inp[k] for k in keys])
        err = (o - i).norm() / i.norm().clamp_min(1e-12)
        if err > 1e-2:
            raise AlignmentError(f"alignment proof failed in the {trace.run.framework} trace: the output of {a} "
                                 f"is not the input of {b} (relative difference {err:.3g}); the residual stream "
                                 f"is not reconstructed correctly for this architecture")
