"""Run an untrusted aligner (agent- or user-written, see :mod:`ekka_core.align.template`) outside Ekka's process.

:func:`run_aligner` validates the source statically, then runs it in a fresh ``python -I`` subprocess:

* inputs go through a private temp dir as **safetensors** (``job<n>.target.safetensors``,
  ``job<n>.reference.safetensors``) plus ``job<n>.meta.json`` — never pickle, in either direction; the results come
  back as ``job<n>.out.safetensors``. :func:`run_aligner_jobs` runs one aligner on several inputs (the align stage:
  every sequence, against both reference runs) in *one* child, loading one job at a time;
* the child is a standalone script, :mod:`ekka_core.align.sandbox_child`, run by its file path with the temp
  dir as its working directory; it imports only numpy and safetensors — not Ekka, not torch — so it starts in
  ~0.2 s and needs ~100 MB of address space;
* the child runs under an OS boundary, **bubblewrap** (``bwrap``, :func:`bwrap_argv`): new user, mount, pid,
  network, ipc, uts and cgroup namespaces (``--unshare-all``), all capabilities dropped, its own session
  (``--new-session``), killed with its parent (``--die-with-parent``). Its root is an empty tmpfs, remounted
  read-only, holding only read-only binds of what the child needs: ``/usr/lib*`` and ``/lib*`` (libc, libm,
  libstdc++…), the interpreter's binary, its standard library and ``libpython`` at their own paths (the standard
  library's ``site-packages`` hidden under an empty tmpfs), the numpy and safetensors package dirs (and
  ``numpy.libs``, numpy's bundled BLAS) at ``/ekka/site``, and the child script at ``/ekka/sandbox_child.py``.
  The job's temp dir is the one writable place, bound at ``/job`` and used as the working directory; ``/proc``
  is the sandbox's own (its processes only) and ``/dev`` a minimal one (null, zero, urandom…). No ``/etc``,
  ``/home``, ``/root`` (beyond the interpreter's own files), ``/work``, ``/tmp`` or ``/sys`` of the host; no
  network (an own network namespace holding only a loopback); no host process visible. File reads that get past
  the Python-level stubs below — ``numpy``'s own file I/O, ``os``, ``ctypes`` into libc — find nothing to read;
* ``preexec_fn`` sets rlimits (inherited through ``bwrap``): address space = ``memory_mb``, CPU time ≈
  ``timeout_s``, 64 open files, files written ≤ ``memory_mb``, no core dumps; the child gets its own session so
  the whole process group is killed on the wall-clock timeout (``bwrap`` dies, and the sandbox with it);
* the environment is replaced by :func:`sanitized_env` (no API keys or tokens, ``--clearenv`` inside the sandbox);
* before the aligner's code runs, the child replaces ``socket.socket``, ``socket.create_connection`` and the
  name-resolution functions (in ``socket`` and ``_socket``) and ``builtins.open`` with stubs that raise; a network
  attempt fails the run even when the aligner swallowed the exception. These stubs, the rlimits and the static
  checks (no imports besides numpy/math, no ``open``/``exec``/``getattr``/dunder access, no numpy file I/O) are
  defence in depth and clear error messages for an honest-but-wrong aligner; the namespaces are the boundary.

Then the self-checks (``shape`` and ``finite`` always, plus those the source declares in ``SELF_CHECKS``) run in
the parent on the returned fp32 arrays. Every failure raises :class:`~ekka_core.align.AlignmentError` naming what
failed.

The boundary is what Linux namespaces give an unprivileged process: it keeps the aligner away from the user's
files, network and processes. There is no seccomp filter, so the whole kernel system-call surface stays reachable
(a kernel exploit is out of scope), and what the binds expose — system libraries, the interpreter, numpy — is
readable (but holds no user data). Without a working ``bwrap`` (not installed, or the host forbids user
namespaces: ``sysctl kernel.unprivileged_userns_clone``, ``user.max_user_namespaces``, Ubuntu's AppArmor
restriction, or a container's seccomp profile) untrusted aligner code is **refused** with
:class:`SandboxUnavailable`, naming the fix. Setting ``EKKA_ALIGNER_SANDBOX=rlimits-only`` runs it anyway without
the namespaces (rlimits, stubs and static checks only — *not* a security boundary: code that evades the static
checks can read any file the user can); every such run warns and records ``sandbox="rlimits-only"`` in its
:class:`AlignerResult` (``"bwrap"`` otherwise).

Run directly, this module runs one aligner on the safetensors files in a directory (a debugging aid)::

    python -m ekka_core.align.sandbox --run DIR   # DIR holds aligner.py, target/reference.safetensors, meta.json
"""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
from safetensors.numpy import load_file, save_file

from ekka_core.align import AlignmentError
from ekka_core.align.template import ALWAYS_CHECKS, declared_checks, validate_source

# Environment variables the child keeps from the parent (PYTHONPATH is ignored under -I; the import paths of
# numpy and safetensors are handed over explicitly instead). Everything else — API keys, tokens — is dropped.
ENV_KEEP = ("PATH", "PYTHONPATH", "LANG")
# Set in the child: one BLAS thread keeps the address space small and the run deterministic.
ENV_FIXED = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LC_ALL": "C.UTF-8"}
MAX_OPEN_FILES = 64
# The child script, run by its path (``-I``: neither its directory nor the user's site-packages on sys.path).
CHILD = Path(__file__).resolve().with_name("sandbox_child.py")
LOG_TAIL = 20_000            # characters of the child's stdout+stderr kept in the result / error
CORRELATION_MIN = 0.9        # row_sums / col_sums threshold

# Which boundary the child runs under: "bwrap" (the default) or "rlimits-only" (an explicit opt-out, see above).
SANDBOX_ENV = "EKKA_ALIGNER_SANDBOX"
SANDBOX_MODES = ("bwrap", "rlimits-only")
# Paths inside the bubblewrap sandbox.
JOB_DIR = "/job"                          # the job's temp dir, read-write, the working directory
SITE_DIR = "/ekka/site"                   # numpy, numpy.libs, safetensors (read-only)
CHILD_IN_SANDBOX = "/ekka/sandbox_child.py"
SANDBOX_FIX = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; scripts/setup.sh does) and allow "
               "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces "
               "> 0; Ubuntu 24.04: kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for bwrap; "
               f"in a container: a seccomp profile that allows unshare) — or set {SANDBOX_ENV}=rlimits-only to run "
               "aligners without that boundary (rlimits and static checks only; they can then read your files)")


class SandboxUnavailable(AlignmentError):
    """The bubblewrap boundary cannot be set up here, and the rlimits-only opt-out is not set: the aligner is
    refused, not run."""


@dataclass
class AlignerResult:
    target: np.ndarray                        # [rows, features] fp32
    reference: np.ndarray                     # same shape
    checks: dict[str, bool] = field(default_factory=dict)   # self-check -> passed (all True when returned)
    stderr: str = ""                          # the child's stdout and stderr, last LOG_TAIL characters
    seconds: float = 0.0                      # wall time of the child process
    sandbox: str = "bwrap"                    # the boundary it ran under: "bwrap" or "rlimits-only" (SANDBOX_ENV)


def sandbox_mode(environ: Mapping[str, str] | None = None) -> str:
    """The boundary aligners run under, from :data:`SANDBOX_ENV` (unset or empty: ``"bwrap"``)."""
    mode = (os.environ if environ is None else environ).get(SANDBOX_ENV, "").strip() or "bwrap"
    if mode not in SANDBOX_MODES:
        raise AlignmentError(f"{SANDBOX_ENV}={mode!r} is not a sandbox mode",
                             fix=f"set it to one of {', '.join(SANDBOX_MODES)} (or leave it unset: bwrap)")
    return mode


def sanitized_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's whole environment: :data:`ENV_KEEP` copied from ``environ`` (default ``os.environ``) plus
    :data:`ENV_FIXED`. Nothing else crosses — in particular no ``*_API_KEY``, ``*_TOKEN`` or credentials."""
    src = os.environ if environ is None else environ
    env = {k: src[k] for k in ENV_KEEP if k in src}
    env.setdefault("PATH", "/usr/bin:/bin")
    env.update(ENV_FIXED)
    return env


@dataclass
class AlignerJob:
    """One input of an aligner: both sides' named tensors and the meta it gets; ``label`` names it in errors."""

    target: Mapping[str, np.ndarray]
    reference: Mapping[str, np.ndarray]
    meta: Mapping[str, Any] | None = None
    label: str = ""


def run_aligner(src: str, target: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
                meta: Mapping[str, Any] | None = None, *, timeout_s: float = 10, memory_mb: int = 1024,
                validate: bool = True) -> AlignerResult:
    """Run aligner source ``src`` on the two sides' named tensors in a sandboxed subprocess and self-check it.

    ``meta`` must be JSON-serialisable (numpy scalars and arrays are converted; tuples arrive as lists);
    ``target_shapes`` / ``reference_shapes`` are added when absent. ``timeout_s`` bounds the child's wall time
    (startup included, ~0.2 s); ``memory_mb`` its address space (inputs and Python included, ~100 MB).
    ``validate=False`` skips the static checks — only for testing the sandbox's own defences.
    Raises :class:`AlignmentError` on a rejected source, timeout, memory or CPU limit, an exception in ``align``,
    a bad return value or a failing self-check."""
    return run_aligner_jobs(src, [AlignerJob(target, reference, meta)], timeout_s=timeout_s, memory_mb=memory_mb,
                            validate=validate)[0]


def run_aligner_jobs(src: str, jobs: list[AlignerJob], *, timeout_s: float = 10, memory_mb: int = 1024,
                     validate: bool = True, declared: bool = True) -> list[AlignerResult]:
    """:func:`run_aligner` on several inputs in one child process (one start-up, one job in memory at a time);
    one result per job, in order. ``timeout_s`` and ``memory_mb`` bound the whole child. ``declared=False`` runs
    only the contract checks (``shape``, ``finite``), not the fingerprints ``SELF_CHECKS`` declares — for the
    align stage, where the target may be the buggy side and a fingerprint mismatch would be the bug, not a bad
    alignment. The first failing job raises :class:`AlignmentError`, its label in the message."""
    if validate:
        problems = validate_source(src)
        if problems:
            raise AlignmentError("aligner rejected by static validation: " + "; ".join(problems),
                                 fix="follow ekka_core.align.template.TEMPLATE: a pure function using only "
                                     "numpy and math")
    prepared = []
    for job in jobs:
        target = _as_arrays(job.target, "target")
        reference = _as_arrays(job.reference, "reference")
        meta = dict(job.meta or {})
        meta.setdefault("target_shapes", {k: list(v.shape) for k, v in target.items()})
        meta.setdefault("reference_shapes", {k: list(v.shape) for k, v in reference.items()})
        try:
            meta_json = json.dumps(meta, default=_jsonable)
        except (TypeError, ValueError) as e:
            raise AlignmentError(f"aligner meta is not JSON-serialisable: {e}") from e
        prepared.append((target, reference, meta, meta_json))
    checks_declared = declared_checks(src) if declared else []
    mode = sandbox_mode()
    bwrap = None
    if mode == "bwrap":
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxUnavailable("aligner refused: the aligner sandbox needs bubblewrap (bwrap), which is not "
                                     "installed", fix=SANDBOX_FIX)
    else:
        warnings.warn(f"{SANDBOX_ENV}=rlimits-only: the aligner runs without the bubblewrap boundary (rlimits and "
                      "Python-level stubs only; it can read any file you can)", RuntimeWarning, stacklevel=2)

    results = []
    with tempfile.TemporaryDirectory(prefix="ekka-aligner-") as tmp:
        d = Path(tmp)
        (d / "aligner.py").write_text(src)
        paths = [SITE_DIR] if bwrap else _import_paths()
        (d / "runner.json").write_text(json.dumps({"paths": paths, "jobs": len(prepared)}))
        for n, (target, reference, _, meta_json) in enumerate(prepared):
            (d / f"job{n}.meta.json").write_text(meta_json)
            save_file(target, str(d / f"job{n}.target.safetensors"))
            save_file(reference, str(d / f"job{n}.reference.safetensors"))
        rc, seconds, log = _spawn(d, timeout_s, memory_mb, bwrap)
        error = d / "error.json"
        if error.exists():
            info = json.loads(error.read_text())
            raise _on_job(_child_error(info, memory_mb, log), jobs, info.get("job"))
        if rc != 0:
            raise _crash_error(rc, timeout_s, memory_mb, log)
        for n, (target, reference, meta, _) in enumerate(prepared):
            out_path = d / f"job{n}.out.safetensors"
            if not out_path.exists():
                raise _on_job(AlignmentError("aligner process exited without writing its result" + _log_hint(log)),
                              jobs, n)
            out = load_file(str(out_path))
            t, r = out["target"], out["reference"]
            nonfinite_inputs = any(v.dtype.kind in "fc" and not np.isfinite(v).all()
                                   for v in (*target.values(), *reference.values()))
            checks, failures = run_self_checks(t, r, checks_declared, rows=meta.get("rows"),
                                               inputs_finite=not nonfinite_inputs)
            if failures:
                err = _on_job(AlignmentError("aligner self-check failed: " + "; ".join(failures) + _log_hint(log)),
                              jobs, n)
                err.checks = checks    # type: ignore[attr-defined]
                raise err
            results.append(AlignerResult(t, r, checks, log, seconds, mode))
    return results


def _on_job(err: AlignmentError, jobs: list[AlignerJob], n: int | None) -> AlignmentError:
    """Name the job in the message when there are several (a single job's errors read as before)."""
    if n is None or len(jobs) < 2 or not 0 <= n < len(jobs):
        return err
    label = jobs[n].label or f"job {n + 1} of {len(jobs)}"
    return AlignmentError(f"{label}: {err.message}", fix=err.fix)


def run_self_checks(t: np.ndarray, r: np.ndarray, declared: list[str], *, rows: int | None = None,
                    inputs_finite: bool = True) -> tuple[dict[str, bool], list[str]]:
    """Run ``shape`` and ``finite`` plus the ``declared`` checks on an aligned pair.

    Returns ``{check: passed}`` and one message per failure. ``row_sums`` / ``col_sums`` compare the per-row /
    per-feature sums of the two sides (Pearson r > 0.9, or near-equality when there are fewer than 3 values or no
    spread): a cheap fingerprint that both sides hold the same computation on the same rows / features. They are
    only meaningful on a known-correct fp32 pair — on a buggy target a low r is the bug, not the alignment — and
    ``row_sums`` cannot see features permuted within a row (``col_sums`` can), nor ``col_sums`` rows permuted."""
    checks: dict[str, bool] = {}
    failures: list[str] = []
    names = list(dict.fromkeys([*ALWAYS_CHECKS, *declared]))

    shape_problem = None
    if t.ndim != 2 or r.ndim != 2:
        shape_problem = f"expected 2-D [rows, features], got target {list(t.shape)} and reference {list(r.shape)}"
    elif t.shape != r.shape:
        shape_problem = f"target is {list(t.shape)} but reference is {list(r.shape)}"
    elif rows is not None and t.shape[0] != int(rows):
        shape_problem = f"{t.shape[0]} rows but meta['rows'] is {int(rows)}"
    checks["shape"] = shape_problem is None
    if shape_problem:
        failures.append(f"shape: {shape_problem}")

    bad = [side for side, a in (("target", t), ("reference", r)) if not np.isfinite(a).all()]
    checks["finite"] = not bad or not inputs_finite
    if not checks["finite"]:
        failures.append(f"finite: the {' and '.join(bad)} result has NaN/inf although no input did")

    for name, axis, what in (("row_sums", 1, "rows"), ("col_sums", 0, "features")):
        if name not in names:
            continue
        if shape_problem:
            checks[name] = False
            failures.append(f"{name}: not run, the shapes differ")
            continue
        ok, r_val = _agree(t.astype(np.float64).sum(axis=axis), r.astype(np.float64).sum(axis=axis))
        checks[name] = ok
        if not ok:
            how = f"correlate at r={r_val:.3f} (< {CORRELATION_MIN})" if r_val is not None else "differ"
            failures.append(f"{name}: per-{what[:-1]} sums of target and reference {how} — the {what} do not "
                            f"line up (this fingerprint assumes a known-correct fp32 pair)")
    return checks, failures


# ---------------------------------------------------------------------------------------------------------------
def _agree(a: np.ndarray, b: np.ndarray) -> tuple[bool, float | None]:
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return False, None
    if a.size < 3 or a.std() == 0 or b.std() == 0:
        scale = float(max(np.abs(a).max(initial=0), np.abs(b).max(initial=0)))
        return bool(np.allclose(a, b, rtol=1e-3, atol=1e-6 * scale + 1e-12)), None
    r = float(np.corrcoef(a, b)[0, 1])
    return r > CORRELATION_MIN, r


def _as_arrays(tensors: Mapping[str, np.ndarray], side: str) -> dict[str, np.ndarray]:
    out = {}
    for name, v in tensors.items():
        a = np.asarray(v)
        if not isinstance(name, str) or a.dtype.kind not in "fiub":
            raise AlignmentError(f"aligner input {side}[{name!r}] must be a numeric numpy array named by a string, "
                                 f"got dtype {a.dtype}")
        out[name] = np.ascontiguousarray(a)
    return out


def _jsonable(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"{type(x).__name__} is not JSON-serialisable")


def _import_paths() -> list[str]:
    """Directories holding numpy and safetensors, for a child that may not see the parent's PYTHONPATH."""
    import safetensors
    return list(dict.fromkeys(str(Path(m.__file__).resolve().parent.parent) for m in (np, safetensors)))


def _package_dirs() -> list[Path]:
    """The package dirs of numpy and safetensors, and numpy's bundled shared libraries (``numpy.libs``), if any."""
    import safetensors
    dirs = []
    for m in (np, safetensors):
        pkg = Path(m.__file__).resolve().parent
        dirs += [pkg] + [libs for libs in (pkg.with_name(pkg.name + ".libs"),) if libs.is_dir()]
    return list(dict.fromkeys(dirs))


def _interpreter_files() -> tuple[Path, list[Path], str | None]:
    """The real interpreter binary, what it needs to start (itself, its standard library, ``libpython`` when
    shared), and the dir of ``libpython`` when the loader must be told where it is (``LD_LIBRARY_PATH``)."""
    exe = Path(os.path.realpath(sys.executable))
    stdlib = Path(os.__file__).resolve().parent                    # lib/python3.X, lib-dynload inside
    files = [exe, stdlib]
    lib_dir = None
    libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if sysconfig.get_config_var("Py_ENABLE_SHARED") and libdir and soname and (Path(libdir) / soname).exists():
        files.append(Path(libdir) / soname)
        lib_dir = libdir
    return exe, files, lib_dir


def bwrap_argv(bwrap: str, job_dir: Path, env: Mapping[str, str]) -> list[str]:
    """The ``bwrap`` command line that runs the child on ``job_dir`` (see the module docstring for the layout)."""
    exe, interpreter, lib_dir = _interpreter_files()
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    bound: list[Path] = []

    def ro_bind(src: Path, dst: Path | str | None = None) -> None:
        dst = Path(dst or src)
        if dst == src and any(dst.is_relative_to(b) for b in bound):
            return                                                   # already inside a bound dir
        argv.extend(["--ro-bind", str(src), str(dst)])
        if dst == src:
            bound.append(src)

    links = []
    for top in ("/usr", ""):                                           # /usr/lib* first, then /lib* (often links)
        for name in ("lib", "lib32", "lib64", "libx32"):
            path = Path(f"{top}/{name}")
            if path.is_symlink():
                links += ["--symlink", os.readlink(path), str(path)]
            elif path.is_dir():
                ro_bind(path)
    argv += links
    for f in interpreter:
        ro_bind(f)
    site = interpreter[1] / "site-packages"
    if site.is_dir():
        argv += ["--tmpfs", str(site)]                                # the base interpreter's own packages: hidden
    for pkg in _package_dirs():
        ro_bind(pkg, f"{SITE_DIR}/{pkg.name}")
    ro_bind(CHILD, CHILD_IN_SANDBOX)
    argv += ["--bind", str(job_dir), JOB_DIR, "--chdir", JOB_DIR, "--proc", "/proc", "--dev", "/dev",
             "--remount-ro", "/", "--clearenv"]
    inner = {k: v for k, v in env.items() if k != "PYTHONPATH"} | {"PATH": "/usr/bin:/bin"}   # no host paths
    if lib_dir and not any(Path(lib_dir).is_relative_to(p) for p in ("/usr/lib", "/lib", "/usr/lib64", "/lib64")):
        inner["LD_LIBRARY_PATH"] = lib_dir                             # no /etc/ld.so.cache in the sandbox
    for k, v in inner.items():
        argv += ["--setenv", k, v]
    return argv + ["--", str(exe), "-I", "-B", CHILD_IN_SANDBOX]


def _limits(timeout_s: float, memory_mb: int) -> Callable[[], None]:
    mem = int(memory_mb) << 20
    cpu = int(math.ceil(timeout_s)) + 1

    def apply() -> None:                           # runs in the child between fork and exec
        for res, value, hard in ((resource.RLIMIT_AS, mem, mem), (resource.RLIMIT_CPU, cpu, cpu + 1),
                                 (resource.RLIMIT_NOFILE, MAX_OPEN_FILES, MAX_OPEN_FILES),
                                 (resource.RLIMIT_FSIZE, mem, mem), (resource.RLIMIT_CORE, 0, 0)):
            _, cur_hard = resource.getrlimit(res)
            if cur_hard != resource.RLIM_INFINITY:
                value, hard = min(value, cur_hard), min(hard, cur_hard)
            resource.setrlimit(res, (value, hard))
    return apply


def _spawn(d: Path, timeout_s: float, memory_mb: int, bwrap: str | None) -> tuple[int, float, str]:
    """Run the child in ``d`` — under ``bwrap`` when given, else with rlimits only; return (exit status, seconds,
    log tail). Raises AlignmentError on timeout, :class:`SandboxUnavailable` when bwrap cannot set up."""
    log_path = d / "log.txt"
    env = sanitized_env()
    argv = bwrap_argv(bwrap, d, env) if bwrap else [sys.executable, "-I", "-B", str(CHILD)]
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=d, env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, close_fds=True,
                                preexec_fn=_limits(timeout_s, memory_mb), start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            rc = None
        finally:
            _kill_group(proc)
        if rc is None:
            rc = proc.wait()
    seconds = time.monotonic() - start
    text = _tail(log_path)
    if bwrap and rc != 0 and not timed_out and not (d / "error.json").exists() and text.startswith("bwrap:"):
        raise SandboxUnavailable("aligner refused: bubblewrap could not set up the aligner sandbox on this host: "
                                 + text.strip().splitlines()[0][:500], fix=SANDBOX_FIX)
    if timed_out:
        raise AlignmentError(f"aligner timed out after {timeout_s:g} s (wall clock) and was killed"
                             + _log_hint(text), fix="align must finish quickly: vectorise with numpy, no loops "
                                                    "over elements")
    return rc, seconds, text


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)       # the child's own session: it and anything it started
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 4 * LOG_TAIL))
        return f.read().decode("utf-8", "replace")[-LOG_TAIL:]


def _log_hint(log: str) -> str:
    lines = [ln for ln in log.strip().splitlines() if ln.strip()]
    return f" [aligner output ends: {lines[-1].strip()[:300]}]" if lines else ""


def _child_error(info: dict, memory_mb: int, log: str) -> AlignmentError:
    kind = info.get("kind")
    what = f"{info.get('type', 'Error')}: {info.get('message', '')}".rstrip(": ")
    where = f" (aligner line {info['line']})" if info.get("line") else ""
    if kind == "memory":
        return AlignmentError(f"aligner exceeded its memory limit ({memory_mb} MB): {what}{where}",
                              fix="align must not allocate more than a few copies of its inputs")
    if kind == "network":
        return AlignmentError(f"aligner attempted network access, which the sandbox blocks: {info.get('message')}",
                              fix="an aligner is a pure function of its inputs")
    if kind == "contract":
        return AlignmentError(f"aligner broke the template contract: {info.get('message')}",
                              fix="align must return (target_array, reference_array), numeric, [rows, features]")
    if kind == "load":
        return AlignmentError(f"aligner sandbox failed to start: {what}" + _log_hint(log))
    return AlignmentError(f"aligner raised {what}{where}")


def _crash_error(rc: int, timeout_s: float, memory_mb: int, log: str) -> AlignmentError:
    last = _log_hint(log)
    if rc < 0:
        sig = signal.Signals(-rc)
        if sig == signal.SIGXCPU:
            return AlignmentError(f"aligner exceeded its CPU time limit (~{math.ceil(timeout_s) + 1} s)" + last)
        if sig == signal.SIGXFSZ:
            return AlignmentError(f"aligner exceeded the file size limit ({memory_mb} MB)" + last)
        return AlignmentError(f"aligner process was killed by {sig.name} (possibly its memory limit of "
                              f"{memory_mb} MB)" + last)
    if "MemoryError" in last:
        return AlignmentError(f"aligner exceeded its memory limit ({memory_mb} MB)" + last)
    return AlignmentError(f"aligner process failed with exit status {rc}" + last)


def _main(argv: list[str]) -> int:
    """``--run DIR``: run the aligner in DIR on its inputs (see the module docstring) and print the checks."""
    if len(argv) != 2 or argv[0] != "--run":
        print("usage: python -m ekka_core.align.sandbox --run DIR", file=sys.stderr)
        return 2
    d = Path(argv[1])
    meta_path = d / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    try:
        res = run_aligner((d / "aligner.py").read_text(), load_file(str(d / "target.safetensors")),
                          load_file(str(d / "reference.safetensors")), meta)
    except AlignmentError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 3
    print(json.dumps({"shape": list(res.target.shape), "checks": res.checks, "seconds": round(res.seconds, 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
