"""``python -m server``: the Ekka language server over stdio.

stdout is the LSP channel: the original stdout is kept for the protocol and file descriptor 1 is pointed at
stderr, so a stray ``print`` (ours or a library's) lands in the client's output channel instead of corrupting
JSON-RPC. Logging goes to stderr.
"""

from __future__ import annotations

import logging
import os
import sys


def main() -> int:
    logging.basicConfig(level=os.environ.get("EKKA_SERVER_LOG", "WARNING").upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    proto_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    from server.server import server

    server.start_io(sys.stdin.buffer, proto_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
