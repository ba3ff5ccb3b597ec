"""What changed between two releases, for one suspect: the unified diff of the suspect's class, of its engine base
classes, and of the engine functions its methods call (and those call, a few levels deep), between the installed
sources of the last good and the first bad release.

Found statically, from each environment's installed files: the suspect's class with Ekka's libcst index
(:class:`~ekka_core.tree.static.StaticIndex`: the class, its methods and the calls each makes, the file's imports);
the functions those calls name, resolved through the file's imports (module-level and function-local) to a module
of the same top-level package (``vllm``) or of ``vllm``, read with :mod:`ast` (a function's calls and its exact source
lines). Every method is a starting point, not only ``forward``: a CustomOp dispatches to ``forward_cpu`` /
``forward_cuda`` / ``forward_native`` at run time. Calls into compiled kernels (``torch.ops._C.rms_norm``) have no
Python source; they are listed as custom ops with the Python wrapper that calls them.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ekka_core.capture.interpreter import clean_env
from ekka_core.contracts.report import BisectChange, TargetLocation

MAX_DEPTH = 3          # calls followed from the class's methods: method → function → function → function
MAX_SYMBOLS = 60


@dataclass
class Symbol:
    qualname: str                  # vllm._custom_ops.rms_norm
    kind: str                      # class | base_class | function
    file: str
    first_line: int
    end_line: int
    source: str
    calls: list[str] = field(default_factory=list)   # resolved qualnames it calls (functions) / custom ops


def search_paths(python: str) -> list[str]:
    """The ``sys.path`` of an interpreter (its site-packages, ``.pth`` lines of an overlay venv included)."""
    out = subprocess.run([python, "-c", "import json, sys; print(json.dumps(sys.path))"], capture_output=True,
                         text=True, env=clean_env(), check=True, cwd="/")
    return [p for p in json.loads(out.stdout.strip().splitlines()[-1]) if p and Path(p).is_dir()]


def module_of(file: str, paths: list[str]) -> str | None:
    """Dotted module name of ``file`` under the longest search path that holds it."""
    f = Path(file).resolve()
    best = None
    for p in paths:
        try:
            rel = f.relative_to(Path(p).resolve())
        except ValueError:
            continue
        if best is None or len(rel.parts) < len(best.parts):
            best = rel
    if best is None:
        return None
    parts = list(best.with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts) or None


def locate(module: str, paths: list[str]) -> Path | None:
    from ekka_core.tree.static import locate_source_of
    return locate_source_of(module, paths)


class _Tree:
    """One release's installed sources (parsed files cached)."""

    def __init__(self, paths: list[str]):
        self.paths = paths
        self._ast: dict[str, ast.Module | None] = {}
        self._text: dict[str, str] = {}

    def module_ast(self, path: Path) -> ast.Module | None:
        key = str(path)
        if key not in self._ast:
            try:
                text = path.read_text(encoding="utf-8")
                self._text[key] = text
                self._ast[key] = ast.parse(text)
            except (OSError, SyntaxError, UnicodeDecodeError):
                self._ast[key] = None
        return self._ast[key]

    def text(self, path: Path) -> str:
        self.module_ast(path)
        return self._text.get(str(path), "")


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _imports(node: ast.AST, module: str) -> dict[str, str]:
    """Local name → dotted origin, for every import in ``node`` (module level and inside functions)."""
    out: dict[str, str] = {}
    pkg = module.rsplit(".", 1)[0] if "." in module else module
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            for a in n.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - n.level] if len(anchor) >= n.level else []
                base = ".".join([*anchor, base] if base else anchor) or pkg
            for a in n.names:
                if a.name != "*":
                    out[a.asname or a.name] = f"{base}.{a.name}" if base else a.name
    return out


def _calls(node: ast.AST) -> list[str]:
    seen: list[str] = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            name = _dotted(n.func)
            if name and name not in seen:
                seen.append(name)
    return seen


def _span(node: ast.AST) -> tuple[int, int]:
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return first, node.end_lineno or node.lineno


def _lines(text: str, first: int, end: int) -> str:
    return "".join(text.splitlines(keepends=True)[first - 1:end])


class _Walker:
    def __init__(self, tree: _Tree, packages: set[str]):
        self.tree = tree
        self.packages = packages
        self.symbols: dict[str, Symbol] = {}
        self.custom_ops: list[str] = []

    def in_scope(self, qualname: str) -> bool:
        return qualname.split(".")[0] in self.packages

    def resolve(self, name: str, module: str, imports: dict[str, str], local_defs: set[str]
                ) -> tuple[str, str] | None:
        """(module, function) a call name refers to, or None. ``torch.ops.*`` calls are noted as custom ops."""
        head, _, rest = name.partition(".")
        if head in ("self", "cls", "super"):
            return None
        if not rest and head in local_defs:
            return module, head
        origin = imports.get(head)
        full = f"{origin}.{rest}" if origin and rest else (origin or (name if "." in name else None))
        if full is None:
            return None
        if full.startswith("torch.ops."):
            if full not in self.custom_ops:
                self.custom_ops.append(full)
            return None
        if not self.in_scope(full):
            return None
        mod, _, fn = full.rpartition(".")
        return (mod, fn) if mod else None

    def add_function(self, module: str, fn: str, depth: int) -> str | None:
        qual = f"{module}.{fn}"
        if qual in self.symbols:
            return qual
        if len(self.symbols) >= MAX_SYMBOLS:
            return None
        path = locate(module, self.tree.paths)
        tree = self.tree.module_ast(path) if path else None
        if tree is None:
            return None
        node = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == fn), None)
        if node is None:
            # re-exported: `from .x import f` in an __init__ — follow the import once
            origin = _imports(tree, module).get(fn)
            if origin and origin != qual and self.in_scope(origin) and depth < MAX_DEPTH + 1:
                mod, _, name = origin.rpartition(".")
                return self.add_function(mod, name, depth + 1)
            return None
        first, end = _span(node)
        sym = Symbol(qual, "function", str(path), first, end, _lines(self.tree.text(path), first, end))
        self.symbols[qual] = sym
        if depth < MAX_DEPTH:
            self._follow(sym, node, module, tree, depth)
        return qual

    def _follow(self, sym: Symbol, node: ast.AST, module: str, module_tree: ast.Module, depth: int) -> None:
        imports = {**_imports(module_tree, module), **_imports(node, module)}
        defs = {n.name for n in module_tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        before = set(self.custom_ops)
        for name in _calls(node):
            target = self.resolve(name, module, imports, defs)
            if target is None:
                continue
            got = self.add_function(*target, depth + 1)
            if got and got not in sym.calls and got != sym.qualname:
                sym.calls.append(got)
        sym.calls += [c for c in self.custom_ops if c not in before and c not in sym.calls]
        for name in _calls(node):                       # custom ops called directly by this symbol
            origin_head = name.split(".")[0]
            full = imports.get(origin_head, origin_head) + name[len(origin_head):]
            if full.startswith("torch.ops.") and full not in sym.calls:
                sym.calls.append(full)

    def add_class(self, module: str, name: str, kind: str = "class") -> Symbol | None:
        """The class (found with the static index), and what its methods call."""
        from ekka_core.tree.static import StaticIndex

        path = locate(module, self.tree.paths)
        if path is None:
            return None
        index = StaticIndex.from_files([path], roots=self.tree.paths, lazy=True, on_error="skip")
        index.add_file(path, module, lazy=True)
        cls = index.get_class(f"{module}.{name}") or index.get_class(name)
        if cls is None:
            return None
        text = self.tree.text(path)
        qual = f"{module}.{name}"
        sym = Symbol(qual, kind, str(path), cls.first_line, cls.end_line, _lines(text, cls.first_line, cls.end_line))
        self.symbols[qual] = sym
        tree = self.tree.module_ast(path)
        node = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name
                     and n.lineno == cls.line), None) if tree else None
        if kind == "class" and node is not None:
            self._follow(sym, node, module, tree, 0)
            imports = _imports(tree, module)
            for base in cls.bases:                      # engine base classes (CustomOp …): their source too
                head, _, rest = base.partition(".")
                origin = imports.get(head)
                full = (f"{origin}.{rest}" if rest else origin) if origin else f"{module}.{base}"
                if self.in_scope(full):
                    bmod, _, bname = full.rpartition(".")
                    if f"{bmod}.{bname}" not in self.symbols:
                        self.add_class(bmod, bname, "base_class")
        return sym


def collect(class_name: str, class_file: str, paths: list[str], *, module: str | None = None,
            packages: set[str] | None = None) -> tuple[dict[str, Symbol], list[str], str | None]:
    """The suspect class and every symbol it reaches in one release's sources: (symbols by qualname, custom ops,
    the class's module)."""
    module = module or module_of(class_file, paths)
    if module is None:
        return {}, [], None
    walker = _Walker(_Tree(paths), packages or {module.split(".")[0], "vllm"})
    walker.add_class(module, class_name)
    return walker.symbols, walker.custom_ops, module


def _shifted_diff(a: Symbol | None, b: Symbol | None, rel_a: str, rel_b: str) -> str:
    """Unified diff of two symbols' sources with hunk headers in each file's own line numbers."""
    old = a.source.splitlines(keepends=True) if a else []
    new = b.source.splitlines(keepends=True) if b else []
    out = []
    for line in difflib.unified_diff(old, new, f"a/{rel_a}", f"b/{rel_b}", n=3):
        m = re.match(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@(.*)$", line.rstrip("\n"))
        if m:
            sa = int(m.group(1)) + ((a.first_line - 1) if a else 0)
            sb = int(m.group(3)) + ((b.first_line - 1) if b else 0)
            line = f"@@ -{sa}{m.group(2) or ''} +{sb}{m.group(4) or ''} @@{m.group(5)}\n"
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _rel(file: str, paths: list[str]) -> str:
    mod_path = Path(file).resolve()
    for p in sorted(paths, key=len, reverse=True):
        try:
            return mod_path.relative_to(Path(p).resolve()).as_posix()
        except ValueError:
            continue
    return mod_path.name


@dataclass
class WhatChanged:
    """What differs for one suspect between two releases: the bisection's ``changes``, ``compared``, ``custom_ops``."""

    changes: list[BisectChange] = field(default_factory=list)
    compared: list[str] = field(default_factory=list)      # every symbol compared, by qualname
    custom_ops: list[str] = field(default_factory=list)    # compiled ops reached (no Python source)
    note: str = ""


def what_changed(target: TargetLocation, good_python: str, bad_python: str) -> WhatChanged:
    """The ``changes`` of a bisection: for the suspect (a report suspect's ``target``: its class and file), every
    symbol it reaches in either release whose source differs, with its unified diff; plus what was compared."""
    return what_changed_in(target, search_paths(good_python), search_paths(bad_python))


def what_changed_in(target: TargetLocation, good_paths: list[str], bad_paths: list[str]) -> WhatChanged:
    """:func:`what_changed` with each release given as its import paths (``sys.path``)."""
    cls, file = target.cls, target.file
    if not cls or not file:
        return WhatChanged(note="the suspect has no class source to diff")
    module = module_of(file, bad_paths) or module_of(file, good_paths)      # the report names one release's file
    if module is None:
        return WhatChanged(note=f"{file} is not under either release's import paths")
    found = {}
    for side, paths in (("bad", bad_paths), ("good", good_paths)):
        path = locate(module, paths)
        found[side] = collect(cls, str(path), paths, module=module)[:2] if path else ({}, [])
    (bad_syms, bad_ops), (good_syms, good_ops) = found["bad"], found["good"]
    changes, compared = [], []
    for qual in list(bad_syms) + [q for q in good_syms if q not in bad_syms]:
        a, b = good_syms.get(qual), bad_syms.get(qual)
        compared.append(qual)
        if a is not None and b is not None and a.source == b.source:
            continue
        rel_a = _rel(a.file, good_paths) if a else _rel(b.file, bad_paths)   # type: ignore[union-attr]
        rel_b = _rel(b.file, bad_paths) if b else rel_a
        status = "changed" if a and b else ("added" if b else "removed")
        changes.append(BisectChange(
            symbol=qual, kind=(b or a).kind, status=status,                    # type: ignore[union-attr]
            file_good=a.file if a else None, line_good=a.first_line if a else None,
            file_bad=b.file if b else None, line_bad=b.first_line if b else None,
            calls=list((b or a).calls),                                       # type: ignore[union-attr]
            unified_diff=_shifted_diff(a, b, rel_a, rel_b)))
    ops = sorted(set(bad_ops) | set(good_ops))
    return WhatChanged(changes, compared, ops,
                       "" if changes else "no difference in the suspect's class or the engine functions it calls")
