"""The graphs vLLM compiles, localised on the values its first real step feeds them — for compile-only divergences.

``EKKA_GRAPH_DIR=DIR`` (set by Ekka's plugin in the engine process): Inductor's ``compile_fx`` is wrapped, so every
graph the engine hands Inductor (vLLM-CPU: the whole model, traced once by Dynamo; vLLM's own piecewise backend on
CUDA compiles through it too) keeps its Dynamo graph and config patches, and its compiled callable is wrapped. At the
engine's first real ``execute_model`` (warm-up passes never get there) the first call of each compiled graph runs as
compiled, and then the graph is localised *right there*, inside the model's forward: its attention calls need the
step's forward context, and graphs and tensors never leave the process, so nothing is pickled.
``DIR/graph_localisation.json`` is written.

What replay costs: the eager and compiled re-runs of each piece write the KV cache slots of this step again (with the
values of the last re-run), so the tokens this run samples after its first step are not the served run's — this run
is a localisation, never the symptom check.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

GRAPH_DIR_ENV = "EKKA_GRAPH_DIR"
GRAPH_THRESHOLD_ENV = "EKKA_GRAPH_THRESHOLD"     # the spec's threshold (limits are never below the noise model's)
RESULT_FILE = "graph_localisation.json"

_armed = False
_dtype = "bfloat16"      # the model's dtype, from the runner that armed the step
_localising = False      # our own replay compiles through the same entry: those graphs are not the engine's
# Each graph's localisation, with a module it was traced through (path, class) to find its engine name by.
_results: list[tuple[Any, tuple[str, str] | None]] = []


def install(directory: Path) -> None:
    """Wrap Inductor's entry and vLLM's model runner in this process, and keep vLLM's compile cache off: a graph
    loaded from it never reaches Inductor, so there would be no graph to localise."""
    import torch._inductor.compile_fx as inductor_entry

    os.environ["VLLM_DISABLE_COMPILE_CACHE"] = "1"
    from ekka_core.capture import vllm_compat

    compile_fx = inductor_entry.compile_fx

    def recording_compile_fx(gm: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
        compiled = compile_fx(gm, example_inputs, *args, **kwargs)
        if _localising:
            return compiled
        return _LocalisedOnFirstStep(compiled, gm, dict(kwargs.get("config_patches") or {}), directory)

    inductor_entry.compile_fx = recording_compile_fx

    runner_class = vllm_compat.model_runner_class()
    execute = runner_class.execute_model

    def execute_model(runner: Any, *args: Any, **kwargs: Any) -> Any:
        global _armed, _dtype
        first = not getattr(runner, "_ekka_graphs_done", False)
        if first:
            runner._ekka_graphs_done = True
            _dtype = str(runner.model_config.dtype).removeprefix("torch.")
            _armed = True
        try:
            return execute(runner, *args, **kwargs)
        finally:
            if first:
                _armed = False
                _write(directory, _dtype, _model_of(runner))

    runner_class.execute_model = execute_model


class _LocalisedOnFirstStep:
    """A compiled graph that, on its first call in the armed step, runs as compiled and is then localised. Every
    other attribute is the compiled graph's (vLLM asks it for ``serialize`` and the like)."""

    def __init__(self, compiled: Any, gm: Any, patches: dict[str, Any], directory: Path) -> None:
        self._compiled, self._gm, self._patches, self._directory = compiled, gm, patches, directory
        self._done = False

    def __call__(self, *args: Any) -> Any:
        out = self._compiled(*args)
        if _armed and not self._done:
            self._done = True
            _localise(self._gm, [_kept(a) for a in args], self._patches, self._directory)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._compiled, name)


def _kept(value: Any) -> Any:
    """An argument as it was: activations are copied (vLLM reuses their buffers), weights are kept by reference."""
    import torch

    if isinstance(value, torch.nn.Parameter) or not isinstance(value, torch.Tensor):
        return value
    return value.detach().clone()


def _localise(gm: Any, inputs: list[Any], patches: dict[str, Any], directory: Path) -> None:
    global _localising
    from ekka_core.graph import localise_in_graph

    _localising = True
    try:
        result = localise_in_graph(gm, inputs, dtype=_dtype, config_patches=patches,
                                   threshold=float(os.environ.get(GRAPH_THRESHOLD_ENV, "2.0")))
        _results.append((result, _traced_anchor(gm)))
    finally:
        _localising = False


def _traced_anchor(gm: Any) -> tuple[str, str] | None:
    """One module the graph was traced through, as (its path below the traced root, its class name): the first
    node's innermost ``nn_module_stack`` entry (Dynamo leaves the root itself out of the stack)."""
    from ekka_core.graph.pieces import module_path

    for node in gm.graph.nodes:
        found = module_path(node)
        if found and found[0] and found[1]:
            return found[0], found[1]
    return None


def _model_of(runner: Any) -> Any:
    get = getattr(runner, "get_model", None)
    try:
        return get() if callable(get) else getattr(runner, "model", None)
    except Exception:       # noqa: BLE001 — a runner without its model loaded: module paths stay graph-relative
        return None


def _engine_name(model: Any, anchor: tuple[str, str] | None) -> str:
    """The engine's path of the module the graph was traced from (vLLM compiles ``LlamaModel``, the top model's
    ``model``): the shortest module path below which the anchor's path names a module of the anchor's class; ""
    when that is the top model itself or it cannot be found."""
    if model is None or anchor is None:
        return ""
    path, cls = anchor
    found = []
    for name, _module in model.named_modules():
        try:
            below = model.get_submodule(f"{name}.{path}" if name else path)
        except AttributeError:
            continue
        if type(below).__name__ == cls:
            found.append(name)
    return min(found, key=len) if found else ""


def _write(directory: Path, dtype: str, model: Any = None) -> None:
    """The first compiled graph's localisation that found a departure, else the first one; none ran: said so.
    Module paths are the engine's own (prefixed with the traced module's name in the model)."""
    from ekka_core.contracts.graph import GraphLocalisation
    from ekka_core.contracts.jsonable import to_json

    if _results:
        found, anchor = next((pair for pair in _results if pair[0].departs), _results[0])
        result = found.rooted(_engine_name(model, anchor))
    else:
        result = GraphLocalisation.unreplayable("no compiled graph ran in the engine's first step (compilation off, "
                                                "or the graphs were loaded from the compile cache without Inductor)",
                                                dtype=dtype)
    result.notes += ["vLLM's compile cache was off for this run (VLLM_DISABLE_COMPILE_CACHE=1), so its graph was "
                     "compiled and could be split", "the first step's KV cache slots were written again by the "
                     "replays: tokens sampled after it are not the served run's"]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / RESULT_FILE).write_text(json.dumps(to_json(result), indent=1))
