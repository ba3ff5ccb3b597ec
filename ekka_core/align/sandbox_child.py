"""The sandboxed child that runs one untrusted aligner: ``python -I -B <this file>`` in a private temp directory.

Started by :func:`ekka_core.align.sandbox.run_aligner_jobs` (read its docstring for the whole sandbox). A standalone
script: it imports nothing of Ekka (``-I`` keeps this file's directory off ``sys.path``) and only numpy and
safetensors besides the standard library, from the directories listed in ``runner.json``. Files in its working
directory, all written by the parent:

* ``runner.json``  ``{"paths": [import dirs of numpy and safetensors], "jobs": n}``;
* ``aligner.py``   the aligner's source;
* ``job<k>.target.safetensors``, ``job<k>.reference.safetensors``, ``job<k>.meta.json``: job k's inputs.

It writes ``job<k>.out.safetensors`` (``target`` and ``reference``, fp32) per job, or ``error.json``
(``{kind, job, type?, message?, line?}``; kind: ``load`` · ``memory`` · ``network`` · ``contract`` · ``exception``)
and exits 1 at the first failure. Before the aligner runs, ``socket`` and ``_socket`` lose their connecting and
name-resolving functions and ``builtins.open`` raises while aligner code runs; a network attempt fails the run even
when the aligner swallowed the exception.
"""

from __future__ import annotations

import builtins
import json
import linecache
import os
import sys
import traceback
from typing import Any, Callable, NoReturn

_open = builtins.open
JOB: int | None = None            # the job being run, named in error.json
attempts: list[str] = []          # network attempts, caught or not


def report(kind: str, exc: BaseException | None = None, message: str | None = None) -> NoReturn:
    """Write error.json and end the process at once (not SystemExit: nothing may catch it)."""
    info: dict[str, Any] = {"kind": kind, "job": JOB}
    if exc is not None:
        traceback.print_exception(exc)
        lines = [fr.lineno for fr in traceback.extract_tb(exc.__traceback__) if fr.filename == "<aligner>"]
        info.update(type=type(exc).__name__, message=str(exc)[:2000], line=lines[-1] if lines else None)
    if message is not None:
        info["message"] = message
    with _open("error.json", "w") as f:
        json.dump(info, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


class NetworkDisabled(PermissionError):
    pass


class FileAccessDisabled(PermissionError):
    pass


def deny_network(what: str) -> NoReturn:
    attempts.append(what)
    raise NetworkDisabled(f"network access is disabled in the aligner sandbox ({what})")


class BlockedSocket:
    def __new__(cls, *args: Any, **kwargs: Any) -> "BlockedSocket":
        deny_network("socket.socket")


def _blocked(name: str) -> Callable[..., NoReturn]:
    def stub(*args: Any, **kwargs: Any) -> NoReturn:
        deny_network(f"socket.{name}")
    return stub


def block_network() -> None:
    import _socket
    import socket

    for mod in (socket, _socket):
        for name in ("socket", "SocketType"):
            if hasattr(mod, name):
                setattr(mod, name, BlockedSocket)
        for name in ("create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo", "gethostbyname",
                     "gethostbyname_ex", "gethostbyaddr", "getnameinfo"):
            if hasattr(mod, name):
                setattr(mod, name, _blocked(name))


def deny_open(*args: Any, **kwargs: Any) -> NoReturn:
    raise FileAccessDisabled("file access is disabled in the aligner sandbox")


def call_align(fn: Callable[..., Any], *args: Any) -> Any:
    """Run aligner code with files blocked; any failure is reported (and ends the child)."""
    builtins.open = deny_open  # type: ignore[assignment]
    try:
        out = fn(*args)
    except MemoryError as e:
        builtins.open = _open
        report("memory", e)
    except NetworkDisabled as e:
        builtins.open = _open
        report("network", e)
    except BaseException as e:
        builtins.open = _open
        report("network" if attempts else "exception", e)
    builtins.open = _open
    if attempts:
        report("network", message=f"network access is disabled in the aligner sandbox ({attempts[0]}; the aligner "
                                  "caught the error)")
    return out


def main() -> None:
    global JOB
    with _open("runner.json") as f:
        runner = json.load(f)
    for p in reversed(runner["paths"]):     # first: the parent's numpy, not another one the interpreter sees
        if p not in sys.path:
            sys.path.insert(0, p)
    jobs = int(runner.get("jobs", 1))
    try:
        import numpy as np
        from safetensors.numpy import load_file, save_file
        with _open("aligner.py") as f:
            src = f.read()
    except MemoryError as e:
        report("memory", e)
    except BaseException as e:
        report("load", e)

    block_network()
    linecache.cache["<aligner>"] = (len(src), None, src.splitlines(True), "<aligner>")
    namespace: dict[str, Any] = {"__name__": "aligner"}
    call_align(lambda: exec(compile(src, "<aligner>", "exec"), namespace))
    align = namespace.get("align")
    if not callable(align):
        report("contract", message="the source defines no function `align`")

    # One job at a time: load its inputs (the loaders do not go through builtins.open), align, write, drop.
    for JOB in range(jobs):
        try:
            target = load_file(f"job{JOB}.target.safetensors")
            reference = load_file(f"job{JOB}.reference.safetensors")
            with _open(f"job{JOB}.meta.json") as f:
                meta = json.load(f)
        except MemoryError as e:
            report("memory", e)
        except BaseException as e:
            report("load", e)
        out = call_align(align, target, reference, meta)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            report("contract", message=f"align returned {type(out).__name__}, not a (target, reference) pair of "
                                       "arrays")
        arrays = {}
        for side, value in zip(("target", "reference"), out):
            try:
                a = np.asarray(value)
            except BaseException as e:
                report("contract", message=f"align's {side} result is not an array: {e}")
            if a.dtype.kind not in "fiub":
                report("contract", message=f"align's {side} result has dtype {a.dtype}, not a real number type")
            arrays[side] = np.ascontiguousarray(a, dtype=np.float32)
        try:
            save_file(arrays, f"job{JOB}.out.safetensors")
        except MemoryError as e:
            report("memory", e)
        del target, reference, meta, out, arrays


if __name__ == "__main__":
    main()
