"""Agent/user-written aligners: the template's static validation, the sandboxed runner and its self-checks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from ekka_core.align import AlignmentError
from ekka_core.align.sandbox import (ENV_FIXED, ENV_KEEP, SANDBOX_ENV, SandboxUnavailable, run_aligner,
                                     run_self_checks, sanitized_env)
from ekka_core.align.template import TEMPLATE, declared_checks, validate_source

# A fused qkv projection: 4 query heads and 2 kv heads of 64 → q 256, k 128, v 128 wide; 2 sequences × 8 positions.
SIZES = [256, 128, 128]
SEQS, POS = 2, 8
ROWS = SEQS * POS


@pytest.fixture(scope="module")
def qkv():
    """Target: vLLM-style flat [tokens, 512] in decode order (seq0 pos0, seq1 pos0, seq0 pos1, …).
    Reference: HF-style separate q/k/v, each [sequences, positions, width]."""
    rng = np.random.default_rng(0)
    ref = {n: rng.standard_normal((SEQS, POS, w)).astype(np.float32) for n, w in zip("qkv", SIZES)}
    seq = [s for p in range(POS) for s in range(SEQS)]
    pos = [p for p in range(POS) for s in range(SEQS)]
    fused = np.concatenate([ref[n][seq, pos] for n in "qkv"], axis=-1)
    meta = {"rows": ROWS, "num_tokens": ROWS, "split_sizes": SIZES, "num_heads": 4, "num_kv_heads": 2,
            "head_dim": 64, "target_seq": seq, "target_pos": pos}
    return {"out0": fused}, ref, meta


CORRECT = '''
import numpy as np

SELF_CHECKS = ["shape", "row_sums", "col_sums"]


def align(target, reference, meta):
    qkv = target["out0"]
    q, k, v = np.split(qkv, np.cumsum(meta["split_sizes"])[:-1], axis=-1)
    seq, pos = meta["target_seq"], meta["target_pos"]
    ref = np.concatenate([reference[n][seq, pos] for n in ("q", "k", "v")], axis=-1)
    return np.concatenate([q, k, v], axis=-1), ref
'''


def test_correct_qkv_aligner_returns_equal_arrays(qkv):
    target, reference, meta = qkv
    t0 = time.monotonic()
    res = run_aligner(CORRECT, target, reference, meta)
    assert time.monotonic() - t0 < 5
    assert res.target.shape == (ROWS, 512) and res.target.dtype == np.float32
    np.testing.assert_array_equal(res.target, res.reference)
    assert res.checks == {"shape": True, "finite": True, "row_sums": True, "col_sums": True}


def test_q_and_k_split_swapped_caught_by_shape(qkv):
    """Split sizes [128, 256, 128] (q and k swapped): comparing q gives a 128-wide target against 256."""
    src = CORRECT.replace('meta["split_sizes"]', "[128, 256, 128]").replace(
        "return np.concatenate([q, k, v], axis=-1), ref", 'return q, reference["q"][seq, pos]')
    with pytest.raises(AlignmentError, match=r"shape: target is \[16, 128\] but reference is \[16, 256\]"):
        run_aligner(src, *qkv)


def test_q_and_k_swapped_caught_by_col_sums_not_row_sums(qkv):
    """Reading the fused output as k|q|v permutes features within each row: same shape, same row sums — only
    the per-feature fingerprint sees it."""
    src = CORRECT.replace("q, k, v = np.split(qkv, np.cumsum(meta[\"split_sizes\"])[:-1], axis=-1)",
                          "k, q, v = np.split(qkv, [128, 384], axis=-1)")
    assert src != CORRECT
    with pytest.raises(AlignmentError) as e:
        run_aligner(src, *qkv)
    assert "col_sums" in str(e.value) and "features do not line up" in str(e.value)
    assert "row_sums" not in str(e.value) and "shape" not in str(e.value)
    assert e.value.checks == {"shape": True, "finite": True, "row_sums": True, "col_sums": False}


def test_rows_in_wrong_order_caught_by_row_sums(qkv):
    """Flattening the reference sequence-major while the target is in decode order misaligns the rows."""
    src = CORRECT.replace("reference[n][seq, pos]", "reference[n].reshape(-1, reference[n].shape[-1])")
    assert src != CORRECT
    with pytest.raises(AlignmentError, match=r"row_sums: per-row sums .* correlate at r=.*rows do not line up"):
        run_aligner(src, *qkv)


def test_infinite_loop_times_out(qkv):
    src = "def align(target, reference, meta):\n    while True:\n        pass\n"
    t0 = time.monotonic()
    with pytest.raises(AlignmentError, match=r"timed out after 1\.5 s"):
        run_aligner(src, *qkv, timeout_s=1.5)
    assert time.monotonic() - t0 < 1.5 + 2


def test_allocating_4gb_is_a_memory_error(qkv):
    src = "import numpy as np\n\ndef align(target, reference, meta):\n    x = np.ones(1 << 30, np.float32)\n" \
          "    return x, x\n"
    with pytest.raises(AlignmentError, match=r"exceeded its memory limit \(1024 MB\).*MemoryError.*line 4"):
        run_aligner(src, *qkv, memory_mb=1024)


NETWORK = '''
import socket


def align(target, reference, meta):
    socket.create_connection(("127.0.0.1", 9))
'''


def test_network_is_rejected_statically_and_blocked_at_run_time(qkv):
    with pytest.raises(AlignmentError, match=r"static validation.*import of `socket`.*network"):
        run_aligner(NETWORK, *qkv)
    # The sandbox blocks it even when the static check is bypassed…
    with pytest.raises(AlignmentError, match=r"network access.*socket\.create_connection"):
        run_aligner(NETWORK, *qkv, validate=False)
    # …and also when the aligner swallows the error and returns a plausible result.
    swallowed = NETWORK.replace('    socket.create_connection(("127.0.0.1", 9))',
                                '    try:\n        socket.socket()\n    except OSError:\n        pass\n'
                                '    return target["out0"], target["out0"]')
    with pytest.raises(AlignmentError, match=r"network access.*socket\.socket.*caught"):
        run_aligner(swallowed, *qkv, validate=False)


def test_open_is_rejected_statically_and_blocked_at_run_time(qkv):
    src = "def align(target, reference, meta):\n    return open('/etc/passwd').read()\n"
    with pytest.raises(AlignmentError, match=r"static validation: line 2: `open` is not allowed"):
        run_aligner(src, *qkv)
    with pytest.raises(AlignmentError, match=r"FileAccessDisabled: file access is disabled"):
        run_aligner(src, *qkv, validate=False)


def test_dunder_import_is_rejected_statically(qkv):
    src = "def align(target, reference, meta):\n    os = __import__('os')\n    return os.environ, 1\n"
    with pytest.raises(AlignmentError, match=r"static validation: line 2: `__import__` is not allowed"):
        run_aligner(src, *qkv)


def test_exception_message_surfaces(qkv):
    src = "def align(target, reference, meta):\n    x = 1\n    raise ValueError(f'split sizes {meta[\"split_sizes\"]}" \
          " do not add up')\n"
    with pytest.raises(AlignmentError,
                       match=r"aligner raised ValueError: split sizes \[256, 128, 128\] do not add up "
                             r"\(aligner line 3\)"):
        run_aligner(src, *qkv)


def test_bad_return_and_nan_are_caught(qkv):
    with pytest.raises(AlignmentError, match=r"contract: align returned int"):
        run_aligner("def align(target, reference, meta):\n    return 1\n", *qkv)
    nan = "import numpy as np\n\ndef align(target, reference, meta):\n    t = target['out0'].copy()\n" \
          "    t[0, 0] = np.nan\n    return t, target['out0']\n"
    with pytest.raises(AlignmentError, match=r"finite: the target result has NaN/inf although no input did"):
        run_aligner(nan, *qkv)
    # NaN already in the inputs is not the aligner's fault.
    target, reference, meta = qkv
    poisoned = {"out0": target["out0"].copy()}
    poisoned["out0"][0, 0] = np.nan
    res = run_aligner("def align(target, reference, meta):\n    return target['out0'], target['out0']\n",
                      poisoned, reference, meta)
    assert res.checks["finite"] and np.isnan(res.target[0, 0])


def test_env_sanitizer_drops_secrets(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-secret")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("LANG", "C.UTF-8")
    env = sanitized_env()
    assert "ANTHROPIC_API_KEY" not in env and "HF_TOKEN" not in env
    assert "sk-ant-secret" not in env.values()
    assert set(env) <= set(ENV_KEEP) | set(ENV_FIXED)
    assert env["LANG"] == "C.UTF-8" and env["PATH"]
    assert sanitized_env({"ANTHROPIC_API_KEY": "x", "PATH": "/bin"})["PATH"] == "/bin"


def test_child_sees_no_secret_and_runs_under_limits(qkv, monkeypatch):
    """Bypassing the static check (which forbids importing os), look inside the child."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-secret")
    src = '''
import os, resource, sys
import numpy as np


def align(target, reference, meta):
    facts = [float("ANTHROPIC_API_KEY" in os.environ), float(len(set(os.environ) - set(meta["allowed"]))),
             resource.getrlimit(resource.RLIMIT_AS)[0] / 2**20, resource.getrlimit(resource.RLIMIT_CPU)[0],
             resource.getrlimit(resource.RLIMIT_NOFILE)[0], float("torch" in sys.modules or "ekka_core" in sys.modules)]
    a = np.array([facts], np.float32)
    return a, a
'''
    target, reference, meta = qkv
    meta = {k: v for k, v in meta.items() if k != "rows"}
    # bwrap adds PWD (its --chdir) and, for a libpython outside /usr/lib, LD_LIBRARY_PATH.
    meta["allowed"] = [*ENV_KEEP, *ENV_FIXED, "PWD", "LD_LIBRARY_PATH"]
    res = run_aligner(src, target, reference, meta, timeout_s=3, memory_mb=768, validate=False)
    secret, extra_env, mem_mb, cpu, nofile, heavy = res.target[0].tolist()
    assert secret == 0 and extra_env == 0
    assert (mem_mb, cpu, nofile) == (768, 4, 64)
    assert heavy == 0           # the child imports neither Ekka nor torch


def test_template_validates_and_runs():
    assert validate_source(TEMPLATE) == []
    assert declared_checks(TEMPLATE) == ["shape", "row_sums"]
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    res = run_aligner(TEMPLATE, {"out0": x}, {"out0": x[None]}, {"rows": 6})
    np.testing.assert_array_equal(res.target, x)
    np.testing.assert_array_equal(res.reference, x)


@pytest.mark.parametrize("src, problem", [
    ("import os\ndef align(target, reference, meta):\n    return 1, 1\n", "import of `os` is not allowed"),
    ("from numpy import load\ndef align(target, reference, meta):\n    return 1, 1\n", "importing `load`"),
    ("import numpy as np\ndef align(target, reference, meta):\n    return np.load('x.npy'), 1\n", "`.load`"),
    ("def align(target, reference, meta):\n    return ().__class__.__bases__, 1\n",
     "dunder attribute `.__class__`"),
    ("X = 1\ndef align(target, reference, meta):\n    global X\n    return X, X\n", "`global` statements"),
    ("def align(target, reference, meta):\n    return eval('1'), exec('1')\n", "`eval` is not allowed"),
    ("def align(target, reference, meta):\n    return getattr(target, 'x'), 1\n", "`getattr` is not allowed"),
    ("def align(target, meta):\n    return 1, 1\n", "exactly (target, reference, meta)"),
    ("def aligner(target, reference, meta):\n    return 1, 1\n", "no top-level `def align"),
    ("print('hi')\ndef align(target, reference, meta):\n    return 1, 1\n", "top-level Expr statement"),
    ("SELF_CHECKS = ['shape', 'vibes']\ndef align(target, reference, meta):\n    return 1, 1\n",
     "unknown self-check 'vibes'"),
    ("def align(target, reference, meta)\n    return 1, 1\n", "syntax error at line 1"),
])
def test_validate_source_problems(src, problem):
    problems = validate_source(src)
    assert any(problem in p for p in problems), problems


def test_self_checks_directly():
    a = np.random.default_rng(1).standard_normal((10, 6)).astype(np.float32)
    assert run_self_checks(a, a.copy(), ["row_sums", "col_sums"], rows=10) == (
        {"shape": True, "finite": True, "row_sums": True, "col_sums": True}, [])
    checks, failures = run_self_checks(a, a, [], rows=12)
    assert checks["shape"] is False and failures == ["shape: 10 rows but meta['rows'] is 12"]
    checks, failures = run_self_checks(a[None], a[None], [])
    assert not checks["shape"] and "expected 2-D" in failures[0]



# --- the OS boundary (bubblewrap) ------------------------------------------------------------------------------
# Each probe bypasses the static checks (validate=False) and reads, lists or connects by a route the Python-level
# stubs do not cover; under the sandbox it must fail, and with the boundary off (EKKA_ALIGNER_SANDBOX=rlimits-only)
# the same code must succeed — which shows each test can fail.
PROBE = """
import ctypes, io, json, os, struct
import numpy as np


def libc():
    return ctypes.CDLL("libc.so.6", use_errno=True)


def libc_read(path):
    c = libc()
    fd = c.open(path.encode(), os.O_RDONLY)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "libc open failed", path)
    buf = ctypes.create_string_buffer(1 << 16)
    n = c.read(fd, buf, len(buf))
    if n < 0:
        raise OSError(ctypes.get_errno(), "libc read failed", path)
    return buf.raw[:n]


def libc_connect(port):
    c = libc()
    fd = c.socket(2, 1, 0)                      # AF_INET, SOCK_STREAM: not through the socket module's stubs
    addr = struct.pack("<H", 2) + struct.pack(">H", port) + bytes([127, 0, 0, 1]) + bytes(8)
    rc = c.connect(fd, addr, len(addr))
    return json.dumps([fd, rc, ctypes.get_errno()]).encode()


def probe(meta):
BODY


def align(target, reference, meta):
    data = bytes(probe(meta)) or b"-"
    a = np.frombuffer(data, np.uint8).astype(np.float32)[None]
    return a, a
"""

READERS = {
    "numpy": "return np.lib._datasource.open(meta['path'], 'rb').read()",     # issue 23 item 7
    "builtins.open": "return open(meta['path'], 'rb').read()",
    "io.open": "return io.open(meta['path'], 'rb').read()",                  # the same open, past the stub
    "os": "fd = os.open(meta['path'], os.O_RDONLY)\nreturn os.read(fd, 1 << 16)",
    "ctypes": "return libc_read(meta['path'])",
}
SECRET = "ekka-sandbox-secret-4b1d9e"
X = {"x": np.zeros((1, 1), np.float32)}


def run_probe(body: str, **meta) -> bytes:
    src = PROBE.replace("BODY", textwrap.indent(body, "    "))
    res = run_aligner(src, X, X, meta, validate=False)
    return res.target[0].astype(np.uint8).tobytes()


@pytest.fixture
def secret_file(tmp_path):
    f = tmp_path / "secret.txt"
    f.write_text(SECRET)
    return f


def _passwd_marker() -> str:
    return Path("/etc/passwd").read_text().splitlines()[0]


@pytest.mark.parametrize("how", READERS)
@pytest.mark.parametrize("target", ["secret", "passwd"])
def test_sandbox_cannot_read_host_files(how, target, secret_file):
    path, marker = (str(secret_file), SECRET) if target == "secret" else ("/etc/passwd", _passwd_marker())
    with pytest.raises(AlignmentError, match=r"aligner raised \w+") as e:
        run_probe(READERS[how], path=path)
    assert marker not in str(e.value) and marker not in (e.value.fix or "")


@pytest.mark.parametrize("how", [h for h in READERS if h != "builtins.open"])   # that one the stub blocks too
def test_without_the_boundary_the_same_code_reads_the_file(how, secret_file, monkeypatch):
    """The tests' power: with the opt-out every probe above reads the secret, and the run says so."""
    monkeypatch.setenv(SANDBOX_ENV, "rlimits-only")
    with pytest.warns(RuntimeWarning, match="without the bubblewrap boundary"):
        assert SECRET in run_probe(READERS[how], path=str(secret_file)).decode()
        assert _passwd_marker() in run_probe(READERS[how], path="/etc/passwd").decode()


def test_sandbox_lists_no_host_directory(secret_file, monkeypatch):
    """os.listdir of the repository and of the secret's dir fail; "/" holds only the read-only binds and /job,
    the one writable place (the working dir)."""
    repo = str(Path(__file__).resolve().parents[2])
    body = ("out = []\nfor p in meta['dirs']:\n    try:\n        out.append(sorted(os.listdir(p)))\n"
            "    except OSError as e:\n        out.append(type(e).__name__)\n"
            "try:\n    io.open('/written', 'w')\n    ro = 'writable'\nexcept OSError as e:\n    ro = e.strerror\n"
            "io.open('written', 'w').write('ok')\n"
            "return json.dumps([out, sorted(os.listdir('/')), ro]).encode()")
    dirs = [repo, str(secret_file.parent), "/etc", "/home", "/tmp"]
    listed, root, ro = __import__("json").loads(run_probe(body, dirs=dirs))
    assert listed == ["FileNotFoundError"] * len(dirs)
    assert set(root) <= {"usr", "lib", "lib32", "lib64", "libx32", "proc", "dev", "job", "ekka",
                         Path(sys.base_prefix).parts[1], Path(os.path.realpath(sys.executable)).parts[1]}, root
    assert ro == "Read-only file system"
    monkeypatch.setenv(SANDBOX_ENV, "rlimits-only")
    with pytest.warns(RuntimeWarning):
        listed, _, _ = __import__("json").loads(run_probe(body, dirs=dirs[:2]))
    assert "secret.txt" in listed[1] and isinstance(listed[0], list)


def test_sandbox_has_no_network(monkeypatch):
    """A TCP connect to a port the test listens on, made through libc (past the socket stubs), never arrives."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.5)
        port = server.getsockname()[1]
        fd, rc, errno = __import__("json").loads(run_probe("return libc_connect(meta['port'])", port=port))
        assert fd >= 0 and rc == -1 and errno == 111             # ECONNREFUSED: the sandbox's own loopback
        with pytest.raises(socket.timeout):
            server.accept()
        monkeypatch.setenv(SANDBOX_ENV, "rlimits-only")
        with pytest.warns(RuntimeWarning):
            _, rc, _ = __import__("json").loads(run_probe("return libc_connect(meta['port'])", port=port))
        assert rc == 0
        server.accept()[0].close()


def test_sandbox_cannot_see_host_processes(monkeypatch):
    marker = f"ekka-sandbox-marker-{os.getpid()}"
    body = ("seen, n = 0, 0\nfor p in os.listdir('/proc'):\n    if p.isdigit():\n        n += 1\n        try:\n"
            "            seen += meta['marker'].encode() in io.open(f'/proc/{p}/cmdline', 'rb').read()\n"
            "        except OSError:\n            pass\nreturn json.dumps([n, seen]).encode()")
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        n, seen = __import__("json").loads(run_probe(body, marker=marker))
        assert seen == 0 and n <= 3                              # bwrap's init and the child
        monkeypatch.setenv(SANDBOX_ENV, "rlimits-only")
        with pytest.warns(RuntimeWarning):
            n, seen = __import__("json").loads(run_probe(body, marker=marker))
        assert seen == 1 and n > 3
    finally:
        helper.kill()
        helper.wait()


TRIVIAL = "def align(target, reference, meta):\n    return target['x'], target['x']\n"


def test_refused_without_bwrap_unless_opted_out(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))                   # no bwrap on PATH
    with pytest.raises(SandboxUnavailable, match=r"aligner refused.*bubblewrap \(bwrap\).*not installed") as e:
        run_aligner(TRIVIAL, X, X)
    assert "apt-get install bubblewrap" in e.value.fix and f"{SANDBOX_ENV}=rlimits-only" in e.value.fix
    monkeypatch.setenv(SANDBOX_ENV, "rlimits-only")
    with pytest.warns(RuntimeWarning, match="rlimits-only"):
        assert run_aligner(TRIVIAL, X, X).sandbox == "rlimits-only"
    monkeypatch.setenv(SANDBOX_ENV, "none")
    with pytest.raises(AlignmentError, match=r"EKKA_ALIGNER_SANDBOX='none' is not a sandbox mode"):
        run_aligner(TRIVIAL, X, X)


def test_refused_when_bwrap_cannot_create_namespaces(tmp_path, monkeypatch):
    """What bwrap says where user namespaces are off (a fake bwrap here): the aligner is refused, never run."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace, likely because the kernel "
                    "does not allow non-privileged user namespaces.' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(SandboxUnavailable, match=r"could not set up the aligner sandbox.*No permissions to creating "
                                                 r"new namespace") as e:
        run_aligner(TRIVIAL, X, X)
    assert "user namespaces" in e.value.fix


def test_sandboxed_run_records_its_boundary():
    assert run_aligner(TRIVIAL, X, X).sandbox == "bwrap"
