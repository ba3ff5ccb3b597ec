"""The fixed template for aligners written by an agent or a user, and its static validation.

An aligner is a small pure function that puts one mapped pair's tensors on the same rows and features when the
built-in aligners (:mod:`ekka_core.align`) do not know the pattern — a fused projection split differently, heads
laid out differently, a stream that must be summed back. It is *untrusted* source: Ekka never imports it, it runs
it with :func:`ekka_core.align.sandbox.run_aligner` in a separate, resource-limited process, after
:func:`validate_source` has checked it here with :mod:`ast` (a fast first filter, not the security boundary).

Contract (what the agent sees in :data:`TEMPLATE`)::

    def align(target: dict[str, np.ndarray], reference: dict[str, np.ndarray], meta: dict
              ) -> tuple[np.ndarray, np.ndarray]

returns two arrays of identical shape ``[rows, features]`` (cast to fp32), one row per (sequence, position) in the
order ``meta`` gives. The source may declare ``SELF_CHECKS = [...]`` naming checks from :data:`CHECKS` that the
parent runs on the returned arrays; ``shape`` and ``finite`` always run, as they are the contract itself.
"""

from __future__ import annotations

import ast

# Self-checks an aligner may declare, with what each proves. They run in the parent, on the returned arrays.
CHECKS: dict[str, str] = {
    "shape": "both arrays are 2-D [rows, features] with identical shapes, and rows == meta['rows'] when given "
             "(always run)",
    "finite": "no NaN/inf in the result unless an input already had one (always run)",
    "row_sums": "per-row sums of target and reference correlate (r > 0.9): a fingerprint that the rows line up. "
                "Only meaningful on a known-correct fp32 pair (both sides computing the same thing); it is blind "
                "to a permutation of features within a row",
    "col_sums": "per-feature sums over the rows of target and reference correlate (r > 0.9): a fingerprint that "
                "the features line up (catches e.g. q and k swapped inside a fused projection). Same caveat: "
                "only meaningful on a known-correct fp32 pair",
}
ALWAYS_CHECKS = ("shape", "finite")

ALLOWED_IMPORTS = frozenset({"numpy", "numpy.linalg", "numpy.fft", "math"})
_NETWORK_MODULES = frozenset({"socket", "_socket", "ssl", "http", "urllib", "urllib3", "requests", "httpx",
                              "aiohttp", "ftplib", "smtplib", "asyncio", "select", "selectors", "socketserver",
                              "xmlrpc", "telnetlib", "poplib", "imaplib"})
# Builtins that reach outside a pure function (files, code execution, introspection that defeats the checks).
FORBIDDEN_NAMES = frozenset({"open", "exec", "eval", "compile", "__import__", "globals", "locals", "vars",
                             "getattr", "setattr", "delattr", "breakpoint", "input", "help", "exit", "quit",
                             "memoryview", "__builtins__"})
# numpy attributes that read or write files, unpickle, or hand out raw pointers.
FORBIDDEN_ATTRIBUTES = frozenset({"load", "save", "savez", "savez_compressed", "savetxt", "loadtxt", "genfromtxt",
                                  "fromfile", "tofile", "memmap", "open_memmap", "fromregex", "DataSource",
                                  "ctypeslib", "ctypes", "dump", "f2py", "distutils", "testing", "show_config",
                                  "show_runtime", "get_include"})

TEMPLATE = '''"""Aligner for one mapped pair (target engine component <-> reference component).

Write `align` so that both returned arrays are [rows, features], identical shape, row r of each holding the same
(sequence, position) and column j of each holding the same feature. Rules:

* Pure function of its arguments: only `numpy` and `math` may be imported; no files, network, subprocesses,
  `open`, `exec`, `eval`, `getattr`, dunder attributes, or `global` statements. It runs in a sandbox with a
  time and memory limit; printing goes to the log that is shown if it fails.
* `target` / `reference`: the two sides' tensors by name ("out0", "out1", ... for outputs, "in0", ... for inputs,
  or the names given in meta), numpy arrays (fp32 unless the caller says otherwise). The target is usually flat
  [num_tokens, ...]; the reference usually [1, seq, ...].
* `meta`: JSON-like dict (lists, not tuples). Keys present when known: "rows" (number of rows to return),
  "num_tokens", "split_sizes" (e.g. [q, k, v] widths of a fused projection), "num_heads", "num_kv_heads",
  "head_dim", "hidden_size", and always "target_shapes" / "reference_shapes" (name -> shape).
* Return (target_array, reference_array); they are cast to fp32.

Declare the self-checks that hold for a correct alignment (see ekka_core.align.template.CHECKS): "shape" and
"finite" always run; "row_sums" fingerprints the row order and "col_sums" the feature order.
"""

import numpy as np

SELF_CHECKS = ["shape", "row_sums"]


def align(target: dict[str, np.ndarray], reference: dict[str, np.ndarray], meta: dict
          ) -> tuple[np.ndarray, np.ndarray]:
    t = target["out0"]
    r = reference["out0"]
    return t.reshape(-1, t.shape[-1]), r.reshape(-1, r.shape[-1])
'''


def validate_source(src: str) -> list[str]:
    """Statically check aligner source against the template's rules; return the problems (empty: accepted).

    A first filter with clear messages for an agent to fix its code — the sandbox is what actually contains it."""
    try:
        tree = ast.parse(src, filename="<aligner>")
    except SyntaxError as e:
        return [f"syntax error at line {e.lineno}: {e.msg}"]
    problems: list[str] = []

    def bad(node: ast.AST, what: str) -> None:
        problems.append(f"line {getattr(node, 'lineno', '?')}: {what}")

    aligns = []
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "align":
            aligns.append(stmt)
        elif isinstance(stmt, ast.AsyncFunctionDef) and stmt.name == "align":
            bad(stmt, "align must be a plain function, not async")
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            pass                                        # docstring
        elif not isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign,
                                   ast.AnnAssign)):
            bad(stmt, f"top-level {type(stmt).__name__} statement: only imports, definitions and assignments "
                      "may be at module level")
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if any(isinstance(t, ast.Name) and t.id == "SELF_CHECKS" for t in targets):
                problems.extend(_check_self_checks(stmt))
    if not aligns:
        problems.append("no top-level `def align(target, reference, meta)`")
    elif len(aligns) > 1:
        bad(aligns[1], "align is defined more than once")
    else:
        args = aligns[0].args
        names = [a.arg for a in args.posonlyargs + args.args]
        if names != ["target", "reference", "meta"] or args.vararg or args.kwarg or args.kwonlyargs:
            bad(aligns[0], f"align must take exactly (target, reference, meta), not ({', '.join(names)})")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                _check_import(alias.name, node, bad)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                bad(node, "relative imports are not allowed")
                continue
            _check_import(node.module or "", node, bad)
            for alias in node.names:
                if alias.name == "*":
                    bad(node, f"`from {node.module} import *` is not allowed")
                elif alias.name in FORBIDDEN_ATTRIBUTES or _dunder(alias.name):
                    bad(node, f"importing `{alias.name}` is not allowed (file or raw memory access)")
        elif isinstance(node, ast.Name):
            if node.id in FORBIDDEN_NAMES:
                bad(node, f"`{node.id}` is not allowed in an aligner (it must be a pure function)")
            elif _dunder(node.id):
                bad(node, f"dunder name `{node.id}` is not allowed")
        elif isinstance(node, ast.Attribute):
            if _dunder(node.attr):
                bad(node, f"access to dunder attribute `.{node.attr}` is not allowed")
            elif node.attr in FORBIDDEN_ATTRIBUTES:
                bad(node, f"`.{node.attr}` is not allowed (file I/O, unpickling or raw memory access)")
        elif isinstance(node, ast.Global):
            bad(node, "`global` statements are not allowed (align must be a pure function)")
    return problems


def declared_checks(src: str) -> list[str]:
    """The checks ``SELF_CHECKS`` declares (known names only, in order), empty when absent or unparsable."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return []
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SELF_CHECKS"
                                                for t in stmt.targets):
            value = stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) \
                and stmt.target.id == "SELF_CHECKS" and stmt.value is not None:
            value = stmt.value
        else:
            continue
        try:
            names = ast.literal_eval(value)
        except ValueError:
            return []
        if isinstance(names, (list, tuple)):
            return [n for n in names if isinstance(n, str) and n in CHECKS]
    return []


def _check_self_checks(stmt: ast.Assign | ast.AnnAssign) -> list[str]:
    where = f"line {stmt.lineno}"
    if stmt.value is None:
        return [f"{where}: SELF_CHECKS needs a value"]
    try:
        names = ast.literal_eval(stmt.value)
    except ValueError:
        return [f"{where}: SELF_CHECKS must be a literal list of strings"]
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        return [f"{where}: SELF_CHECKS must be a literal list of strings"]
    unknown = [n for n in names if n not in CHECKS]
    return [f"{where}: unknown self-check {n!r} (known: {', '.join(CHECKS)})" for n in unknown]


def _check_import(name: str, node: ast.AST, bad) -> None:
    if name in ALLOWED_IMPORTS:
        return
    root = name.split(".")[0]
    why = " — network access is not allowed in an aligner" if root in _NETWORK_MODULES else ""
    bad(node, f"import of `{name}` is not allowed (only numpy and math){why}")


def _dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")
