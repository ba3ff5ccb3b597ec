"""What the editor's re-run costs (issue 25): the real language server (``python -m server``, over stdio, driven by
pytest-lsp's client as the extension drives it) diagnoses a ``.ekka.toml`` of the tiny Llama in the served default
configuration three times in one session: first into an empty output directory, then unchanged (what "Diagnose"
again does after looking at the report), then after an edit of the spec's ``threshold`` (an analysis-only field:
every run and trace is reused, only the analysis runs again). Each figure is the time from the command to the
job's ``done`` state, as the editor sees it; the ratios are to the first, all in one sitting. Not a test.

    .venv/bin/python benchmarks/lsp_rerun_cost.py [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import attrs

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


def _spec_toml(model: str, threshold: float) -> str:
    from ekka_core import bugs
    from ekka_core.repro import to_toml
    return to_toml({"model": model, "prompts": list(bugs.DEFAULT_PROMPTS), "max_new_tokens": 4,
                    "threshold": threshold})


def _plain(obj: Any) -> Any:
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if hasattr(obj, "_asdict"):
        return {k: _plain(v) for k, v in obj._asdict().items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "__dict__"):
        return {k: _plain(v) for k, v in vars(obj).items()}
    return obj


async def _session(ws: Path, spec_file: Path, model: str, env: dict[str, str]) -> list[tuple[str, float, str]]:
    from lsprotocol import types
    from pygls.uris import from_fs_path
    from pytest_lsp import client_capabilities
    from pytest_lsp.client import make_test_lsp_client

    client = make_test_lsp_client()
    states: list[dict[str, Any]] = []
    known = client.protocol.get_message_type
    # ekka/* notifications as plain JSON, as in tests/server/test_server.py
    client.protocol.get_message_type = lambda m: _Raw if m.startswith("ekka/") else known(m)  # type: ignore

    @client.feature("ekka/jobState")
    def _state(params: Any) -> None:
        states.append(_plain(params))

    @client.feature("ekka/reportUpdated")
    def _report(params: Any) -> None:
        pass

    @client.feature(types.WORKSPACE_CODE_LENS_REFRESH)
    def _refresh(params: Any) -> None:     # the editor redraws its lenses; nothing to time
        return None

    await client.start_io(sys.executable, "-m", "server", env=env)
    await client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), root_uri=from_fs_path(str(ws)),
        workspace_folders=[types.WorkspaceFolder(uri=from_fs_path(str(ws)), name="ws")],
        initialization_options={"settings": {"interpreter": sys.executable}}))
    rows = []
    for label, threshold in (("first diagnosis (empty output directory)", 2.0),
                             ("the same spec again (unchanged)", 2.0),
                             ("after an edit of the spec's threshold (analysis only)", 2.5)):
        spec_file.write_text(_spec_toml(model, threshold))
        t0 = time.perf_counter()
        job = _plain(await client.workspace_execute_command_async(types.ExecuteCommandParams(
            command="ekka.server.diagnose", arguments=[{"uri": from_fs_path(str(spec_file))}])))["jobId"]
        while not any(s["jobId"] == job and s["state"] in ("done", "failed", "cancelled") for s in states):
            await asyncio.sleep(0.05)
        final = next(s for s in states if s["jobId"] == job and s["state"] in ("done", "failed", "cancelled"))
        rows.append((label, time.perf_counter() - t0, f"{final['state']}, {final.get('verdict')}"))
        print(f"{label}: {rows[-1][1]:.1f} s ({rows[-1][2]})", flush=True)
    await client.shutdown_session()
    return rows


@attrs.define
class _Raw:
    """An ekka/* notification kept as plain JSON (cattrs structures attrs classes; as tests/server/test_server.py)."""
    method: str
    jsonrpc: str
    params: Any = None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("ekka-out/lsp-rerun-cost"))
    a = ap.parse_args()
    from ekka_core.zoo import build_model

    model = str(build_model("llama"))
    shutil.rmtree(a.out, ignore_errors=True)
    ws = (a.out / "workspace").resolve()
    ws.mkdir(parents=True)
    spec_file = ws / "tiny.ekka.toml"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT),
           # caches of its own, filled by the first diagnosis: the re-runs' figures do not depend on earlier runs
           "VLLM_CACHE_ROOT": str((a.out / "vllm-cache").resolve()),
           "TORCHINDUCTOR_CACHE_DIR": str((a.out / "inductor-cache").resolve())}
    rows = asyncio.run(_session(ws, spec_file, model, env))
    first = rows[0][1]
    print("\n| diagnosis from the language server | s | × the first | job |\n|---|---|---|---|")
    for label, seconds, state in rows:
        print(f"| {label} | {seconds:.1f} | {seconds / first:.2f} | {state} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
