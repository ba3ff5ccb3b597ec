"""Whether a capture run is in progress among some processes' command lines: a fresh ``run_process``, or the warm
run host (starting, or with a forked child, whose command line is the host's own)."""

from __future__ import annotations


def capture_running(cmdlines: list[str]) -> bool:
    return any("ekka_core.capture.run_process" in c or "ekka_core.capture.run_host" in c for c in cmdlines)
