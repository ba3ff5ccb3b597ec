"""Target runner for SGLang. SGLang ships CUDA-only wheels: on a machine without a GPU it refuses clearly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ekka_core.errors import BadInput
from ekka_core.spec import DiagnosisSpec


def run(spec: DiagnosisSpec, out_dir: Path) -> dict[str, Any]:
    try:
        import sglang  # noqa: F401
    except ImportError:
        raise BadInput("SGLang is not installed in this environment (it needs a CUDA GPU)",
                       fix="run on a CUDA machine with sglang installed, or use --target vllm") from None
    raise BadInput("tracing SGLang is not implemented yet", fix="use --target vllm")
