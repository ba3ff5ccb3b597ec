"""Many parsed files: classes by name or qualified name, their exact source, the line where ``forward`` calls a
submodule — what the pipeline (call sites), the mapping agent (class sources) and bisection read."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

from ekka_core.contracts.errors import BadInput
from ekka_core.tree.static.calls import flatten_calls
from ekka_core.tree.static.locate import module_name_for
from ekka_core.tree.static.model import StaticCall, StaticClass, StaticMethod, StaticModule, StaticSubmodule
from ekka_core.tree.static.parser import parse_module_source

_CLASS_RE = re.compile(rb"^[ \t]*class[ \t]+([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)


class StaticIndex:
    """Many parsed files; classes looked up by name (``LlamaAttention``) or qualified name
    (``vllm.model_executor.models.llama.LlamaAttention``). A lazy index scans files for ``class`` names with a
    regular expression and parses a file the first time one of its classes is asked for."""

    def __init__(self) -> None:
        self.modules: dict[str, StaticModule] = {}          # path → parsed module
        self._pending: dict[str, str | None] = {}           # path → module name, not parsed yet
        self._names: dict[str, list[str]] = {}              # class name → paths that (may) define it, in order
        self._by_module: dict[str, str] = {}                # module name → path
        self.errors: dict[str, str] = {}                    # path → why it could not be parsed (on_error="skip")
        self.on_error = "raise"

    # ---- building
    @classmethod
    def from_files(cls, paths: Iterable[str | Path], *, roots: Iterable[str | Path] = (), lazy: bool = False,
                   on_error: str = "raise") -> "StaticIndex":
        index = cls()
        index.on_error = on_error
        roots = list(roots)
        for p in paths:
            index.add_file(p, module_name_for(p, roots), lazy=lazy)
        return index

    @classmethod
    def from_tree(cls, tree: Any, *, lazy: bool = True, on_error: str = "skip") -> "StaticIndex":
        """An index over the class files a dynamic :class:`~ekka_core.tree.ModelTree` names (each module's
        ``class_file``, under the module name its ``qualname`` gives), ready for ``index.get_class(node.qualname)``:
        what the mapping agent reads class sources from. Files that cannot be parsed are recorded in ``errors``
        (``on_error="skip"``); files that no longer exist are left out."""
        index = cls()
        index.on_error = on_error
        for node in getattr(tree, "modules", {}).values():
            file, qualname = getattr(node, "class_file", None), getattr(node, "qualname", "") or ""
            if file and Path(file).is_file():
                index.add_file(file, qualname.rpartition(".")[0] or None, lazy=lazy)
        return index

    def add_file(self, path: str | Path, module: str | None = None, *, lazy: bool = False) -> None:
        key = str(Path(path))
        if key in self.modules or key in self._pending:
            return
        if module is not None:
            self._by_module.setdefault(module, key)
        if lazy:
            try:
                raw = Path(key).read_bytes()
            except OSError as err:
                raise BadInput(f"cannot read {key}: {err}", fix="pass a readable Python file") from None
            self._pending[key] = module
            for m in _CLASS_RE.finditer(raw):
                self._names.setdefault(m.group(1).decode(), []).append(key)
        else:
            self._pending[key] = module
            if self._load(key) is not None:
                for name in self.modules[key].classes:
                    self._names.setdefault(name, []).append(key)

    def _load(self, key: str) -> StaticModule | None:
        if key in self.modules:
            return self.modules[key]
        if key not in self._pending:
            return None
        module = self._pending.pop(key)
        try:
            mod = parse_module_source(key, module)
        except BadInput as err:
            if self.on_error != "skip":
                raise
            self.errors[key] = str(err)
            return None
        self.modules[key] = mod
        return mod

    # ---- lookup
    def find_classes(self, name: str) -> list[StaticClass]:
        """Every class called ``name`` (a simple name) or the one a qualified name names."""
        if "." in name:
            module, _, simple = name.rpartition(".")
            key = self._by_module.get(module)
            mod = self._load(key) if key else None
            return [mod.classes[simple]] if mod and simple in mod.classes else []
        out = []
        for key in self._names.get(name, []):
            mod = self._load(key)
            if mod is not None and name in mod.classes:
                out.append(mod.classes[name])
        return out

    def get_class(self, name: str) -> StaticClass | None:
        """The class ``name`` names; for a simple name defined in several files, the first file added."""
        found = self.find_classes(name)
        return found[0] if found else None

    def class_source(self, name: str) -> str:
        """The exact source text of the class, decorators included (for an agent's ``get_class_definition``)."""
        c = self.get_class(name)
        if c is None:
            raise BadInput(f"no class {name!r} in the static index", fix="check the class name and the files indexed")
        return self.modules[c.file].class_source(c.name)

    def mro(self, name: str) -> list[StaticClass]:
        """The class and its bases that the index can see (depth-first, left to right, each once)."""
        start = self.get_class(name)
        if start is None:
            return []
        out: list[StaticClass] = []
        seen: set[str] = set()

        def visit(c: StaticClass) -> None:
            if c.qualname in seen:
                return
            seen.add(c.qualname)
            out.append(c)
            mod = self.modules.get(c.file)
            for base in c.bases:
                found = None
                simple = base.rsplit(".", 1)[-1]
                if mod is not None and simple in mod.classes and mod.classes[simple] is not c:
                    found = mod.classes[simple]
                elif mod is not None and (origin := mod.imports.get(base.split(".")[0])):
                    full = origin + base[len(base.split(".")[0]):]
                    found = next(iter(self.find_classes(full)), None)
                if found is None:
                    found = next((x for x in self.find_classes(simple) if x is not c), None)
                if found is not None:
                    visit(found)

        visit(start)
        return out

    def submodules(self, name: str) -> dict[str, StaticSubmodule]:
        """Submodules of the class and of its indexed bases (the subclass wins)."""
        out: dict[str, StaticSubmodule] = {}
        for c in reversed(self.mro(name)):
            out.update(c.submodules)
        return out

    def forward_calls(self, name: str) -> list[StaticCall]:
        """Forward's calls, inherited forward and inherited helper methods followed through indexed bases."""
        chain = self.mro(name)
        if not chain:
            return []
        subs = self.submodules(name)

        def lookup(method: str) -> tuple[StaticMethod | None, str | None]:
            for c in chain:
                if method in c.methods:
                    return c.methods[method], (None if c.file == chain[0].file else c.file)
            return None, None

        return flatten_calls("forward", lookup, lambda n: n in subs)

    def find_forward_call(self, class_name: str, attr: str) -> StaticCall | None:
        for call in self.forward_calls(class_name):
            if call.receiver == "self" and call.name == attr:
                return call
        return None

    def find_forward_call_line(self, class_name: str, attr: str) -> int | None:
        """Line where forward (or a helper of the class it calls) calls ``self.<attr>(`` — the line to blame."""
        call = self.find_forward_call(class_name, attr)
        return call.line if call else None
