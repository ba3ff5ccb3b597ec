"""vLLM engine configurations: the served one, the traced baseline, and the ones in between that triage tries.

The **served configuration** is the engine arguments the user runs with (a spec's ``engine_args``; ``{}`` is vLLM's
defaults: compiled, prefix caching on, chunked prefill on, many requests per step). The **traced baseline** is the
configuration hooks see everything in, and that isolates each request: eager (hooks do not fire inside a compiled
graph), no prefix cache (a cache hit's positions are never recomputed, hence never traced), every prompt in one
chunk, one request at a time. Between the two lie the :data:`~ekka_core.contracts.serving.FACTORS`: each is a group
of engine arguments with a baseline value and the value the served engine *resolved* (read from the running
engine's own config, not guessed from defaults). :func:`configuration` builds the arguments for the baseline plus
any subset of factors, and says which arguments differ from the served ones, and why.

Torch-free and engine-free: the pipeline and triage use it without importing vLLM.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from ekka_core.contracts.serving import FACTORS, ConfigChange
from ekka_core.contracts.spec import DiagnosisSpec

# vLLM-CPU's KV cache size, set by Ekka unless the user's environment sets it (GiB).
CPU_KVCACHE_GIB = 1

WHY = {
    "compilation": "hooks do not fire inside a torch.compile'd graph or CUDA-graph replay",
    "custom_ops": "eager's own custom-op selection (the traced baseline runs every op as eager mode does)",
    "prefix_caching": "a prefix-cache hit skips positions, which are then never computed (or traced) for that "
                      "request; the baseline computes every position of every request",
    "chunked_prefill": "every prompt is prefilled in one step (no chunk boundaries)",
    "batching": "requests run one at a time (no batch-composition effects)",
}


def served_args(spec: DiagnosisSpec, *, cpu: bool = True) -> tuple[dict[str, Any], list[ConfigChange]]:
    """The served configuration as ``LLM(**args)`` takes it: the spec's engine arguments, kept as given, plus the
    model, the diagnosis dtype (unless the user's own arguments name one) and a fixed seed — and what this machine
    forces on it, said out loud: on a CPU the KV cache is small, so ``max_model_len`` is bounded when the
    checkpoint's positions would not fit (vLLM refuses to start otherwise)."""
    args: dict[str, Any] = {"model": spec.model, "seed": 0}
    if spec.dtype != "auto":
        args["dtype"] = spec.dtype
    args.update(copy.deepcopy(spec.engine_args))
    if int(args.get("tensor_parallel_size", 1)) > 1:
        args.setdefault("distributed_executor_backend", "mp")
    changes: list[ConfigChange] = []
    bound = model_len_bound(spec.model) if cpu and "max_model_len" not in args else None
    if bound:
        changes.append(ConfigChange("max_model_len", None, bound,
                                    f"the checkpoint allows {checkpoint_positions(spec.model)} positions, the CPU KV "
                                    f"cache ({CPU_KVCACHE_GIB} GiB) holds {bound} per sequence"))
        args["max_model_len"] = bound
    return args, changes


def model_len_bound(model: str) -> int | None:
    """The longest sequence a checkpoint supports that also fits Ekka's CPU KV cache (None: no bound needed or not
    knowable). vLLM itself defaults ``max_model_len`` to the checkpoint's positions but refuses to start when the
    KV cache cannot hold one such sequence; a tiny-KV-cache CPU run then needs the smaller of the two."""
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    config = config.get("text_config", config)
    positions = config.get("max_position_embeddings")
    layers = config.get("num_hidden_layers")
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or (config.get("hidden_size", 0) // heads if heads else None)
    if not (positions and layers and kv_heads and head_dim):
        return None
    per_token = 2 * layers * kv_heads * head_dim * 4        # K and V, fp32 at worst
    fits = (CPU_KVCACHE_GIB << 30) // per_token
    return None if positions <= fits else int(fits // 128 * 128)


def checkpoint_positions(model: str) -> int | None:
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config.get("text_config", config).get("max_position_embeddings")


def factor_values(resolved: dict[str, Any]) -> dict[str, Any]:
    """The value of each factor in a resolved engine configuration (see :func:`resolved_config` in the runner)."""
    return {
        "compilation": {"mode": resolved.get("compilation_mode"), "backend": resolved.get("compilation_backend"),
                        "enforce_eager": resolved.get("enforce_eager")},
        "custom_ops": list(resolved.get("custom_ops") or []),
        "prefix_caching": bool(resolved.get("enable_prefix_caching")),
        "chunked_prefill": resolved.get("max_num_batched_tokens"),
        "batching": resolved.get("max_num_seqs"),
    }


def configuration(served: dict[str, Any], served_resolved: dict[str, Any] | None, keep: set[str] | list[str] = (),
                  ) -> tuple[dict[str, Any], list[ConfigChange]]:
    """Engine arguments for the traced baseline with the factors in ``keep`` left as served (``served_resolved``:
    what the served engine resolved, needed to carry ``custom_ops`` over to an eager run), and every argument that
    differs from the served configuration with the reason. ``keep`` may name ``compilation`` only for untraced runs.
    """
    keep = set(keep)
    unknown = keep - set(FACTORS)
    if unknown:
        raise ValueError(f"unknown configuration factors {sorted(unknown)}")
    args = copy.deepcopy(served)
    changes: list[ConfigChange] = []
    compilation = args.get("compilation_config")
    if isinstance(compilation, int):
        compilation = {"mode": compilation}
    compilation = dict(compilation or {})
    resolved = factor_values(served_resolved or {})

    # An argument the user left unset is shown with the value the served engine resolved it to.
    resolved_as = {"enforce_eager": "enforce_eager", "compilation_config.mode": "compilation_mode",
                   "enable_prefix_caching": "enable_prefix_caching",
                   "max_num_batched_tokens": "max_num_batched_tokens", "max_num_seqs": "max_num_seqs",
                   "compilation_config.custom_ops": "custom_ops"}

    def change(arg: str, value: Any, factor: str) -> None:
        was = _get(served, arg)
        if was is None and served_resolved and arg in resolved_as:
            was = served_resolved.get(resolved_as[arg])
        if was != value:
            changes.append(ConfigChange(arg, was, value, WHY[factor]))

    if "compilation" not in keep:
        change("enforce_eager", True, "compilation")
        args["enforce_eager"] = True
        change("compilation_config.mode", 0, "compilation")
        compilation["mode"] = 0
    if "custom_ops" in keep:
        # The served engine's own selection, made explicit: under compilation vLLM resolves it to ["none"] (every
        # custom op runs forward_native); an eager run would otherwise pick ["all"].
        ops = resolved["custom_ops"] or compilation.get("custom_ops")
        if ops is not None and "compilation" not in keep:
            if compilation.get("custom_ops") != ops:
                changes.append(ConfigChange("compilation_config.custom_ops", compilation.get("custom_ops"), ops,
                                            "the served engine's custom-op selection, carried over to an eager run"))
            compilation["custom_ops"] = list(ops)
    else:
        if "custom_ops" in compilation or "compilation" in keep:
            change("compilation_config.custom_ops", ["all"], "custom_ops")
            compilation["custom_ops"] = ["all"]
    if "prefix_caching" not in keep:
        change("enable_prefix_caching", False, "prefix_caching")
        args["enable_prefix_caching"] = False
    if "chunked_prefill" not in keep:
        # A budget of one whole sequence: no prompt is ever split (and vLLM's profiling run stays that size).
        budget = int((served_resolved or {}).get("max_model_len") or args.get("max_model_len")
                     or checkpoint_positions(str(args.get("model", ""))) or 8192)
        change("max_num_batched_tokens", budget, "chunked_prefill")
        args["max_num_batched_tokens"] = budget
    if "batching" not in keep:
        change("max_num_seqs", 1, "batching")
        args["max_num_seqs"] = 1
    args["compilation_config"] = compilation
    return args, changes


def _get(args: dict[str, Any], dotted: str) -> Any:
    head, _, rest = dotted.partition(".")
    value = args.get(head)
    if rest:
        if isinstance(value, int) and rest == "mode":
            return value
        return (value or {}).get(rest) if isinstance(value, dict) else None
    return value


def traced_baseline(model: str) -> dict[str, Any]:
    """The traced baseline's engine arguments for ``model``: a served configuration equal to it needs no run of its
    own (one engine run serves both the symptom check and the trace)."""
    args, _ = configuration({"model": model}, None)
    return {k: v for k, v in args.items() if k != "model"}
