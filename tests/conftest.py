"""Shared fixtures: a persistent zoo cache under the repository, and a factory that builds zoo models into it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


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
