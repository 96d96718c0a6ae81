"""A minimal OpenAI-compatible chat server whose replies a test controls (broken text on purpose).

Speaks the two endpoints the experience model's HTTP client uses: ``GET /v1/models`` and
``POST /v1/chat/completions``. Every request body is recorded, so a test can check the sampling each
retry was sent with. Runs on 127.0.0.1 in a thread of the test process.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = str | tuple[str, str]
"""A reply text, or ``(text, finish_reason)``."""


class ScriptedOpenAIServer:
    def __init__(self, reply: Callable[[dict[str, Any]], Reply], model: str = "scripted") -> None:
        self.reply = reply
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
                    self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": server.model, "object": "model",
                                                                  "created": 0, "owned_by": "test"}]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.requests.append(body)
                out = server.reply(body)
                text, finish = out if isinstance(out, tuple) else (out, "stop")
                if finish == "http-400":
                    self._send(400, {"error": {"message": "prompt too long", "type": "BadRequestError"}})
                    return
                self._send(200, {
                    "id": "x", "object": "chat.completion", "created": 0, "model": server.model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": finish}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                })

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
