"""Source-location helpers shared by the report and the language server (light: no torch, no numpy)."""

from __future__ import annotations


def short_path(path: str | None) -> str:
    """``…/site-packages/vllm/x.py`` → ``vllm/x.py``: the part an engine developer recognises."""
    if not path:
        return "—"
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path
