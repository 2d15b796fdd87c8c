"""The gateway's HTTP face: OpenAI's ``/v1/models``, ``/v1/chat/completions`` and ``/v1/completions`` (FastAPI), and
a background uvicorn server that runs it (:class:`Gateway`).

A session is named by its base URL (``/sessions/<id>/v1``: what an agent's ``openai.AsyncOpenAI(base_url=...)``
is given) or by an ``X-Session-Id`` header. Errors are OpenAI's error body with a 4xx status — a malformed or
over-limit request never gets a traceback; a bearer token is required when one is configured (always when bound to
an address other than the loopback).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from hybridrl.gateway.openai_schema import (ChatCompletionRequest, CompletionRequest, GatewayError,
                                            validation_error)
from hybridrl.gateway.service import GatewayService

logger = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_REQUEST_BYTES = 8 << 20
SHUTDOWN_GRACE_S = 30.0


def build_app(service: GatewayService, api_key: Optional[str] = None,
              max_request_bytes: int = MAX_REQUEST_BYTES) -> FastAPI:
    """The FastAPI application serving ``service``; ``api_key``: the bearer token every request must carry."""
    app = FastAPI(title="hybridrl gateway", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(_Guard, api_key=api_key, max_request_bytes=max_request_bytes)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request, error: RequestValidationError):
        return _error_response(validation_error(list(error.errors())))

    @app.exception_handler(GatewayError)
    async def refused(_request, error: GatewayError):
        return _error_response(error)

    @app.exception_handler(Exception)
    async def failed(_request, error: Exception):
        logger.error("gateway: %s: %s", type(error).__name__, error)
        return _error_response(GatewayError(500, f"the gateway failed: {type(error).__name__}: {error}",
                                           kind="server_error"))

    def session_of(request: Request, session_id: Optional[str]) -> Optional[str]:
        return session_id or request.headers.get("x-session-id")

    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": service.backend.model_name, "object": "model",
                                            "created": 0, "owned_by": "hybridrl"}]}

    async def chat(body: ChatCompletionRequest, request: Request, session_id: Optional[str] = None):
        service.check_model_name(body.model)
        session = session_of(request, session_id)
        if body.stream:
            return StreamingResponse(_events(service.chat_chunks(body, session)), media_type="text/event-stream")
        return JSONResponse(await service.chat(body, session))  # plain JSON types already: no re-encoding pass

    async def completions(body: CompletionRequest, request: Request, session_id: Optional[str] = None):
        service.check_model_name(body.model)
        if body.stream:
            raise GatewayError(400, "stream: streamed text completions are not supported; use "
                                    "/v1/chat/completions or stream=false", param="stream")
        return JSONResponse(await service.complete(body, session_of(request, session_id)))

    for prefix in ("", "/sessions/{session_id}"):
        app.get(f"{prefix}/v1/models")(models)
        app.post(f"{prefix}/v1/chat/completions")(chat)
        app.post(f"{prefix}/v1/completions")(completions)
    return app


def _error_response(error: GatewayError) -> JSONResponse:
    """OpenAI's error body with the error's status."""
    return JSONResponse(error.body(), status_code=error.status)


class _Guard:
    """Refuses a request without the bearer token (when one is set) or declaring a body over ``max_request_bytes``
    before the application reads it. Plain ASGI: Starlette's ``@app.middleware("http")`` would run every request
    through a task group and memory streams of its own, a cost paid on every call of every episode."""

    def __init__(self, app, api_key: Optional[str], max_request_bytes: int) -> None:
        self.app, self.max_request_bytes = app, max_request_bytes
        self.authorization = None if api_key is None else f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        error = self._refusal(dict(scope["headers"])) if scope["type"] == "http" else None
        if error is None:
            await self.app(scope, receive, send)
        else:
            await _error_response(error)(scope, receive, send)

    def _refusal(self, headers: dict[bytes, bytes]) -> Optional[GatewayError]:
        if self.authorization is not None and not hmac.compare_digest(headers.get(b"authorization", b""),
                                                                      self.authorization):
            return GatewayError(401, "missing or wrong bearer token (Authorization: Bearer ...)",
                                kind="authentication_error", code="invalid_api_key")
        size = headers.get(b"content-length", b"")
        if size.isdigit() and int(size) > self.max_request_bytes:
            return GatewayError(413, f"the request is {int(size)} bytes, over the gateway's limit of "
                                     f"{self.max_request_bytes}")
        return None


async def _events(chunks):
    """Server-sent events of ``chunks``, then ``[DONE]``; an error after the first chunk is sent as an error event."""
    try:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
    except GatewayError as error:
        yield f"data: {json.dumps(error.body())}\n\n"
    yield "data: [DONE]\n\n"


def _promptly_stopped_server():
    """uvicorn's ``Server``, stopped as soon as it is told: its own loop looks at ``should_exit`` every 0.1 s, and
    then naps 0.1 s more while connections close — ≈ 0.1-0.2 s a trainer would pay on every generation call (a
    gateway lives for one). Responses being written are still waited for."""
    import uvicorn

    class PromptlyStopped(uvicorn.Server):
        _loop: Optional[asyncio.AbstractEventLoop] = None
        _stopping: Optional[asyncio.Event] = None

        async def main_loop(self) -> None:
            self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
            counter = 0
            while not await self.on_tick(counter):  # uvicorn's own housekeeping, once per 0.1 s
                counter = (counter + 1) % 864000
                try:
                    await asyncio.wait_for(self._stopping.wait(), 0.1)
                except asyncio.TimeoutError:
                    pass

        async def shutdown(self, sockets: Optional[list] = None) -> None:
            """uvicorn's steps without its fixed 0.1 s naps: stop listening, close idle connections (those
            answering close after their response), wait for the responses being written, up to the graceful
            timeout."""
            for server in self.servers:
                server.close()
            for sock in sockets or []:
                sock.close()
            for connection in list(self.server_state.connections):
                connection.shutdown()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + (self.config.timeout_graceful_shutdown or SHUTDOWN_GRACE_S)
            while self.server_state.tasks and loop.time() < deadline:
                await asyncio.sleep(0.005)
            for server in self.servers:
                await server.wait_closed()

        def stop(self) -> None:
            self.should_exit = True
            loop, stopping = self._loop, self._stopping
            if loop is not None and stopping is not None:
                try:
                    loop.call_soon_threadsafe(stopping.set)
                except RuntimeError:  # its loop has ended already
                    pass
    return PromptlyStopped


class Gateway:
    """The gateway on ``host:port`` (``0``: a free port) in a background thread of this process.

    Args:
        service: what it serves (:class:`GatewayService`).
        api_key: bearer token clients must send; required when ``host`` is not a loopback address.
    """

    def __init__(self, service: GatewayService, host: str = "127.0.0.1", port: int = 0,
                 api_key: Optional[str] = None, start_timeout_s: float = 30.0) -> None:
        import uvicorn

        if host not in LOOPBACK and not api_key:
            raise ValueError(f"gateway: binding to {host} exposes the policy to the network; set an api key "
                             "(clients send it as a bearer token) or bind to 127.0.0.1")
        self.service, self.host = service, host
        config = uvicorn.Config(build_app(service, api_key), host=host, port=port, log_level="warning",
                                lifespan="off", access_log=False)
        self._server = _promptly_stopped_server()(config)
        self._thread = threading.Thread(target=self._server.run, name="gateway-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"gateway: the HTTP server did not start on {host}:{port}")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]

    @property
    def base_url(self) -> str:
        """``http://host:port/v1`` (no session)."""
        return f"http://{self.host}:{self.port}/v1"

    def session_url(self, session_id: str) -> str:
        """The base URL of one session: every call made through it is recorded under ``session_id``."""
        return f"http://{self.host}:{self.port}/sessions/{session_id}/v1"

    def close(self, timeout_s: float = 10.0) -> None:
        self._server.stop()
        self._thread.join(timeout_s)

    def __enter__(self) -> "Gateway":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()
