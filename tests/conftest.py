"""Shared fixtures: a persistent zoo cache under the repository, and a factory that builds zoo models into it."""

from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# Test doubles and fixtures shared by several stages' tests (fake Anthropic server, fake SGLang, private sshd).
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))


@pytest.fixture(scope="session")
def zoo_dir() -> Path:
    """EKKA_ZOO_DIR for the whole session: ``.ekka-cache/zoo`` under the repository (git-ignored), so a second
    test run reuses the models the first one built. Restored afterwards."""
    path = REPO_ROOT / ".ekka-cache" / "zoo"
    path.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get("EKKA_ZOO_DIR")
    os.environ["EKKA_ZOO_DIR"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("EKKA_ZOO_DIR", None)
    else:
        os.environ["EKKA_ZOO_DIR"] = previous


@pytest.fixture(scope="session")
def zoo_model(zoo_dir: Path) -> Callable[..., Path]:
    """``zoo_model(arch, **overrides)`` → directory of the cached tiny checkpoint for ``arch``."""
    from ekka_core.zoo import build_model

    def make(arch: str, **overrides: Any) -> Path:
        return build_model(arch, overrides=overrides or None, root=zoo_dir)

    return make


@pytest.fixture(scope="session")
def clean_diagnosis(zoo_model, tmp_path_factory) -> Callable[[str, str], tuple[int, Path]]:
    """``clean_diagnosis(arch, dtype)`` → (exit code, OUTDIR) of ``ekka diagnose --spec`` on the clean zoo model, run
    once per (arch, dtype) per session through the real CLI and shared by the tests that inspect it.

    The spec is a scenario as users send it: two prompts of different lengths together, then a chat conversation
    (rendered by each framework's own chat template). bf16 is served eager (the symptom check runs it as served:
    prefix caching, chunked prefill and batching on; the trace runs the isolated baseline); fp32 is served as the
    traced baseline (one engine run: those tests check the aligners, not the served features)."""
    import subprocess
    import sys

    from ekka_core.capture.vllm_config import traced_baseline
    from ekka_core.repro import to_toml

    # Shared by every pytest-xdist worker of this session (their basetemps are siblings): the first worker to ask for
    # an (arch, dtype) runs it under a lock, the others wait for it and read its exit code.
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    shared = shared / "clean-diagnoses"
    shared.mkdir(parents=True, exist_ok=True)

    def run(arch: str, dtype: str) -> tuple[int, Path]:
        out = shared / f"clean-{arch}-{dtype}"
        with open(shared / f"{arch}-{dtype}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            done = out / "exit-code.json"
            if not done.exists():
                out.mkdir(exist_ok=True)
                spec = out / "clean.ekka.toml"
                model = str(zoo_model(arch))
                # bf16 is served as users serve (eager, the rest vLLM's defaults): symptom check, then the trace.
                # The fp32 runs check the aligners pair by pair: served as the traced baseline (one engine run).
                served = {"enforce_eager": True} if dtype == "bfloat16" else traced_baseline(model)
                spec.write_text(to_toml({"model": model, "dtype": dtype, "max_new_tokens": 3,
                                         "engine_args": served, "requests": CLEAN_REQUESTS}))
                cmd = [sys.executable, "-m", "ekka_core.cli", "diagnose", "--spec", str(spec), "--out", str(out)]
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
                (out / "cli.log").write_text(proc.stdout + proc.stderr)
                done.write_text(json.dumps(proc.returncode))
            return json.loads(done.read_text()), out

    return run


# Two prompts of different lengths in one batch; the first is longer than the zoo's sliding window (16).
CLEAN_PROMPTS = [
    "Once upon a time there was a small model that learned to count, to rhyme and to tell long stories. "
    "The capital of France is Paris.",
    "Sliding window attention only sees",
]
CLEAN_MESSAGES = [{"role": "system", "content": "You answer in one short sentence."},
                  {"role": "user", "content": "What is the capital of France?"}]
CLEAN_REQUESTS = [{"id": "a", "prompt": CLEAN_PROMPTS[0]}, {"id": "b", "prompt": CLEAN_PROMPTS[1]},
                  {"id": "chat", "messages": CLEAN_MESSAGES, "after": "a"}]
