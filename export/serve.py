"""A small HTTP server around a ``Predictor`` (standard library only; no torch).

``POST /predict`` takes a JSON list of inputs (strings or token-id lists), or an object
``{"inputs": [...], "truncate": bool}``, and answers ``{"predictions": [...]}``.
``GET /health`` answers ``{"status": "ok", ...}``. Malformed requests get 400 with a reason,
oversized ones 413. Binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from xsearch.export.predictor import Predictor

log = logging.getLogger("xsearch.serve")
MAX_BODY_BYTES = 1 << 20
MAX_BATCH = 64


class _Handler(BaseHTTPRequestHandler):
    server: PredictServer  # type: ignore[assignment]
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:  # through logging, not stderr
        log.debug("%s " + fmt, self.address_string(), *args)

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        if self.path.rstrip("/") == "/health":
            p = self.server.predictor
            self._send(200, {"status": "ok", "model": p.path, "kind": p.kind, "max_len": p.max_len,
                             "xsearch_version": p.version})  # fmt: skip
        else:
            self._send(404, {"error": f"no route {self.path!r}; try POST /predict or GET /health"})

    def do_POST(self) -> None:  # noqa: N802
        if self.path.rstrip("/") != "/predict":
            self._send(404, {"error": f"no route {self.path!r}; try POST /predict"})
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._send(411, {"error": "Content-Length header required"})
            return
        if length > self.server.max_body:
            self._send(413, {"error": f"request body of {length} bytes exceeds the limit of {self.server.max_body}"})
            self.close_connection = True
            return
        raw = self.rfile.read(length)
        try:
            payload = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            self._send(400, {"error": f"body is not valid JSON: {e}"})
            return
        truncate = False
        if isinstance(payload, dict):
            truncate = bool(payload.get("truncate", False))
            payload = payload.get("inputs")
        if not isinstance(payload, list) or not payload:
            self._send(400, {"error": 'expected a non-empty JSON list of inputs, or {"inputs": [...]}'})
            return
        if len(payload) > self.server.max_batch:
            self._send(413, {"error": f"batch of {len(payload)} inputs exceeds the limit of {self.server.max_batch}"})
            return
        try:
            with self.server.lock:  # one onnxruntime run at a time keeps the thread budget honest
                preds = self.server.predictor.predict(payload, truncate=truncate)
        except ValueError as e:
            self._send(400, {"error": str(e)})
            return
        self._send(200, {"predictions": [p.to_dict() for p in preds]})


class PredictServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` holding one ``Predictor``."""

    daemon_threads = True

    def __init__(self, predictor: Predictor, host: str = "127.0.0.1", port: int = 8080, *,
                 max_body: int = MAX_BODY_BYTES, max_batch: int = MAX_BATCH):  # fmt: skip
        super().__init__((host, port), _Handler)
        self.predictor = predictor
        self.max_body = max_body
        self.max_batch = max_batch
        self.lock = threading.Lock()


def serve(path: str, host: str = "127.0.0.1", port: int = 8080, *, threads: int | None = None,
          max_body: int = MAX_BODY_BYTES, max_batch: int = MAX_BATCH) -> None:  # fmt: skip
    """Serve ``path`` until interrupted."""
    server = PredictServer(Predictor(path, threads=threads), host, port, max_body=max_body, max_batch=max_batch)
    log.info("serving %s on http://%s:%d (POST /predict, GET /health)", path, host, server.server_address[1])
    try:
        server.serve_forever()
    finally:
        server.server_close()
