"""The tree stage — the Model Tree: every module a framework ran, with its class and where that class is defined.

Entry point: :func:`build_tree` (from a trace). ``render`` folds repeated layers (``layers.[0-31]``) into the
compact text an engineer or an agent reads.

Modules: :mod:`~ekka_core.tree.model_tree` (:class:`ModelTree`, :class:`ModuleNode`, :func:`build_tree`),
:mod:`~ekka_core.tree.sites` (source lines: :func:`call_site`, :func:`forward_span`), :mod:`~ekka_core.tree.static`
(the model source read with libcst, never imported).
"""

from __future__ import annotations

from ekka_core.tree.model_tree import ModelTree, ModuleNode, build_tree
from ekka_core.tree.sites import call_site, forward_span

__all__ = ["ModelTree", "ModuleNode", "build_tree", "call_site", "forward_span"]
