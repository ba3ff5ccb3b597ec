"""Entry point of the Ekka language server bundled in the VS Code extension (copied to bundled/tool/).

The extension runs ``<ekka.interpreter> <extension>/bundled/tool/lsp_server.py``. The server's code (``server/``,
next to this file) and its pure-Python dependencies plus the light part of ``ekka_core`` (``bundled/libs``) are
put ahead of the interpreter's own site-packages, so the server runs with the versions it was packaged and
tested with. ``bundled/libs`` goes on ``sys.path`` only — not on ``PYTHONPATH`` — so the diagnosis worker the
server starts (``-m server.engine_process``, the user's interpreter) imports the full ``ekka_core``, torch and the engine
from the user's environment.
"""

import os
import sys

_tool = os.path.dirname(os.path.abspath(__file__))
_libs = os.path.join(os.path.dirname(_tool), "libs")
for _p in (_libs, _tool):
    if _p in sys.path:
        sys.path.remove(_p)
sys.path[0:0] = [_tool, _libs]

if sys.version_info < (3, 11):
    sys.stderr.write(f"Ekka's language server needs Python 3.11 or newer; {sys.executable} is "
                     f"{sys.version.split()[0]}. Set `ekka.interpreter` to a newer Python.\n")
    sys.exit(2)

from server.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
