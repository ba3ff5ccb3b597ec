"""What the static parse of one model source file holds: its classes (bases, literals, submodules, methods and the
calls each makes, in execution order) and its imports. Plain dataclasses, filled in by :mod:`.parser` and
:mod:`.calls`, looked up through :class:`~ekka_core.tree.static.index.StaticIndex`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class StaticCall:
    """One call a method makes, in execution (call-start) order: arguments' calls come before the call itself.

    ``receiver`` is ``"self"`` for ``self.<name>(...)`` (``name`` may be dotted: ``"mlp.experts"``) and ``None`` for
    a function call (``"apply_rotary_pos_emb"``, ``"torch.matmul"``). ``kind``: ``submodule`` (a submodule the class
    assigns), ``method`` (a method of the class — its own calls follow, with ``via`` naming it), ``self`` (another
    ``self.`` attribute: an inherited submodule or method the index could not see), ``function``.
    ``alias`` is the local name a submodule was called through (``layer`` in ``for layer in self.layers``).
    ``conditional``: inside an ``if``/``else``/ternary/``except``/``or``; ``in_loop``: inside a loop or comprehension.
    ``file`` is set only when the call was inlined from a method defined in another file (an indexed base class).
    """

    name: str
    receiver: str | None
    line: int
    kind: str = "function"
    via: str | None = None
    alias: str | None = None
    conditional: bool = False
    in_loop: bool = False
    file: str | None = None

    @property
    def target(self) -> tuple[str, str] | str:
        return (self.receiver, self.name) if self.receiver else self.name

    def text(self) -> str:
        return f"{self.receiver}.{self.name}" if self.receiver else self.name


@dataclass
class StaticMethod:
    name: str
    line: int                       # line of the ``def`` keyword
    end_line: int
    params: list[str] = field(default_factory=list)
    calls: list[StaticCall] = field(default_factory=list)   # this method's own calls (no inlining)
    returns: list[str] = field(default_factory=list)        # dotted callee of each ``return Foo(...)``


@dataclass
class StaticSubmodule:
    """``self.<name> = <constructor>(...)`` in ``__init__`` (or a helper it calls: ``method``).

    ``kind``: ``class`` (CamelCase constructor), ``parameter`` (``nn.Parameter`` / ``nn.Buffer``), ``factory`` (a lower-case function such as ``get_rope`` — may also be
    a non-module value), ``list`` (``nn.ModuleList`` / ``make_layers`` …: ``element`` is the element constructor when
    determinable), ``alias`` (``self.lm_head = self.model.embed_tokens``: ``constructor`` is the aliased path).
    ``qualname`` is the constructor's dotted import path when the file imports it (``vllm.….linear.QKVParallelLinear``).
    ``candidates``: other constructors seen for the same attribute (if/else branches, a local ``attn_cls`` chosen by
    a ternary). ``via``: the local name or method the constructor went through (``attn_cls``, ``_init_model``).
    """

    name: str
    constructor: str | None
    line: int
    kind: str
    method: str = "__init__"
    element: str | None = None
    qualname: str | None = None
    candidates: list[str] = field(default_factory=list)
    via: str | None = None


@dataclass
class StaticAttribute:
    """A literal the class declares. ``scope``: ``class`` (class body), ``instance`` (``self.x = …`` in ``__init__``),
    ``local`` (a ``*mapping*`` local variable in a method, e.g. ``stacked_params_mapping`` in ``load_weights``).
    ``kind``: ``literal`` (``value`` is the Python value), ``call`` (a constructor with literal arguments:
    ``{"call": "WeightsMapper", "args": [...], "kwargs": {...}}``), ``ref`` (a dotted name: ``LlamaModel.hf_to_vllm_mapper``).
    """

    name: str
    value: Any
    line: int
    scope: str = "class"
    kind: str = "literal"
    method: str | None = None


@dataclass
class StaticClass:
    name: str
    file: str
    line: int                       # the ``class`` keyword (1-based)
    end_line: int
    first_line: int                 # first decorator line, else ``line``
    bases: list[str] = field(default_factory=list)
    module: str | None = None
    attributes: list[StaticAttribute] = field(default_factory=list)
    submodules: dict[str, StaticSubmodule] = field(default_factory=dict)
    methods: dict[str, StaticMethod] = field(default_factory=dict)
    forward_calls: list[StaticCall] = field(default_factory=list)   # forward, own methods inlined (see ``via``)
    decorators: list[str] = field(default_factory=list)

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}" if self.module else self.name

    @property
    def forward_line(self) -> int | None:
        m = self.methods.get("forward")
        return m.line if m else None

    def literal(self, name: str, scope: str | None = None) -> Any:
        """Value of the literal ``name``: class attribute first, then instance, then a method's local; ``None``."""
        order = {"class": 0, "instance": 1, "local": 2}
        hits = sorted((a for a in self.attributes if a.name == name and (scope is None or a.scope == scope)),
                      key=lambda a: order.get(a.scope, 3))
        return hits[0].value if hits else None


@dataclass
class StaticModule:
    path: str
    module: str | None
    classes: dict[str, StaticClass] = field(default_factory=dict)
    functions: dict[str, int] = field(default_factory=dict)     # top-level ``def`` → line
    imports: dict[str, str] = field(default_factory=dict)       # local name → dotted origin
    parse_seconds: float = 0.0
    source: str = field(default="", repr=False)                 # the decoded file text

    def class_source(self, name: str) -> str:
        c = self.classes[name]
        text = self.source or Path(self.path).read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)[c.first_line - 1:c.end_line]
        while lines and not lines[-1].strip():
            lines.pop()
        return "".join(lines)
