"""A real OpenAI-shaped HTTP server whose replies a test scripts: the stand-in for a judge *model* in the tests of
the LLM-judge reward client (:mod:`hybridrl.rewards.judge`), whose requests it records."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class ScriptedJudge:
    """A real OpenAI-shaped HTTP server: each reply is ``script(rendered prompt)``; it records every request.

    ``script`` may return a string (the reply), an int (an HTTP status with no reply), or ``("sleep", s, reply)``.
    """

    def __init__(self, script) -> None:
        self.script, self.requests, self.in_flight, self.most_in_flight = script, [], 0, 0
        self.lock = threading.Lock()
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args) -> None:
                pass

            def do_GET(self) -> None:
                self._send(200, {"object": "list", "data": [{"id": "served-judge", "object": "model"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with judge.lock:
                    judge.requests.append((self.path, body, self.headers.get("Authorization")))
                    judge.in_flight += 1
                    judge.most_in_flight = max(judge.most_in_flight, judge.in_flight)
                try:
                    text = body["messages"][-1]["content"] if "messages" in body else body["prompt"]
                    answer = judge.script(text)
                    if isinstance(answer, tuple):
                        time.sleep(answer[1])
                        answer = answer[2]
                    if isinstance(answer, int):
                        self._send(answer, {"error": {"message": "scripted failure"}})
                    elif "messages" in body:
                        self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": answer}}]})
                    else:
                        self._send(200, {"choices": [{"index": 0, "text": answer}]})
                finally:
                    with judge.lock:
                        judge.in_flight -= 1

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except BrokenPipeError:  # the client gave up (the timeout test)
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted():
    servers = []

    def start(script):
        servers.append(ScriptedJudge(script))
        return servers[-1]
    yield start
    for server in servers:
        server.close()
