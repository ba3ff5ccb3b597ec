"""The scripts the client runs on the remote host before the engine is there (ekka_core.remote.host_probe /
host_install), run here exactly as the client runs them there: ``python - ARGS`` with the file as stdin, in an
interpreter that cannot import Ekka (``-I``, cwd elsewhere)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ekka_core.remote.bundle import build_bundle
from ekka_core.remote.client import HOST_INSTALL, HOST_PROBE


def _run(script: Path, *args: str, cwd: Path) -> dict:
    proc = subprocess.run([sys.executable, "-I", "-", *args], input=script.read_text(), capture_output=True,
                          text=True, cwd=cwd, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_probe_then_install_then_probe_again(tmp_path):
    bundle = build_bundle()
    wd = tmp_path / "remote"
    probe = _run(HOST_PROBE, str(wd), bundle.dir_name, bundle.sha256, "json,no_such_module_xyz", cwd=tmp_path)
    assert probe["ready"] is False and probe["missing"] == ["no_such_module_xyz"]
    assert probe["engine"] == str(wd / "engine" / bundle.dir_name) and (wd / "runs").is_dir()
    assert probe["version"][:2] == list(sys.version_info[:2])

    archive = tmp_path / "engine.tar.xz"
    archive.write_bytes(bundle.data)
    assert _run(HOST_INSTALL, str(archive), probe["engine"], bundle.sha256, cwd=tmp_path) == {"ok": True}
    assert not archive.exists() and (Path(probe["engine"]) / "ekka_core" / "pipeline.py").is_file()
    assert (Path(probe["engine"]) / ".ekka-bundle.sha256").read_text().strip() == bundle.sha256
    again = _run(HOST_PROBE, str(wd), bundle.dir_name, bundle.sha256, "json", cwd=tmp_path)
    assert again["ready"] is True and again["missing"] == []


def test_install_refuses_an_archive_whose_hash_differs(tmp_path):
    archive = tmp_path / "engine.tar.xz"
    archive.write_bytes(b"not the archive")
    dest = tmp_path / "engine" / "ekka-x"
    out = _run(HOST_INSTALL, str(archive), str(dest), "0" * 64, cwd=tmp_path)
    assert out["ok"] is False and "expected 0000000000000000" in out["why"]
    assert not archive.exists() and not dest.exists()


def test_probe_names_a_workdir_it_cannot_create(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = _run(HOST_PROBE, str(blocker / "wd"), "ekka-x", "0" * 64, "", cwd=tmp_path)
    assert "cannot create" in out["workdir_error"]
