"""Language-server start-up: wall time from spawning ``python -m server`` to the ``initialize`` response and the
process's resident memory then (it must not import torch: the heavy work lives in the worker process).

    .venv/bin/python benchmarks/server_startup.py [N]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time


def _frame(obj: dict) -> bytes:
    body = json.dumps(obj).encode()
    return f"Content-Length: {len(body)}\r\n\r\n".encode() + body


def _read(proc: subprocess.Popen) -> dict:
    length = 0
    while True:
        line = proc.stdout.readline()
        if line in (b"\r\n", b""):
            break
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return json.loads(proc.stdout.read(length))


def once() -> tuple[float, int]:
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    proc.stdin.write(_frame({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                             "params": {"processId": None, "rootUri": None, "capabilities": {}}}))
    proc.stdin.flush()
    while True:
        msg = _read(proc)
        if msg.get("id") == 1:
            break
    elapsed = time.perf_counter() - t0
    rss_kb = next(int(line.split()[1]) for line in open(f"/proc/{proc.pid}/status") if line.startswith("VmRSS"))
    proc.kill()
    proc.wait()
    return elapsed, rss_kb


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    runs = [once() for _ in range(n)]
    print(f"start → initialize response: median {statistics.median(r[0] for r in runs):.2f} s over {n} runs")
    print(f"server RSS after initialize: median {statistics.median(r[1] for r in runs) / 1024:.0f} MiB")
