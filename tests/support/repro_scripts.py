"""Writing a repro script for ekka_core.repro's tests, and loading what it imports back through a spec file."""

from __future__ import annotations

import textwrap
from pathlib import Path

from ekka_core.contracts.spec import DiagnosisSpec


def write_script(tmp_path: Path, source: str, name: str = "repro.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source).lstrip("\n"))
    return path


def roundtrip(tmp_path: Path, result) -> DiagnosisSpec:
    """``result.to_toml()`` written and loaded back with DiagnosisSpec.from_toml."""
    spec_file = tmp_path / "spec.ekka.toml"
    spec_file.write_text(result.to_toml())
    return DiagnosisSpec.from_toml(spec_file)
