"""Where a module's source file is, without importing anything (SGLang's CUDA-only models locate on a CPU box)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Iterable


def module_name_for(path: str | Path, roots: Iterable[str | Path] = ()) -> str | None:
    """Dotted module name of ``path``: relative to the first root that contains it, else from the chain of
    ``__init__.py`` files above it, else ``None``."""
    p = Path(path).resolve()
    for root in roots:
        r = Path(root).resolve()
        try:
            rel = p.relative_to(r)
        except ValueError:
            continue
        parts = list(rel.with_suffix("").parts)
        if parts and parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts) or None
    parts = [] if p.name == "__init__.py" else [p.stem]
    d = p.parent
    while (d / "__init__.py").is_file():
        parts.insert(0, d.name)
        d = d.parent
    if len(parts) == 1 and not (p.parent / "__init__.py").is_file() and p.name != "__init__.py":
        return None
    return ".".join(parts) or None


def locate_source_of(module_qualname: str, search_paths: Iterable[str | Path] | None = None) -> Path | None:
    """File of ``module_qualname`` (``vllm.model_executor.models.llama`` → ``…/vllm/model_executor/models/llama.py``)
    without importing anything. ``search_paths`` are directories that hold top-level packages (like ``sys.path``
    entries, or the SGLang source cache); without them the top-level package is found with
    ``importlib.util.find_spec`` (which, for a top-level name, runs no package code), then ``sys.path``.
    Packages without ``__init__.py`` (namespace packages, a partial source extract) are walked too."""
    parts = [p for p in module_qualname.split(".") if p]
    if not parts:
        return None
    starts: list[Path] = []
    if search_paths is not None:
        starts = [Path(s) / parts[0] for s in search_paths]
    else:
        try:
            spec = importlib.util.find_spec(parts[0])
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            if spec.submodule_search_locations:
                starts.extend(Path(loc) for loc in spec.submodule_search_locations)
            elif spec.origin and spec.origin not in ("built-in", "frozen") and len(parts) == 1:
                return Path(spec.origin)
        starts.extend(Path(s or ".") / parts[0] for s in sys.path)
    for start in starts:
        if len(parts) == 1:
            if (start / "__init__.py").is_file():
                return start / "__init__.py"
            if start.with_suffix(".py").is_file():
                return start.with_suffix(".py")
            continue
        d = start
        for part in parts[1:-1]:
            d = d / part
        leaf = d / parts[-1]
        if leaf.with_suffix(".py").is_file():
            return leaf.with_suffix(".py")
        if (leaf / "__init__.py").is_file():
            return leaf / "__init__.py"
    return None
