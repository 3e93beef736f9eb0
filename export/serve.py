"""An HTTP server around a ``Predictor``, on uvicorn and starlette (``pip install 'xsearch[serve]'``; no torch).

``POST /predict`` takes a JSON list of inputs (strings or token-id lists), or an object
``{"inputs": [...], "truncate": bool}``, and answers ``{"predictions": [...]}``. For a decoder
export (``xsearch export --decoder``) ``POST /generate`` takes ``{"prompt": TEXT or [ids],
"max_new_tokens": N, "temperature"?, "top_k"?, "seed"?}`` within ``max_prompt_tokens`` and
``max_new_tokens`` (more: 400) and answers ``{"token_ids": [...], "text": ...}``.
``GET /health`` answers ``{"status": "ok", ...}``. Every error is JSON ``{"error": "..."}`` that
never repeats the request body: 400 for a malformed request, 404/405 for a wrong route or method,
408 for a client too slow to send its request, 413 for a body or batch over the limits, 503 when
the server is busy, 500 ("internal error", the traceback logged here) for a bug.

Limits (``ServeSettings``): the body is read as a stream and cut at ``max_body`` whatever its
headers say; a request must arrive whole within ``request_timeout``; an idle connection is closed
after ``idle_timeout``; beyond ``max_concurrency`` requests in flight the answer is 503, and beyond
``max_connections`` open connections a new one gets 503 and is closed. One onnxruntime run at a
time, in a worker thread, so ``/health`` answers while a batch runs. Listens on 127.0.0.1 unless
told otherwise.

    serve("model.onnx", ServeSettings(port=8080))      # blocks until interrupted

    with Server(predictor, ServeSettings(port=0)) as server:   # in a background thread
        url = f"http://127.0.0.1:{server.port}/predict"
"""

from __future__ import annotations

import asyncio
import functools
import http
import ipaddress
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xsearch.errors import SettingError, UnavailableError, XSearchError
from xsearch.settings import Settings, option

if TYPE_CHECKING:
    from xsearch.export.predictor import Predictor

log = logging.getLogger("xsearch.serve")

MAX_HEADER_BYTES = 16 * 1024  # request line + headers (h11's default); more: 400 or 431
LINGER_SECONDS = 2.0  # after an early answer (413, 503), input is drained for at most this long before closing
SHUTDOWN_SECONDS = 5  # on stop, requests in flight get this long to finish


@dataclass
class ServeSettings(Settings):
    """The options of ``xsearch serve`` (and of ``serve``, ``Server`` and ``build_app``)."""

    host: str = option("127.0.0.1", "address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface)")
    port: int = option(8080, "TCP port to listen on (0: any free port)", ge=0, le=65535)
    threads: int | None = option(None, "onnxruntime intra-op threads (default: onnxruntime's choice)", gt=0)
    max_batch: int = option(64, "most inputs in one request (more: 413)", ge=1)
    max_prompt_tokens: int = option(1024, "POST /generate: longest prompt in tokens (more: 400)", ge=1)
    max_new_tokens: int = option(256, "POST /generate: most tokens generated per request (more: 400)", ge=1)
    max_body: int = option(1 << 20, "largest request body in bytes (more: 413)", ge=1)
    max_concurrency: int = option(16, "requests in flight at once, queued for the model (more: 503)", ge=1)
    max_connections: int = option(1000, "open connections at once (a new one beyond it: 503, closed)", ge=1)
    request_timeout: float = option(15.0, "seconds a client may take to send a whole request (headers and body)", gt=0)
    idle_timeout: float = option(5.0, "seconds an idle keep-alive connection is kept open", gt=0)
    backlog: int = option(2048, "connections the kernel queues until accepted (capped by net.core.somaxconn)", ge=1)

    def rules(self) -> None:
        if not self.host.strip():
            raise SettingError("host", "{0} must not be empty (0.0.0.0 listens on every interface)")


# ---------------------------------------------------------------------------------------------
# The application: one route table, JSON everywhere.


@dataclass(frozen=True)
class Route:
    """One route: ``handler`` names a coroutine method of ``_Service`` taking the starlette request
    and returning the JSON body of a 200 (or raising ``HTTPError``). ``limited`` routes count
    against ``max_concurrency``."""

    method: str
    path: str
    handler: str
    limited: bool = True


# Every route the server answers; the 404 and 405 answers are built from this table too.
ROUTES: tuple[Route, ...] = (
    Route("POST", "/predict", "predict"),
    Route("POST", "/generate", "generate"),
    Route("GET", "/health", "health", limited=False),
)


class HTTPError(Exception):
    """An error answer: ``{"error": message}`` with ``status``; ``close`` when the request was not
    read to its end (the connection cannot be reused)."""

    def __init__(self, status: int, message: str, *, close: bool = False, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.close, self.headers = status, message, close, dict(headers or {})


def _clip(text: str, n: int = 300) -> str:
    """Error texts stay short whatever the input (a token of a megabyte is not repeated back)."""
    return text if len(text) <= n else text[: n - 3] + "..."


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes) -> Any:
    """A request body as JSON (strict UTF-8; no NaN or Infinity).

    Raises:
        HTTPError: 400 naming what is wrong, never repeating the body.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HTTPError(400, f"body is not UTF-8 (invalid byte at offset {e.start})") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise HTTPError(400, f"body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise HTTPError(400, "body is nested too deeply") from None
    except ValueError as e:  # an integer of more than sys.get_int_max_str_digits() digits, NaN
        message = "a number with too many digits" if "digits" in str(e) else _clip(str(e), 100)
        raise HTTPError(400, f"body is not valid JSON: {message}") from None


class _Service:
    """The handlers and their shared state (one per app)."""

    def __init__(self, predictor: Predictor, settings: ServeSettings):
        self.predictor = predictor
        self.settings = settings
        self.generator = _generator_for(predictor, settings)  # None unless the file is a decoder export
        self.lock = threading.Lock()  # one onnxruntime run at a time keeps the thread budget honest
        self.in_flight = 0  # touched on the event loop only

    # -- handlers -------------------------------------------------------------------------------

    async def health(self, request: Any) -> dict[str, Any]:
        p = self.predictor
        return {"status": "ok", "model": p.path, "kind": p.kind, "max_len": p.max_len, "xsearch_version": p.version,
                "generate": self.generator is not None}  # fmt: skip

    async def predict(self, request: Any) -> dict[str, Any]:
        raw = await self.read_body(request)
        return await asyncio.to_thread(self._predict, raw)

    def _predict(self, raw: bytes) -> dict[str, Any]:  # in a worker thread
        inputs, truncate = self.inputs(parse_json(raw))
        try:
            with self.lock:
                preds = self.predictor.predict(inputs, truncate=truncate)
        except ValueError as e:  # the Predictor's word for a bad input
            raise HTTPError(400, _clip(str(e))) from None
        return {"predictions": [p.to_dict() for p in preds]}

    async def generate(self, request: Any) -> dict[str, Any]:
        raw = await self.read_body(request)
        return await asyncio.to_thread(self._generate, raw)

    def _generate(self, raw: bytes) -> dict[str, Any]:  # in a worker thread
        if self.generator is None:
            raise HTTPError(400, f"{self.predictor.path} is not a decoder export (xsearch export --decoder); "
                                 "POST /predict gives its next-token distribution")  # fmt: skip
        payload = parse_json(raw)
        shape = 'expected {"prompt": TEXT or [token ids], "max_new_tokens": N, "temperature"?, "top_k"?, "seed"?}'
        allowed = {"prompt", "max_new_tokens", "temperature", "top_k", "seed"}
        if not isinstance(payload, dict):
            raise HTTPError(400, shape)
        unknown = sorted(set(payload) - allowed)
        if unknown:
            raise HTTPError(400, f"unknown key {_clip(unknown[0], 40)!r}; {shape}")
        for key in ("prompt", "max_new_tokens"):
            if key not in payload:
                raise HTTPError(400, f"missing key {key!r}; {shape}")
        prompt, n = payload["prompt"], payload["max_new_tokens"]
        g, limits = self.generator, self.settings
        try:
            if isinstance(prompt, str):
                if g.encoding is None:
                    raise HTTPError(400, "this model carries no text encoding; send the prompt as token ids")
                ids = g.encoding.encode(prompt)
            elif isinstance(prompt, list):
                ids = prompt
            else:
                kind = _json_kind(prompt)
                raise HTTPError(400, f"'prompt' must be a string or a list of token ids, got a JSON {kind}")
            if len(ids) > limits.max_prompt_tokens:
                raise HTTPError(400, f"prompt of {len(ids)} tokens exceeds the limit of {limits.max_prompt_tokens}")
            if isinstance(n, int) and not isinstance(n, bool) and n > limits.max_new_tokens:
                raise HTTPError(400, f"max_new_tokens={n} exceeds the limit of {limits.max_new_tokens}")
            options = {k: payload[k] for k in ("temperature", "top_k", "seed") if k in payload}
            if "seed" in options and (isinstance(options["seed"], bool) or not isinstance(options["seed"], int)):
                raise HTTPError(400, f"'seed' must be an integer, got a JSON {_json_kind(options['seed'])}")
            with self.lock:
                new = g.generate(ids, n, **options)
        except ValueError as e:  # the Generator's word for a bad prompt or option
            raise HTTPError(400, _clip(str(e))) from None
        out: dict[str, Any] = {"token_ids": new}
        if g.encoding is not None:
            out["text"] = g.encoding.decode(new)
        return out

    # -- helpers for handlers -------------------------------------------------------------------

    def inputs(self, payload: Any) -> tuple[list[Any], bool]:
        """``(inputs, truncate)`` of a list or ``{"inputs": [...], "truncate": bool}``."""
        shape = 'expected a non-empty JSON list of inputs, or {"inputs": [...], "truncate": true|false}'
        truncate = False
        if isinstance(payload, dict):
            unknown = [k for k in payload if k not in ("inputs", "truncate")]
            if unknown:
                raise HTTPError(400, f"unknown key {_clip(unknown[0], 40)!r}; {shape}")
            if "inputs" not in payload:
                raise HTTPError(400, f"missing key 'inputs'; {shape}")
            truncate = payload.get("truncate", False)
            if not isinstance(truncate, bool):
                raise HTTPError(400, f"'truncate' must be true or false, got a JSON {_json_kind(truncate)}")
            payload = payload["inputs"]
        if not isinstance(payload, list) or not payload:
            raise HTTPError(400, shape)
        if len(payload) > self.settings.max_batch:
            raise HTTPError(413, f"batch of {len(payload)} inputs exceeds the limit of {self.settings.max_batch}")
        return payload, truncate

    async def read_body(self, request: Any) -> bytes:
        """The request body, read as a stream: at most ``max_body`` bytes (413 beyond, whatever
        Content-Length says) within ``request_timeout`` (408)."""
        limit = self.settings.max_body
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                raise HTTPError(400, "Content-Length must be a number of bytes", close=True)
            if int(declared) > limit:
                raise HTTPError(413, f"request body of {int(declared)} bytes exceeds the limit of {limit}", close=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.request_timeout
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(request.receive(), max(deadline - loop.time(), 0.0))
            except asyncio.TimeoutError:
                raise HTTPError(408, "request body not received in time", close=True) from None
            if message["type"] == "http.disconnect":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, f"request body exceeds the limit of {limit} bytes", close=True)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _generator_for(predictor: Predictor, settings: ServeSettings) -> Any:
    """A ``Generator`` over the served file when it is a decoder export, else None."""
    from xsearch.export.generator import Generator, is_decoder_export

    if not is_decoder_export(predictor.session):
        return None
    return Generator(predictor.path, threads=settings.threads)


class _Disconnected(Exception):
    """The client went away (or was cut off) before its request was read."""


def _json_kind(value: Any) -> str:
    return {str: "string", int: "number", float: "number", list: "list", dict: "object"}.get(type(value), "null")


def _require() -> None:
    try:
        import h11  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise UnavailableError(
            f"serving needs uvicorn and starlette ({e.name or e} is missing): pip install 'xsearch[serve]'"
        ) from None


def build_app(predictor: Predictor, settings: ServeSettings | None = None) -> Callable[..., Awaitable[None]]:
    """The ASGI application serving ``predictor`` (the routes of ``ROUTES``).

    It enforces the limits an app can: body size and read time, batch size, requests in flight.
    The connection-level ones (slow headers, idle connections, connection count) need the
    protocol that ``Server`` runs it with.

    Raises:
        UnavailableError: uvicorn or starlette is not installed.
    """
    _require()
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse
    from starlette.routing import Route as StarletteRoute

    settings = settings or ServeSettings()
    service = _Service(predictor, settings)

    def error(status: int, message: str, *, close: bool = False, headers: dict[str, str] | None = None) -> Any:
        headers = dict(headers or {})
        if close:
            headers["connection"] = "close"
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    def endpoint(by_method: dict[str, Route]) -> Callable[[Any], Awaitable[Any]]:
        async def handle(request: Any) -> Any:
            route = by_method.get(request.method) or by_method["GET"]  # HEAD is GET without the body
            if route.limited and service.in_flight >= settings.max_concurrency:
                return error(503, f"busy: {settings.max_concurrency} requests in flight; retry later",
                             close=True, headers={"retry-after": "1"})  # fmt: skip
            service.in_flight += route.limited
            try:
                return JSONResponse(await getattr(service, route.handler)(request))
            except HTTPError as e:
                return error(e.status, e.message, close=e.close, headers=e.headers)
            except _Disconnected:
                return error(400, "client disconnected", close=True)  # nobody reads it
            except Exception:
                log.exception("internal error on %s %s", request.method, route.path)
                return error(500, "internal error")
            finally:
                service.in_flight -= route.limited

        return handle

    by_path: dict[str, dict[str, Route]] = {}
    for r in ROUTES:
        by_path.setdefault(r.path, {})[r.method] = r
    routes = [StarletteRoute(path, endpoint(table), methods=list(table)) for path, table in by_path.items()]
    known = ", ".join(f"{r.method} {r.path}" for r in ROUTES)

    async def http_exception(request: Any, exc: Any) -> Any:
        path = _clip(request.scope["path"], 80)  # not request.url: that one trusts the Host header
        if exc.status_code == 404:
            return error(404, f"no route {path!r}; try {known}")
        if exc.status_code == 405:
            allow = ", ".join(sorted(m for m in by_path.get(request.scope["path"], {}) if m != "HEAD"))
            return error(405, f"{request.method} is not allowed on {path}; use {allow}", headers=exc.headers)
        return error(exc.status_code, str(exc.detail))

    async def internal_error(request: Any, exc: Exception) -> Any:
        return error(500, "internal error")  # starlette re-raises; uvicorn logs the traceback

    inner = Starlette(routes=routes, exception_handlers={HTTPException: http_exception, Exception: internal_error})
    inner.router.redirect_slashes = False

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            # h11 holds a head to 16 KiB only while it is incomplete; one that came in one read is checked here
            if sum(len(k) + len(v) + 4 for k, v in scope["headers"]) + len(scope["raw_path"]) > MAX_HEADER_BYTES:
                await error(431, f"request headers exceed {MAX_HEADER_BYTES} bytes", close=True)(scope, receive, send)
                return
            if len(scope["path"]) > 1 and scope["path"].endswith("/"):
                scope = {**scope, "path": scope["path"].rstrip("/") or "/"}  # /health/ is /health, as before
        await inner(scope, receive, send)

    app.service = service  # type: ignore[attr-defined]  # for tests and embedding users
    return app


# ---------------------------------------------------------------------------------------------
# The connection: uvicorn's h11 protocol plus the timeouts and limits it lacks.


@dataclass(frozen=True)
class _Limits:
    request_timeout: float
    max_connections: int
    linger: float


def _raw_response(status: int, message: str, headers: dict[str, str] | None = None) -> bytes:
    """A complete ``Connection: close`` JSON error response, written outside any request cycle."""
    body = json.dumps({"error": message}).encode("utf-8")
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}", "content-type: application/json"]
    lines += [f"content-length: {len(body)}", "connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class _Transport:
    """The connection's transport as uvicorn sees it: closing it while the client may still be
    sending (an early 413 or 503) half-closes it instead and drains the input for a moment, so
    that the client reads the answer rather than a reset."""

    def __init__(self, transport: asyncio.Transport, protocol: Any):
        self._transport = transport
        self._protocol = protocol
        self.lingering = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def write(self, data: bytes) -> None:
        if not self.lingering and not self._transport.is_closing():
            self._transport.write(data)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def close(self) -> None:
        if self.lingering or self._transport.is_closing():
            return
        if self._protocol.may_be_sending() and self._transport.can_write_eof():
            self.lingering = True
            self._transport.write_eof()  # the answer goes out, then FIN; reading goes on
            self._transport.resume_reading()
            self._protocol.start_linger()
        else:
            self._transport.close()

    def close_now(self) -> None:
        if not self._transport.is_closing():
            self._transport.close()


@functools.cache
def _protocol_class() -> type:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    waiting = (h11.IDLE, h11.SEND_BODY)  # their states while a request is still coming
    refusals = {"logged": -1e9}

    class Protocol(H11Protocol):
        """uvicorn's h11 protocol (0.54 arms no timer until a first response, and a byte from the
        client cancels its keep-alive timer for good) with:

        * a fresh connection is idle until its first byte: closed after ``idle_timeout``;
        * a request must arrive whole (request line, headers, body) within ``request_timeout`` of
          its first byte: else 408 and closed (slow headers, a short or slow body);
        * beyond ``max_connections`` open connections, a new one is answered 503 and closed;
        * a malformed request gets a JSON 400 (uvicorn's is text);
        * a close while the client is still sending lingers (``_Transport``).
        """

        def __init__(self, config: Any, server_state: Any, app_state: Any, _loop: Any = None, *, limits: _Limits):
            super().__init__(config, server_state, app_state, _loop)
            self.limits = limits
            self.request_timer: asyncio.TimerHandle | None = None
            self.linger_timer: asyncio.TimerHandle | None = None
            self.rejected_early = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(_Transport(transport, self))  # type: ignore[arg-type]
            if len(self.connections) > self.limits.max_connections:
                now = time.monotonic()
                if now - refusals["logged"] > 10:  # one line per 10 s under a flood
                    refusals["logged"] = now
                    log.warning("%d connections open: refusing new ones", len(self.connections) - 1)
                self.rejected_early = True
                self.reject(503, "too many connections; retry later", headers={"retry-after": "1"})
                return
            # a fresh connection is idle until its first byte: uvicorn's keep-alive timer covers it
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

        def data_received(self, data: bytes) -> None:
            if self.transport.is_closing():
                return  # lingering (or closed): the input is dropped
            if self.request_timer is None and self.conn.their_state in waiting:
                self.request_timer = self.loop.call_later(self.limits.request_timeout, self.request_timed_out)
            try:
                super().data_received(data)
            except Exception:  # uvicorn or h11 choking on odd input must not drop the connection unanswered
                log.warning("bad request from %s", self.client, exc_info=True)
                self.reject(400, "invalid HTTP request")
                return
            if self.conn.their_state not in waiting:  # the request is in (or the connection is over)
                self._cancel_request_timer()

        def request_timed_out(self) -> None:
            self.request_timer = None
            if not self.transport.is_closing() and self.conn.their_state in waiting:
                self.reject(408, f"request not received within {self.limits.request_timeout:g} s", linger=False)

        def send_400_response(self, msg: str) -> None:
            self.reject(400, "invalid HTTP request")

        def reject(self, status: int, message: str, *, headers: dict[str, str] | None = None, linger: bool = True):
            """Answer ``status`` now (unless a response is already under way) and close."""
            if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                self.transport.write(_raw_response(status, message, headers))
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.disconnected = True  # the app's receive() answers http.disconnect; its send() is dropped
                self.cycle.message_event.set()
            if linger:
                self.transport.close()
            else:
                self.transport.close_now()

        def may_be_sending(self) -> bool:
            state = self.conn.their_state
            return state in (h11.SEND_BODY, h11.ERROR) or (state is h11.IDLE and self.rejected_early)

        def start_linger(self) -> None:
            self._cancel_request_timer()
            self._unset_keepalive_if_required()
            self.linger_timer = self.loop.call_later(self.limits.linger, self.transport.close_now)

        def shutdown(self) -> None:
            if self.cycle is None or self.cycle.response_complete or self.cycle.disconnected:
                self.transport.close_now()
            else:
                self.cycle.keep_alive = False  # the response under way finishes, then the connection closes

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_request_timer()
            if self.linger_timer is not None:
                self.linger_timer.cancel()
                self.linger_timer = None
            super().connection_lost(exc)

        def _cancel_request_timer(self) -> None:
            if self.request_timer is not None:
                self.request_timer.cancel()
                self.request_timer = None

    return Protocol


# ---------------------------------------------------------------------------------------------
# Running it.


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bind(host: str, port: int, backlog: int) -> socket.socket:
    """A listening socket on ``host:port`` (IPv4 first when the name has both).

    Raises:
        XSearchError: the address does not resolve, is not this machine's, or is in use.
    """
    where = _hostport(host, port)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise XSearchError(f"cannot listen on {where}: {getattr(e, 'strerror', None) or e}") from None
    family, kind, proto, _, address = sorted(infos, key=lambda i: i[0] != socket.AF_INET)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait out TIME_WAIT
        sock.bind(address)
        sock.listen(backlog)
    except OSError as e:
        sock.close()
        raise XSearchError(f"cannot listen on {where}: {e.strerror or e}") from None
    return sock


class Server:
    """The HTTP server of one model.

    ``start()`` runs it in a background thread and returns the port it listens on (useful with
    ``port=0``); ``stop()`` ends it. ``run()`` serves in the calling thread until interrupted
    (Ctrl-C, SIGTERM). A ``with`` block starts and stops it.

    Args:
        model: a ``Predictor``, or the path of an ``.onnx`` file to load with ``settings.threads``.
        settings: the limits and the address (default: ``ServeSettings()``).

    Raises:
        UnavailableError: uvicorn or starlette is not installed.
    """

    def __init__(self, model: Predictor | str | os.PathLike, settings: ServeSettings | None = None):
        _require()
        self.settings = settings or ServeSettings()
        if isinstance(model, (str, os.PathLike)):
            from xsearch.export.predictor import Predictor

            model = Predictor(model, threads=self.settings.threads)
        self.predictor = model
        self.app = build_app(model, self.settings)
        self.port: int | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    def _prepare(self) -> socket.socket:
        import uvicorn

        s = self.settings
        sock = _bind(s.host, s.port, s.backlog)
        self.port = sock.getsockname()[1]
        limits = _Limits(s.request_timeout, s.max_connections, min(LINGER_SECONDS, s.request_timeout))
        config = uvicorn.Config(
            self.app,
            http=functools.partial(_protocol_class(), limits=limits),  # type: ignore[arg-type]
            ws="none",  # no upgrade path around the protocol's limits
            loop="asyncio",
            interface="asgi3",
            lifespan="off",
            log_config=None,  # the embedding program's logging stays as it is
            access_log=False,
            proxy_headers=False,
            server_header=False,
            backlog=s.backlog,
            timeout_keep_alive=s.idle_timeout,  # type: ignore[arg-type]  # a float works (call_later)
            timeout_graceful_shutdown=SHUTDOWN_SECONDS,
            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        )
        self._server = uvicorn.Server(config)
        if not _is_loopback(s.host):
            log.warning("listening on %s: reachable beyond this machine", s.host)
        log.info("serving %s on http://%s (POST /predict, GET /health)", self.predictor.path,
                 _hostport(s.host, self.port))  # fmt: skip
        return sock

    def run(self) -> None:
        """Serve in this thread until interrupted (KeyboardInterrupt after a graceful stop)."""
        sock = self._prepare()
        try:
            self._server.run(sockets=[sock])
        finally:
            sock.close()

    def start(self, timeout: float = 30.0) -> int:
        """Serve in a background thread; returns the port once it accepts connections."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("the server is already running")
        sock = self._prepare()
        self._failure = None
        self._thread = threading.Thread(target=self._run_in_thread, args=(sock,), name="xsearch-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server on port {self.port} did not start") from self._failure
            time.sleep(0.01)
        return self.port  # type: ignore[return-value]

    def _run_in_thread(self, sock: socket.socket) -> None:
        try:
            self._server.run(sockets=[sock])
        except BaseException as e:  # noqa: BLE001 (uvicorn exits with SystemExit on a startup failure)
            self._failure = e
            log.error("the server stopped: %r", e)
        finally:
            sock.close()

    def stop(self, timeout: float = SHUTDOWN_SECONDS + 5) -> None:
        """Stop accepting, let requests in flight finish (``SHUTDOWN_SECONDS`` at most), and join."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(path: str | os.PathLike, settings: ServeSettings | None = None) -> None:
    """Serve the ``.onnx`` file at ``path`` until interrupted (blocking).

    Raises:
        UnavailableError: uvicorn or starlette is not installed (``pip install 'xsearch[serve]'``).
        XSearchError: the address cannot be listened on, or the file cannot be loaded.
    """
    Server(path, settings).run()
