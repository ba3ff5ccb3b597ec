"""One re-injectable bug case: where it comes from, what it is served with, what a correct diagnosis must say."""

from __future__ import annotations

import functools
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


@dataclass
class Bug:
    name: str
    arch: str
    title: str
    source: str
    expected: str                     # regex the rank-1 suspect's module path must match ("" for inputs-differ)
    inject: Callable[[], None]
    zoo_overrides: dict[str, Any] = field(default_factory=dict)
    dtype: str = "bfloat16"
    prompts: list[str] = field(default_factory=list)
    benchmark: bool = True            # False: a fault for tests, not a historical bug
    # What the case sends and how it is served (DiagnosisSpec fields): chat messages, a request scenario
    # (RequestSpec fields: id, prompt | messages | prompt_token_ids, after, max_new_tokens), the served
    # configuration (engine_args; {} = vLLM's defaults: compiled, prefix caching, chunked prefill).
    messages: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    engine_args: dict[str, Any] = field(default_factory=dict)
    max_new_tokens: int | None = None
    expected_verdict: str = "divergent"          # or "inputs-differ"
    expected_rank: int = 1                       # the expected module must be within this rank
    expected_culprit: list[str] | None = None    # triage factors (contracts.serving.FACTORS) the case must name
    expected_words: str = ""                     # regex the matching suspect's evidence must contain
    # The kind the matching suspect must have ("" = any): "rows" also needs the rows named and the module's pooled
    # error ratio under the report's threshold (the point of a row-level case); "non-finite" needs NaN/Inf counted.
    expected_kind: str = ""

    def __post_init__(self) -> None:
        self.inject = _with_a_compile_cache_of_its_own(self.name, self.inject)


def _with_a_compile_cache_of_its_own(name: str, inject: Callable[[], None]) -> Callable[[], None]:
    """Run ``inject`` in a process whose vLLM compile cache is this injection's alone.

    The AOT compile cache (on by default with torch ≥ 2.10) is keyed by the configuration, not by what is patched:
    a clean and an injected run of one model would share a cache directory (measured), and a load re-checks only
    the source files the cached graph was traced through — so a clean graph could serve an injected run (the bug
    silently absent) and an injected one a clean run. Disabling the cache for injected runs made every benchmark
    run compile again; a cache root of its own, named by the injection and the sources of every injection
    (``ekka_core/bugs``: an edited case is a new cache), lets the same injection reuse its own graph and never
    another's. Called at plugin registration, before vLLM reads the variable (its env cache is enabled later, when
    the engine core starts).

    What is not the compiled graph stays shared with the user's root: vLLM's ``modelinfos`` (each model class's
    capabilities, checked against the hash of its source file before use) — inspecting a class again costs a
    subprocess that imports vLLM, 10 s of every injected case's first run (measured) — and the kernels Inductor
    names by their text (``vllm_compat.share_inductor_kernels``, whose directory the engine run chose before)."""
    @functools.wraps(inject)
    def run() -> None:
        from ekka_core.capture import vllm_compat
        base = Path(vllm_compat.envs_module().VLLM_CACHE_ROOT)     # vLLM's own default (XDG_CACHE_HOME …) or the user's
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80]
        root = base / "ekka-injected" / f"{safe}-{_injection_sources_hash()}"
        _share_model_infos(base, root)
        os.environ["VLLM_CACHE_ROOT"] = str(root)
        inject()

    return run


def _share_model_infos(base: Path, root: Path) -> None:
    """``root/modelinfos`` is the user's ``base/modelinfos`` (a link); left as it is where it already exists."""
    shared, own = base / "modelinfos", root / "modelinfos"
    if own.exists() or own.is_symlink():
        return
    try:
        shared.mkdir(parents=True, exist_ok=True)
        root.mkdir(parents=True, exist_ok=True)
        own.symlink_to(shared, target_is_directory=True)
    except OSError:        # FileExistsError: another run of this injection linked it first; else vLLM's to report
        pass


@functools.lru_cache(maxsize=1)
def _injection_sources_hash() -> str:
    h = hashlib.sha256()
    root = Path(__file__).parent
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]
