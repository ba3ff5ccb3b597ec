"""The agent's transcript: everything the model was sent and everything it did, for a user to audit.

Written into the report directory for every agent session that reaches the API (a knowledge-base hit makes no call
and writes nothing):

* ``agent-transcript.jsonl`` — one JSON record per line, appended as it happens (an interrupted session still
  leaves its transcript);
* ``agent-transcript.md`` — the same records rendered to read, written when the session ends.

Records (``type``): ``session`` (model, endpoint, budget, the components asked about, what the knowledge base
answered, the system prompt and the tool schemas — both are sent with every request), ``request`` (call number,
``max_tokens``, the estimated input tokens, and the user content that is new in this request: the first message,
a validator's feedback or a nudge), ``response`` (the content blocks, ``stop_reason`` and ``usage`` as the API
reported them), ``tool_call`` / ``tool_result``, ``validator`` (one round's verdict and the feedback sent back),
``api_event`` (retries), ``outcome`` (status, message, total usage).

The API key is never written: the session record says only whether one was set, and any record that would contain
the key's text has it replaced by ``[redacted]``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO, Any

JSONL = "agent-transcript.jsonl"
MARKDOWN = "agent-transcript.md"
REDACTED = "[redacted]"
MD_BLOCK_CHARS = 6000          # a tool result longer than this is cut in the Markdown (the JSONL keeps it whole)


class Transcript:
    """Records of one agent session; files are opened at the first API request (:meth:`start`)."""

    def __init__(self, directory: Path | None, *, secret: str | None = None):
        self.directory = Path(directory) if directory is not None else None
        self.secret = secret or None
        self.records: list[dict[str, Any]] = []
        self.error: str | None = None            # why the files could not be written
        self._file: IO[str] | None = None

    @property
    def started(self) -> bool:
        return self._file is not None

    def add(self, type: str, **fields: Any) -> None:
        record = {"type": type, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **fields}
        line = self._redact(json.dumps(record, default=str, ensure_ascii=False))
        self.records.append(json.loads(line))
        if self._file is not None:
            self._write(line)

    def start(self) -> None:
        """Open the JSONL file (at the session's first API request) and write what was recorded so far."""
        if self.directory is None or self._file is not None or self.error:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._file = open(self.directory / JSONL, "w", encoding="utf-8")
        except OSError as e:
            self.error = f"could not write the agent transcript: {e}"
            return
        for record in self.records:
            self._write(json.dumps(record, ensure_ascii=False))

    def close(self) -> dict[str, str] | None:
        """Close the JSONL, write the Markdown; the files' names (relative to the report directory) or None."""
        if self._file is None:
            return None
        self._file.close()
        self._file = None
        assert self.directory is not None
        try:
            (self.directory / MARKDOWN).write_text(self._redact(render_markdown(self.records)), encoding="utf-8")
        except OSError as e:
            self.error = f"could not write the agent transcript: {e}"
            return {"jsonl": JSONL}
        return {"jsonl": JSONL, "markdown": MARKDOWN}

    def _write(self, line: str) -> None:
        assert self._file is not None
        try:
            self._file.write(line + "\n")
            self._file.flush()
        except OSError as e:
            self.error = f"could not write the agent transcript: {e}"

    def _redact(self, text: str) -> str:
        return text.replace(self.secret, REDACTED) if self.secret else text


def render_markdown(records: list[dict[str, Any]]) -> str:
    """The records as a document to read: the session, then each call's request, response, tool calls and results."""
    lines = ["# Mapping agent transcript", ""]
    for r in records:
        kind = r.get("type")
        if kind == "session":
            lines += [f"Model `{r.get('model')}` at {r.get('endpoint')}, API key {r.get('api_key')}; "
                      f"started {r.get('time')}.", "",
                      f"Budget: {json.dumps(r.get('budget'))}", "",
                      f"Asked about {len(r.get('asked', []))} component(s); the knowledge base answered "
                      f"{len(r.get('from_knowledge_base', []))}.", "",
                      "## System prompt", "", _fence(r.get("system", "")), "",
                      f"Tools: {', '.join(t.get('name', '?') for t in r.get('tools', []))} "
                      f"(schemas in {JSONL}).", ""]
        elif kind == "request":
            lines += [f"## Call {r.get('call')}", "",
                      f"Request: max_tokens {r.get('max_tokens')}, ~{r.get('estimated_input_tokens')} input tokens "
                      f"estimated, {r.get('messages')} message(s).", ""]
            for text in r.get("new_user_text", []):
                lines += ["User:", "", _fence(text), ""]
        elif kind == "response":
            u = r.get("usage") or {}
            lines += [f"Response: stop_reason `{r.get('stop_reason')}`, usage {u.get('input_tokens', 0)} in / "
                      f"{u.get('output_tokens', 0)} out.", ""]
            for b in r.get("content", []):
                if b.get("type") == "text" and str(b.get("text", "")).strip():
                    lines += ["> " + line for line in str(b["text"]).splitlines()] + [""]
        elif kind == "tool_call":
            lines += [f"- tool call `{r.get('name')}` {json.dumps(r.get('input'), ensure_ascii=False)}"]
        elif kind == "tool_result":
            mark = "error" if r.get("is_error") else "result"
            lines += [f"  - {mark}:", "", _fence(str(r.get("content", "")), indent="    "), ""]
        elif kind == "validator":
            lines += [f"### Validator, round {r.get('round')}: {r.get('confirmed')} confirmed, "
                      f"{r.get('explained')} explained, {len(r.get('problems', []))} problem(s)", ""]
            lines += [f"- {p}" for p in r.get("problems", [])] + [""]
        elif kind == "api_event":
            lines += [f"- API: {r.get('event')}"]
        elif kind == "outcome":
            u = r.get("usage") or {}
            lines += ["## Outcome", "", f"{r.get('status')}: {r.get('message')}", "",
                      f"{u.get('calls', 0)} call(s), {u.get('input_tokens', 0)} input / {u.get('output_tokens', 0)} "
                      f"output tokens, ${u.get('dollars', 0):.4f}.", ""]
    return "\n".join(lines) + "\n"


def _fence(text: str, indent: str = "") -> str:
    if len(text) > MD_BLOCK_CHARS:
        text = text[:MD_BLOCK_CHARS] + f"\n… [{len(text) - MD_BLOCK_CHARS} more characters in {JSONL}]"
    body = "\n".join(indent + line for line in text.replace("````", "'''").splitlines())
    return f"{indent}````text\n{body}\n{indent}````"
