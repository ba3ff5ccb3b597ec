"""How the injections reach vLLM: only through :mod:`ekka_core.capture.vllm_compat`, imported when an injection
runs and never when this package is imported (:mod:`ekka_core.capture.vllm_plugin` imports the registry, so a
module-level import back into ``ekka_core.capture`` would make the two packages a cycle).

Every injection patches vLLM internals by name; :func:`_vllm` fails with a clear message when this vLLM release
lacks one, instead of silently injecting nothing.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any


def vllm_compat() -> ModuleType:
    """:mod:`ekka_core.capture.vllm_compat`, the compatibility layer (imported on first use)."""
    from ekka_core.capture import vllm_compat as compat

    return compat


def _vllm(module_name: str, *attrs: str) -> Any:
    """The vLLM internal an injection patches (a module, or an attribute path inside it), through the compatibility
    layer: a release that lacks it fails with one clear line instead of silently injecting nothing."""
    return vllm_compat().resolve(".".join((module_name, *attrs)))


def force_kwargs(module_name: str, attr: str, **forced: Any) -> None:
    """Make a model file call ``attr`` (a factory or class it imported: ``get_rope``, ``FusedMoEFactory``,
    ``LogitsProcessor``) with some keyword arguments forced — a value, or a function of the one passed: the model file
    is where these bugs lived."""
    mod = _vllm(module_name)
    original = getattr(mod, attr)

    def call(*args: Any, **kwargs: Any) -> Any:
        for key, value in forced.items():
            kwargs[key] = value(kwargs.get(key)) if callable(value) else value
        return original(*args, **kwargs)

    setattr(mod, attr, call)


def _wrap_get_rope(module_name: str, **forced: Any) -> None:
    """Make a model file's ``get_rope`` ignore part of the config."""
    force_kwargs(module_name, "get_rope", **forced)
