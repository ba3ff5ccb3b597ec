"""The graph Dynamo captures for a module call, with the real inputs it was called with — what the engine's backend
receives when it compiles (here for an HF model or any ``nn.Module``; in an engine, its own backend hands it over).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx


def dynamo_graph(module: torch.nn.Module, *args: Any, **kwargs: Any) -> tuple[fx.GraphModule, list[Any]]:
    """One full graph of ``module(*args, **kwargs)`` with static shapes, and the values its placeholders took."""
    captured: list[tuple[fx.GraphModule, list[Any]]] = []

    def keep(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        if not captured:
            captured.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(module, backend=keep, fullgraph=True, dynamic=False)(*args, **kwargs)
    torch._dynamo.reset()
    return captured[0]
