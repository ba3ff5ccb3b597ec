"""The tree stage, static half — model source files read with libcst, never imported.

The dynamic Model Tree (``ekka_core.tree.build_tree``) says which modules ran; this package says what their source
declares: per class its bases, the line of its ``class`` statement, literal class attributes
(``packed_modules_mapping``, ``stacked_params_mapping`` — also the local one inside ``load_weights``), the
submodules ``__init__`` assigns (``self.qkv_proj = QKVParallelLinear(...)``, ``make_layers(...)`` lists) and the
ordered calls ``forward`` makes (``self.qkv_proj(...)`` → ``("self", "qkv_proj")``, ``apply_rotary_pos_emb(...)``).

Nothing here imports the parsed code, so SGLang's CUDA-only model files parse on a CPU machine. By responsibility:

``model``    the artefacts (:class:`StaticModule`, :class:`StaticClass`, :class:`StaticMethod`, :class:`StaticCall`, …)
``parser``   one file → :class:`StaticModule` (:func:`parse_module_source`)
``calls``    a method's calls in execution order; ``forward``'s with the class's own helpers inlined
``lines``    line numbers of the nodes the parser needs (a lean pass; libcst's PositionProvider as the fallback)
``syntax``   helpers over libcst nodes
``locate``   a dotted module name → its file, without importing (:func:`locate_source_of`, :func:`module_name_for`)
``index``    many files, classes looked up by (qualified) name, class sources, forward call lines (:class:`StaticIndex`)
"""

from ekka_core.tree.static.index import StaticIndex
from ekka_core.tree.static.lines import line_table
from ekka_core.tree.static.locate import locate_source_of, module_name_for
from ekka_core.tree.static.model import (StaticAttribute, StaticCall, StaticClass, StaticMethod, StaticModule,
                                         StaticSubmodule)
from ekka_core.tree.static.parser import parse_module_source

__all__ = [
    "StaticAttribute", "StaticCall", "StaticClass", "StaticIndex", "StaticMethod", "StaticModule", "StaticSubmodule",
    "line_table", "locate_source_of", "module_name_for", "parse_module_source",
]
