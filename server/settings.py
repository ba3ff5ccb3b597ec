"""The extension's settings, one typed object per workspace folder (ruff-vscode's ``getWorkspaceSettings``).

The extension sends ``initializationOptions: {settings: [WorkspaceSettings…], globalSettings: WorkspaceSettings}``
and the same object in ``workspace/didChangeConfiguration`` (``{settings: {ekka: {settings, globalSettings}}}``);
a job uses the settings of the workspace folder its file is in (the longest folder path that contains it), else the
global ones. The wire form is the settings' own names (see ``extension/src/settings.ts``, which mirrors this)::

    {"workspace": "/path/of/the/folder", "interpreter": "", "pythonInterpreter": "", "targetDefault": "vllm",
     "executor": "local", "remote": {"python": "python3", "workdir": "~/.cache/ekka-remote"}, "engineArgs": {}}

Older clients sent one untyped object (``{interpreter, executor, remote}``); it is read as the global settings.

**Which interpreter runs the engine process** (:func:`resolve_interpreter`; ``extension/src/interpreter.ts``
resolves the one that runs the language server with the same precedence), first match wins:

1. ``ekka.interpreter`` (trimmed; ``${workspaceFolder}`` replaced by the folder; an error without a folder);
2. the Python extension's interpreter for the folder (``pythonInterpreter``: the extension looks it up and sends
   it; empty when that extension is not installed or has none);
3. ``<folder>/.venv/bin/python`` (``.venv\\Scripts\\python.exe`` on Windows) when it exists;
4. the fallback: the interpreter running the language server here (which the extension chose by this same list);
   ``python3`` in the extension, which has no interpreter of its own.
"""

from __future__ import annotations

import ntpath
import os
import posixpath
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from ekka_core.contracts.errors import BadInput
from ekka_core.contracts.spec import TARGETS

DEFAULT_REMOTE_PYTHON = "python3"
DEFAULT_REMOTE_WORKDIR = "~/.cache/ekka-remote"
WORKSPACE_FOLDER = "${workspaceFolder}"


@dataclass
class WorkspaceSettings:
    workspace: str = ""                       # the folder's path; "" for the global settings
    interpreter: str = ""                     # ekka.interpreter, as set (resolved by resolve_interpreter)
    python_interpreter: str = ""              # the Python extension's interpreter for the folder, if any
    target_default: str = "vllm"              # ekka.target.default: the target of a spec that names none
    executor: str = "local"                   # ekka.executor: "local" or "ssh://host"
    remote_python: str = DEFAULT_REMOTE_PYTHON
    remote_workdir: str = DEFAULT_REMOTE_WORKDIR
    # ekka.engineArgs: engine arguments merged into the spec's engine_args of a diagnosis started from the editor
    # (the spec's own keys win).
    engine_args: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)   # settings that were ill-typed (their defaults are used)

    # -- wire form ----------------------------------------------------------------------------------------
    @staticmethod
    def from_json(d: Any, *, workspace: str = "") -> "WorkspaceSettings":
        """Typed settings from the client's JSON; a value of the wrong type keeps its default and is named in
        ``problems`` (reported when a job uses these settings)."""
        s = WorkspaceSettings(workspace=workspace)
        if not isinstance(d, dict):
            return s
        remote = d.get("remote") if isinstance(d.get("remote"), dict) else {}
        target = d.get("targetDefault", (d.get("target") or {}).get("default") if isinstance(d.get("target"), dict)
                       else None)

        def text(name: str, value: Any, default: str, check: Callable[[str], bool] = lambda v: True) -> str:
            if value is None:
                return default
            if not isinstance(value, str) or not check(value.strip()):
                s.problems.append(f"ekka.{name} is {value!r}")
                return default
            return value.strip()

        s.workspace = text("workspace", d.get("workspace"), workspace)
        s.interpreter = text("interpreter", d.get("interpreter"), "")
        s.python_interpreter = text("pythonInterpreter", d.get("pythonInterpreter"), "")
        s.target_default = text("target.default", target, "vllm", lambda v: v in TARGETS)
        s.executor = text("executor", d.get("executor"), "local",
                          lambda v: v == "local" or (v.startswith("ssh://") and len(v) > len("ssh://")))
        s.remote_python = text("remote.python", remote.get("python"), DEFAULT_REMOTE_PYTHON) or DEFAULT_REMOTE_PYTHON
        s.remote_workdir = text("remote.workdir", remote.get("workdir"), DEFAULT_REMOTE_WORKDIR) \
            or DEFAULT_REMOTE_WORKDIR
        args = d.get("engineArgs")
        if args is not None:
            bad = [k for k in args if not (isinstance(k, str) and k.isidentifier())] if isinstance(args, dict) else None
            if bad is None or bad:
                s.problems.append(f"ekka.engineArgs must be an object of engine argument names, e.g. "
                                  f'{{"max_num_batched_tokens": 64}}; got {args!r}')
            else:
                s.engine_args = dict(args)
        return s

    def to_json(self) -> dict[str, Any]:
        return {"workspace": self.workspace, "interpreter": self.interpreter,
                "pythonInterpreter": self.python_interpreter, "targetDefault": self.target_default,
                "executor": self.executor, "remote": {"python": self.remote_python, "workdir": self.remote_workdir},
                "engineArgs": dict(self.engine_args), "problems": list(self.problems)}

    # -- what a job takes from them -----------------------------------------------------------------------
    def check(self) -> None:
        """BadInput naming the ill-typed settings, so a job never runs on defaults the user did not choose."""
        if self.problems:
            where = f" (workspace folder {self.workspace})" if self.workspace else ""
            raise BadInput(f"invalid settings{where}: {'; '.join(self.problems)}",
                           fix="fix them in the settings (ekka.*) and run the diagnosis again")

    def executor_params(self) -> dict[str, Any] | None:
        """The executor for the engine process: None runs locally; ``ssh://host`` runs capture and analysis on that
        host (ekka_core.remote) with ``ekka.remote.python`` / ``ekka.remote.workdir``."""
        if self.executor == "local":
            return None
        return {"url": self.executor, "python": self.remote_python, "workdir": self.remote_workdir}

    def apply_to_spec(self, spec: dict[str, Any], *, target_given: bool) -> dict[str, Any]:
        """The spec fields of an editor diagnosis: ``ekka.engineArgs`` under the spec's own ``engine_args`` (the
        spec's keys win), ``ekka.target.default`` when the spec names no target."""
        out = dict(spec)
        if self.engine_args:
            own = out.get("engine_args") if isinstance(out.get("engine_args"), dict) else {}
            out["engine_args"] = {**self.engine_args, **own}
        if not target_given:
            out["target"] = self.target_default
        return out


class Settings:
    """Every folder's settings and the global ones, as the client last sent them."""

    def __init__(self) -> None:
        self.folders: dict[str, WorkspaceSettings] = {}
        self.global_: WorkspaceSettings = WorkspaceSettings()

    def update(self, options: Any) -> None:
        """From ``initializationOptions`` or a ``didChangeConfiguration`` payload (see the module docstring)."""
        if not isinstance(options, dict):
            return
        if isinstance(options.get("ekka"), dict):
            options = options["ekka"]
        per_folder = options.get("settings")
        if isinstance(per_folder, list):
            self.folders = {}
            for d in per_folder:
                s = WorkspaceSettings.from_json(d)
                if s.workspace:
                    self.folders[_norm(s.workspace)] = s
            if "globalSettings" in options:
                self.global_ = WorkspaceSettings.from_json(options["globalSettings"])
            return
        # one untyped object (older clients, tests): the global settings
        self.global_ = WorkspaceSettings.from_json(per_folder if isinstance(per_folder, dict) else options)

    def for_path(self, path: str | None) -> WorkspaceSettings:
        """The settings of the folder that contains ``path`` (the innermost), else the global settings."""
        if path:
            p = _norm(path)
            for folder in sorted(self.folders, key=len, reverse=True):
                if p == folder or p.startswith(folder.rstrip(os.sep) + os.sep):
                    return self.folders[folder]
        return self.global_

    def to_json(self) -> dict[str, Any]:
        return {"settings": [s.to_json() for s in self.folders.values()], "globalSettings": self.global_.to_json()}


def _norm(path: str) -> str:
    return os.path.normcase(os.path.abspath(path))


def venv_interpreter(root: str, platform: str = sys.platform) -> str:
    """``<root>/.venv/bin/python`` (``<root>\\.venv\\Scripts\\python.exe`` on Windows)."""
    if platform == "win32":
        return ntpath.join(root, ".venv", "Scripts", "python.exe")
    return posixpath.join(root, ".venv", "bin", "python")


def resolve_interpreter(settings: WorkspaceSettings, root: str | None, *,
                        exists: Callable[[str], bool] = os.path.exists, platform: str = sys.platform,
                        fallback: str | None = None) -> str:
    """The interpreter of the engine process (the module docstring's precedence; ``fallback`` default: this
    server's own interpreter). BadInput when ``ekka.interpreter`` uses ``${workspaceFolder}`` without a folder."""
    configured = settings.interpreter.strip()
    if configured:
        if WORKSPACE_FOLDER in configured:
            if not root:
                raise BadInput(f'ekka.interpreter uses ${{workspaceFolder}} ("{configured}") but no workspace '
                               "folder is open", fix="open the folder, or give the interpreter's full path")
            return configured.replace(WORKSPACE_FOLDER, root)
        return configured
    if settings.python_interpreter.strip():
        return settings.python_interpreter.strip()
    if root:
        venv = venv_interpreter(root, platform)
        if exists(venv):
            return venv
    return fallback if fallback is not None else sys.executable


__all__ = ["Settings", "WorkspaceSettings", "resolve_interpreter", "venv_interpreter"]
