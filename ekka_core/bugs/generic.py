"""Generic injected bugs, for any architecture (the architecture sweep, ``ekka bench --archs``): parametric names,
resolved by :func:`ekka_core.bugs.get` like the historical cases.

``scale-output:<module>:<factor>`` — after vLLM loads the model, the output of the module named ``<module>`` (vLLM's
name, e.g. ``model.layers.1.mlp``) is multiplied by ``<factor>`` on the first half of its features (a uniform scale
would vanish behind a norm): its first tensor where it returns a tuple (a vLLM
linear layer returns ``(out, bias)``, a decoder layer ``(hidden, residual)``).

Where it runs: the plugin (:mod:`ekka_core.capture.vllm_plugin`) calls the bug's ``inject`` at registration in every
vLLM process, before the model exists; ``inject`` wraps ``BaseModelLoader.load_model`` so that, once the model is
loaded, the named module's ``forward`` is replaced on that instance. The module's ``__call__``
(``nn.Module._call_impl``) runs its forward pre-hooks, then ``self.forward`` — the scaled one —, then its forward
hooks: Ekka's tracing hooks (:mod:`ekka_core.capture.vllm_tracing`, attached to the loaded model when tracing starts)
record the scaled output, and an untraced run computes with it just the same. Nothing is edited on disk.
"""

from __future__ import annotations

import re
from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.contracts.errors import BadInput

SCALE_OUTPUT = "scale-output"


def is_generic(name: str) -> bool:
    return name.startswith(SCALE_OUTPUT + ":")


def scale_output_name(module: str, factor: float) -> str:
    return f"{SCALE_OUTPUT}:{module}:{factor:g}"


def parse(name: str) -> tuple[str, float]:
    """``scale-output:<module>:<factor>`` → (module, factor); BadInput naming the form otherwise."""
    m = re.fullmatch(rf"{SCALE_OUTPUT}:([A-Za-z0-9_.]+):([-+0-9.eE]+)", name)
    if m is None:
        raise BadInput(f"bad generic bug name {name!r}",
                       fix=f"write {SCALE_OUTPUT}:<vLLM module name>:<factor>, e.g. "
                           f"{SCALE_OUTPUT}:model.layers.1.mlp:1.5")
    try:
        factor = float(m.group(2))
    except ValueError:
        raise BadInput(f"bad factor in {name!r}", fix="give the factor as a number, e.g. 1.5") from None
    return m.group(1), factor


def get(name: str) -> Bug:
    module, factor = parse(name)
    return Bug(name, "", f"output of {module} scaled by {factor:g} (generic injected bug)",
               "ekka_core/bugs/generic.py (not a historical bug)", rf"^{re.escape(module)}$",
               lambda: _inject_scale_output(module, factor), benchmark=False)


def scaled(output: Any, factor: float) -> Any:
    """``output`` with the first half of its first tensor's features multiplied by ``factor`` (a tuple or list keeps
    its other members). Half, not all: a uniform scale is invisible behind a norm — Gemma 2 and 3 normalise the MLP's
    and the attention's outputs (post-feedforward / post-attention norms), so a uniformly scaled block computes
    exactly what a correct one does."""
    import torch

    def half(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t[..., : max(t.shape[-1] // 2, 1)] *= factor
        return t

    if isinstance(output, torch.Tensor):
        return half(output)
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return type(output)([half(output[0]), *output[1:]])
    raise TypeError(f"cannot scale an output of type {type(output).__name__} (no leading tensor)")


def wrap_module(model: Any, module: str, factor: float) -> None:
    """Replace ``model``'s submodule ``module``'s forward (on that instance) by one that scales its output."""
    named = dict(model.named_modules())
    if module not in named:
        parent = module.rsplit(".", 1)[0] if "." in module else ""
        near = sorted(n for n in named if n.startswith(parent + ".") and n.count(".") == module.count("."))[:20]
        raise BadInput(f"injected bug: the vLLM model ({type(model).__name__}) has no module {module!r}",
                       fix=f"name one of its modules (near it: {', '.join(near) or 'none'})")
    target = named[module]
    original = target.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        return scaled(original(*args, **kwargs), factor)

    target.forward = forward
    target._ekka_injected = f"{SCALE_OUTPUT} ×{factor:g}"


def _inject_scale_output(module: str, factor: float) -> None:
    from ekka_core.bugs.vllm_access import _vllm

    loader = _vllm("vllm.model_executor.model_loader.base_loader", "BaseModelLoader")
    original = loader.load_model
    if getattr(original, "_ekka_scale_output", None) is not None:
        return          # already injected in this process

    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        model = original(self, *args, **kwargs)
        wrap_module(model, module, factor)
        return model

    load_model._ekka_scale_output = (module, factor)  # type: ignore[attr-defined]
    loader.load_model = load_model
