"""Weight ownership for hand-made Model Trees (what the tracer records on a real model: ``RunInfo.module_weights``).

A module whose class holds parameters owns itself; every module computes with the owners in its subtree, by name
prefix. Real traces record this from the model's own parameters (``ekka_core.capture.hooks.weight_owners``).
"""

from __future__ import annotations

from ekka_core.tree import ModelTree

WEIGHTED = ("Linear", "Embedding", "Norm", "LMHead", "FusedMoE", "Experts", "Up")


def derive_weights(tree: ModelTree, weighted: tuple[str, ...] = WEIGHTED) -> ModelTree:
    # Rotary embeddings hold buffers (cos/sin caches), not parameters.
    owners = [n for n, node in tree.modules.items()
              if any(w in node.cls for w in weighted) and "Rotary" not in node.cls]
    for name, node in tree.modules.items():
        node.weights = sorted(o for o in owners if name == "" or o == name or o.startswith(name + "."))
    return tree
