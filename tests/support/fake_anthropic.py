"""FAKE of the Anthropic Messages API, for tests only: a tiny HTTP server on 127.0.0.1 speaking the wire format of
``POST /v1/messages`` (message objects with ``text`` / ``tool_use`` content blocks, ``stop_reason`` and ``usage``;
errors as ``{"type": "error", "error": {"type": ..., "message": ...}}`` with their HTTP status and headers).

It is *not* Anthropic's API and knows nothing about models: it answers each request with the next item of a
scripted queue and records every request (path, headers, JSON body) so a test can assert what the client sent —
e.g. that a ``tool_result`` with ``is_error: true`` came back, or that no request was made at all.

    with FakeAnthropic() as api:
        api.reply(tool_use("get_model_tree", {"framework": "target"}), usage=(1200, 40))
        api.error(429, "rate_limit_error", "slow down", headers={"retry-after": "0"})
        api.reply(text("done"), stop_reason="end_turn")
        ... AgentConfig(base_url=api.url, api_key="test-key") ...
        assert len(api.requests) == 3

A queue item may also be a callable ``f(request_body) -> item`` for replies that depend on the request. When the
queue is empty the fake answers HTTP 500 ``api_error`` "fake Anthropic: no scripted reply left" (and records it).

``FakeAnthropic(estimate_usage=True)`` replaces each reply's scripted ``usage`` by an *estimate* from the sizes:
input tokens = characters of the request's JSON body / 4, output tokens = characters of the reply's content JSON
/ 4 (:data:`CHARS_PER_TOKEN`). It is not Anthropic's tokenizer — only a size that grows with what was really sent.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

_ids = itertools.count(1)
CHARS_PER_TOKEN = 4


def text(s: str) -> dict[str, Any]:
    return {"type": "text", "text": s}


def tool_use(name: str, input: dict[str, Any] | Any, id: str | None = None) -> dict[str, Any]:
    return {"type": "tool_use", "id": id or f"toolu_fake_{next(_ids):04d}", "name": name, "input": input}


def message(content: list[dict[str, Any]], *, stop_reason: str | None = None, usage: tuple[int, int] = (100, 20),
            model: str = "claude-sonnet-4-5") -> dict[str, Any]:
    if stop_reason is None:
        stop_reason = "tool_use" if any(b.get("type") == "tool_use" for b in content) else "end_turn"
    return {"id": f"msg_fake_{next(_ids):04d}", "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop_reason, "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1],
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}


class FakeAnthropic:
    """A scripted fake of the Anthropic Messages API (see the module docstring)."""

    def __init__(self, *, estimate_usage: bool = False) -> None:
        self.estimate_usage = estimate_usage
        self.queue: deque[Any] = deque()
        self.requests: list[dict[str, Any]] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ---- scripting
    def reply(self, *blocks: dict[str, Any], stop_reason: str | None = None, usage: tuple[int, int] = (100, 20)
              ) -> "FakeAnthropic":
        self.queue.append({"status": 200, "body": message(list(blocks), stop_reason=stop_reason, usage=usage)})
        return self

    def error(self, status: int, type: str, msg: str, headers: dict[str, str] | None = None) -> "FakeAnthropic":
        self.queue.append({"status": status, "headers": headers or {},
                           "body": {"type": "error", "error": {"type": type, "message": msg}}})
        return self

    def slow(self, seconds: float, *blocks: dict[str, Any]) -> "FakeAnthropic":
        """A reply that arrives after ``seconds`` (for client timeouts)."""
        self.queue.append({"status": 200, "delay": seconds, "body": message(list(blocks) or [text("late")])})
        return self

    def push(self, item: dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]) -> "FakeAnthropic":
        self.queue.append(item)
        return self

    # ---- inspection
    def bodies(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests]

    def tool_results(self, request: int) -> list[dict[str, Any]]:
        """The ``tool_result`` blocks of the last user message of request number ``request``."""
        last = self.requests[request]["body"]["messages"][-1]
        content = last["content"] if isinstance(last["content"], list) else []
        return [b for b in content if b.get("type") == "tool_result"]

    # ---- server
    @property
    def url(self) -> str:
        assert self._server is not None, "start the fake first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FakeAnthropic":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:      # keep test output clean
                pass

            def do_POST(self) -> None:                      # noqa: N802 (http.server API)
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"_unparsable": raw.decode("utf-8", "replace")}
                with fake._lock:
                    fake.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in
                                                                         self.headers.items()}, "body": body})
                    item = fake.queue.popleft() if fake.queue else None
                if callable(item):
                    item = item(body)
                if item is None:
                    item = {"status": 500, "body": {"type": "error", "error": {
                        "type": "api_error", "message": "fake Anthropic: no scripted reply left"}}}
                if self.path.rstrip("/") != "/v1/messages":
                    item = {"status": 404, "body": {"type": "error", "error": {
                        "type": "not_found_error", "message": f"fake Anthropic: no route {self.path}"}}}
                if item.get("delay"):
                    time.sleep(item["delay"])
                if fake.estimate_usage and item["status"] == 200 and "usage" in item["body"]:
                    item = {**item, "body": {**item["body"], "usage": {
                        **item["body"]["usage"], "input_tokens": max(1, len(raw) // CHARS_PER_TOKEN),
                        "output_tokens": max(1, len(json.dumps(item["body"]["content"])) // CHARS_PER_TOKEN)}}}
                data = json.dumps(item["body"]).encode()
                try:
                    self.send_response(item["status"])
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.send_header("request-id", f"req_fake_{len(fake.requests):04d}")
                    for k, v in item.get("headers", {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass                                    # the client gave up (timeout test)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fake-anthropic",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "FakeAnthropic":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
