"""Ekka's SGLang capture against the real ``sglang`` package's own Python sources (pinned release, fetched by
``scripts/setup.sh`` into ``.ekka-cache/sglang-src/<version>/`` — no network here, and sglang is never imported:
its modules need CUDA kernels and a long tail of server dependencies on import).

What is checked is derived from Ekka's own code where possible, so that a field or signature SGLang renames, or a
forward mode it adds, fails here: every ``ForwardBatch`` attribute :mod:`ekka_core.capture.sglang_tracing` reads,
every server argument :mod:`ekka_core.capture.sglang_runner` sets or refuses, the forward modes it classifies, the
scheduler-process entry, ``Engine.collective_rpc`` and the scheduler → worker → model-runner path.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest

from ekka_core.capture import sglang_runner, sglang_tracing

ROOT = Path(__file__).resolve().parents[2]
VERSION = os.environ.get("EKKA_SGLANG_VERSION", "0.5.23")


@pytest.fixture(scope="module")
def src() -> Path:
    base = Path(os.environ.get("EKKA_SGLANG_SRC_DIR") or ROOT / ".ekka-cache" / "sglang-src") / VERSION
    if not (base / "sglang" / "srt" / "server_args.py").exists():
        pytest.fail(f"the sglang {VERSION} sources are not in {base}: run `bash scripts/setup.sh` (it fetches them "
                    f"from PyPI once: scripts/fetch_sglang_sources.sh {VERSION} 'sglang/*.py')")
    assert "sglang" not in sys.modules
    return base / "sglang"


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    found = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name), None)
    assert found is not None, name
    return found


def _fields(cls: ast.ClassDef) -> set[str]:
    out = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    out |= {t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    return out


def _read_attributes(module_file: str, var: str) -> set[str]:
    """Attribute names Ekka's code reads from a variable: ``var.x`` and ``getattr(var, "x", …)``."""
    tree = _tree(Path(module_file))
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == var:
            out.add(n.attr)
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")
                and len(n.args) >= 2 and isinstance(n.args[0], ast.Name) and n.args[0].id == var
                and isinstance(n.args[1], ast.Constant)):
            out.add(n.args[1].value)
    return out


def test_forward_batch_has_every_field_ekka_reads(src: Path) -> None:
    read = _read_attributes(sglang_tracing.__file__, "forward_batch")
    assert {"forward_mode", "rids", "positions", "extend_seq_lens_cpu"} <= read       # the derivation works
    real = _fields(_class(_tree(src / "srt/model_executor/forward_batch_info.py"), "ForwardBatch"))
    # `extend_seq_lens` (a tensor) is the fallback for releases without the _cpu list; both exist in this one
    assert read - {"tolist"} <= real, f"renamed or removed in sglang {VERSION}: {sorted(read - real)}"


def test_every_forward_mode_is_classified_or_knowingly_refused(src: Path) -> None:
    cls = _class(_tree(src / "srt/model_executor/forward_batch_info.py"), "ForwardMode")
    members = {t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    handled = set(sglang_tracing._EXTEND_MODES) | set(sglang_tracing._DECODE_MODES) | set(sglang_tracing._IDLE_MODES)
    assert handled <= members, f"modes Ekka names that sglang {VERSION} lacks: {sorted(handled - members)}"
    # Modes Ekka refuses on purpose (a traced step it cannot lay out row by row says so); a new one fails here.
    refused = members - handled
    assert all(m.startswith(("TARGET_VERIFY", "DRAFT_EXTEND", "DUMMY_FIRST", "SPLIT_PREFILL", "PREBUILT",
                             "DLLM", "DECODE_", "EXTEND_")) for m in refused), sorted(refused)


def test_every_server_argument_ekka_sets_or_refuses_exists(src: Path) -> None:
    from ekka_core.contracts.spec import DiagnosisSpec
    from ekka_core.zoo import build_model

    sets = set(sglang_runner.engine_args(DiagnosisSpec(model=str(build_model("llama")), prompts=["x"])))
    refused = {c.value for n in ast.walk(_tree(Path(sglang_runner.__file__)))
               if isinstance(n, ast.FunctionDef) and n.name == "_refusal"
               for c in ast.walk(n) if isinstance(c, ast.Constant) and isinstance(c.value, str)
               and c.value.isidentifier() and c.value.islower() and "_" in c.value}
    assert {"disable_cuda_graph", "disable_radix_cache", "disable_overlap_schedule"} <= sets
    assert {"cuda_graph_config", "speculative_algorithm", "enable_dp_attention"} <= refused
    fields: set[str] = set()
    for f in [src / "srt/server_args.py", *sorted((src / "srt/arg_groups").rglob("*.py"))]:
        for cls in (n for n in ast.walk(_tree(f)) if isinstance(n, ast.ClassDef)):
            fields |= _fields(cls)
    # Refused for older releases only: 0.5.23 configures piecewise graphs through cuda_graph_backend_prefill
    # (refused too, and declared, as checked here).
    legacy = {"enable_piecewise_cuda_graph"}
    assert "cuda_graph_backend_prefill" in refused and legacy <= refused
    missing = sorted((sets | refused) - fields - legacy)
    assert not missing, f"server arguments Ekka uses that sglang {VERSION} does not declare: {missing}"


def test_scheduler_entry_rpc_and_model_runner_path(src: Path) -> None:
    engine = _class(_tree(src / "srt/entrypoints/engine.py"), "Engine")
    rpc = next(n for n in engine.body if isinstance(n, ast.FunctionDef) and n.name == "collective_rpc")
    assert [a.arg for a in rpc.args.args] == ["self", "method"] and rpc.args.kwarg is not None  # (method, **kwargs)
    assert any(isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "run_scheduler_process_func"
               for n in engine.body)
    scheduler = _tree(src / "srt/managers/scheduler.py")
    assert any(isinstance(n, ast.FunctionDef) and n.name == "run_scheduler_process" for n in scheduler.body)
    assigns = {ast.unparse(t) for n in ast.walk(_class(scheduler, "Scheduler")) if isinstance(n, ast.Assign)
               for t in n.targets}
    assert "self.tp_worker" in assigns                                   # sglang_tracing.model_runner_of
    worker = _class(_tree(src / "srt/managers/tp_worker.py"), "TpModelWorker")
    names = {n.name for n in worker.body if isinstance(n, ast.FunctionDef)} | _fields(worker)
    assert "model_runner" in names
    ps = {n.name for n in _tree(src / "srt/distributed/parallel_state.py").body if isinstance(n, ast.FunctionDef)}
    assert {"get_tensor_model_parallel_rank", "get_tensor_model_parallel_world_size"} <= ps
    gen = next(n for n in engine.body if isinstance(n, ast.FunctionDef) and n.name == "generate")
    assert {"input_ids", "sampling_params", "rid"} <= {a.arg for a in gen.args.args + gen.args.kwonlyargs}
