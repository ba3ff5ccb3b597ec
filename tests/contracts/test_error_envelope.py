"""One error envelope at every process boundary (ekka_core.contracts.errors): the capture run process → the
pipeline, the language server's engine process → the server, the remote host process → the client. An error
raised on one side is raised again on the other as the same class, message, fix and exit code."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ekka_core.contracts.errors import BadInput, EkkaError, InternalFailure, internal_error
from server.protocol import worker_error, worker_failure

REPO = Path(__file__).resolve().parents[2]


def test_the_envelope_round_trips_class_message_fix_exit_code_and_traceback():
    for err in (BadInput("model path 'x' does not exist", fix="pass a checkpoint"), InternalFailure("vLLM died")):
        back = EkkaError.from_json(json.loads(json.dumps(err.to_json())))
        assert (type(back), back.message, back.fix, back.exit_code) == (type(err), err.message, err.fix, err.exit_code)
    crash = internal_error(ZeroDivisionError("division by zero"))
    d = crash.to_json(traceback="Traceback ...\nZeroDivisionError")
    assert d == {"message": "ZeroDivisionError: division by zero", "fix": None, "exit_code": 3,
                 "traceback": "Traceback ...\nZeroDivisionError"}
    assert EkkaError.from_json(d).traceback.endswith("ZeroDivisionError")
    assert EkkaError.from_json({}).message == "unknown error" and EkkaError.from_json({}).exit_code == 3


def test_the_last_envelope_line_of_a_childs_stderr_is_the_error():
    first, last = BadInput("first", fix="a"), BadInput("second", fix="b")
    stderr = f"warning: noise\n{first.envelope_line()}\nmore noise\n{last.envelope_line()}\n"
    got = EkkaError.from_envelope_lines(stderr)
    assert isinstance(got, BadInput) and got.message == "second" and got.fix == "b"
    assert EkkaError.from_envelope_lines("Traceback (most recent call last):\n  boom\n") is None


def test_the_capture_run_process_ends_with_the_envelope(tmp_path):
    """A bad role is an internal failure: exit 3 and the envelope (with the traceback) as the last stderr line."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"model": "m", "prompts": ["p"]}))
    proc = subprocess.run([sys.executable, "-m", "ekka_core.capture.run_process", "no-such-role", str(spec),
                           str(tmp_path / "out")], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 3
    err = EkkaError.from_envelope_lines(proc.stderr)
    assert isinstance(err, InternalFailure) and err.message == "ValueError: unknown role no-such-role"
    assert "Traceback" in err.traceback


def test_the_engine_process_answers_with_the_envelope_and_the_server_raises_it_again():
    from server.engine_process import Worker

    out = io.BytesIO()
    request = {"id": 7, "method": "diagnose", "params": {"spec": {"model": "/no/such/model", "prompts": ["p"]},
                                                          "out_dir": "/tmp/x"}}
    Worker(out).serve(io.BytesIO((json.dumps(request) + "\n").encode()))
    reply = json.loads(out.getvalue().decode().strip().splitlines()[-1])
    assert reply["id"] == 7 and reply["error"]["code"] == -32002
    err = worker_failure(reply["error"])
    assert isinstance(err, BadInput) and "does not exist" in err.message and err.fix
    assert worker_error(err)["data"] == err.to_json()
    # an error object without the envelope (another JSON-RPC peer) is still an internal failure, not a crash
    assert isinstance(worker_failure({"code": -32601, "message": "unknown method"}), InternalFailure)
    assert worker_failure(None).message == "engine process error"


@pytest.mark.parametrize("error", [BadInput("no such model on the host", fix="pass the host's path"),
                                   InternalFailure("the host ran out of memory")])
def test_the_remote_host_process_emits_the_envelope_as_its_error_event(error, monkeypatch, capsys):
    from ekka_core.remote import host

    def fail(job, events):
        raise error

    monkeypatch.setattr(host, "run", fail)
    monkeypatch.setattr(host.os, "setsid", lambda: None)              # not in the test process
    monkeypatch.setattr(host.signal, "signal", lambda *a: None)
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps({"protocol": host.PROTOCOL}) + "\n"))
    assert host.main() == error.exit_code
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["event"] for e in events] == ["hello", "error"]
    back = EkkaError.from_json(events[-1])           # what the client reads (ekka_core.remote.client._host)
    assert (type(back), back.message, back.fix) == (type(error), error.message, error.fix)
