"""``xsearch serve`` over real sockets on 127.0.0.1: answers, limits, timeouts, and what attackers send."""

import contextlib
import http.client
import json
import logging
import select
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from xsearch.errors import SettingError, UnavailableError, XSearchError
from xsearch.export import Predictor
from xsearch.export.serve import Server, ServeSettings, build_app

REQUEST_TIMEOUT, IDLE_TIMEOUT, SLACK = 2.0, 1.0, 2.0
MAX_BODY, MAX_BATCH, MAX_CONCURRENCY = 256 * 1024, 8, 4


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    """A tiny, untrained ListOps classifier exported to ONNX (its predictions are arbitrary but fixed)."""
    import torch

    import xsearch
    from xsearch.export import to_onnx
    from xsearch.tasks import get_task

    task = get_task("listops", n_train=8, n_valid=8, n_test=8, min_len=8, max_len=64, max_depth=4, seed=1)
    torch.manual_seed(0)
    cfg = xsearch.ModelConfig(**task.model_fields(), d_model=16, n_layers=1, n_heads=2, attention="full")
    path = tmp_path_factory.mktemp("serve") / "m.onnx"
    to_onnx(xsearch.build_model(cfg).eval(), path, task=task.describe(), check=False)
    return path


@pytest.fixture(scope="module")
def predictor(model_path):
    return Predictor(model_path, threads=1)


@pytest.fixture(scope="module")
def server(predictor):
    settings = ServeSettings(port=0, request_timeout=REQUEST_TIMEOUT, idle_timeout=IDLE_TIMEOUT, max_body=MAX_BODY,
                             max_batch=MAX_BATCH, max_concurrency=MAX_CONCURRENCY)  # fmt: skip
    with Server(predictor, settings) as s:
        yield s


def call(port, method, path, body=None, headers=None):
    """``(status, headers, decoded JSON)`` of one request on a fresh connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(data) if data else None
    finally:
        conn.close()


def read_response(sock):
    """``(status, body bytes)`` of one response read off ``sock`` (``(None, b"")`` if it closed first)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None, b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(v) for k, _, v in (x.partition(":") for x in lines[1:]) if k.strip().lower() == "content-length")
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), body[:length]


def exchange(port, data, timeout=20.0):
    """Send raw bytes (a send the server cuts short is not an error), then read one response and
    wait for the close: ``(status, parsed JSON body, seconds until closed)``."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    start = time.monotonic()
    try:
        with contextlib.suppress(OSError):
            sock.sendall(data)
        status, body = read_response(sock)
        while sock.recv(65536):
            pass
        return status, json.loads(body) if body else None, time.monotonic() - start
    finally:
        sock.close()


def post(body, extra=b""):
    return b"POST /predict HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n%s\r\n" % (len(body), extra) + body


def assert_json_error(status, body, sent=b"", statuses=range(400, 500), what=""):
    assert status in statuses, (what or sent[:80], status, body)
    assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"], body
    if len(sent) > 4:
        assert sent.decode("utf-8", "replace") not in body["error"]
    assert "Traceback" not in body["error"]


@pytest.fixture
def gate(predictor, monkeypatch):
    """Holds every model run until ``gate.set()``, so requests stay in flight."""
    event, original = threading.Event(), predictor.predict

    def held(*args, **kw):
        assert event.wait(30), "the test never opened the gate"
        return original(*args, **kw)

    monkeypatch.setattr(predictor, "predict", held)
    yield event
    event.set()


# -- answers -------------------------------------------------------------------------------------


def test_predictions_match_the_predictor(server, predictor):
    cases = [
        (["[MAX 1 2 ]", "[MIN 4 [SM 3 5 ] ]"], {}),
        ([[5, 6, 7], [3, 1]], {}),
        ({"inputs": ["[SM 1 " + "2 " * 80 + "]"], "truncate": True}, {"truncate": True}),
        ({"inputs": [[4, 5]], "truncate": False}, {}),
    ]
    for payload, kw in cases:
        inputs = payload["inputs"] if isinstance(payload, dict) else payload
        want = [p.to_dict() for p in predictor.predict(inputs, **kw)]
        status, _, body = call(server.port, "POST", "/predict", json.dumps(payload))
        assert status == 200 and body == {"predictions": json.loads(json.dumps(want))}
    status, _, body = call(server.port, "GET", "/health")
    assert status == 200 and body == {"status": "ok", "model": predictor.path, "kind": "classify", "max_len": 64,
                                      "xsearch_version": predictor.version, "generate": False}  # fmt: skip
    assert call(server.port, "GET", "/health/")[0] == 200


def test_routes_and_methods(server, gate):
    status, headers, body = call(server.port, "GET", "/predict")
    assert_json_error(status, body, statuses=[405])
    assert headers["allow"] == "POST"
    for method in ("PUT", "DELETE", "PATCH"):
        status, headers, body = call(server.port, method, "/predict", b"[]")
        assert_json_error(status, body, statuses=[405])
        assert "POST" in headers["allow"]
    status, headers, body = call(server.port, "POST", "/health", b"{}")
    assert_json_error(status, body, statuses=[405])
    assert "GET" in headers["allow"]
    status, _, body = call(server.port, "GET", "/nope")
    assert_json_error(status, body, statuses=[404])
    assert "/predict" in body["error"]
    # /health answers while a batch is held in the model
    result = {}
    t = threading.Thread(target=lambda: result.update(r=call(server.port, "POST", "/predict", b'["[MAX 1 2 ]"]')))
    t.start()
    deadline = time.monotonic() + 10
    while server.app.service.in_flight < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.app.service.in_flight == 1
    start = time.monotonic()
    assert call(server.port, "GET", "/health")[0] == 200
    assert time.monotonic() - start < 1.0
    gate.set()
    t.join(20)
    assert result["r"][0] == 200


# -- malformed requests --------------------------------------------------------------------------


MALFORMED = [
    b"{oops",
    b"\xff\xfe[\x00]\x00",  # not UTF-8 (UTF-16 with a BOM)
    b"[" * 100_000,  # RecursionError in the parser
    b"[[100000000000000000000000000]]",  # OverflowError in numpy, before
    b"[[" + b"9" * 5000 + b"]]",  # over Python's digit limit for int()
    b"[[-1, 2]]",
    b"[[true, false]]",
    b"[[1, true]]",
    b"[[1.5, 2]]",
    b"[[NaN]]",
    b'{"inputs": ["[MAX 1 2 ]"], "truncate": "no"}',
    b'{"inputs": ["[MAX 1 2 ]"], "truncate": 1}',
    b'{"inputs": "[MAX 1 2 ]"}',
    b'{"input": ["[MAX 1 2 ]"]}',
    b'{"inputs": ["[MAX 1 2 ]"], "top_k": 5}',
    b'"[MAX 1 2 ]"',
    b"[1, 2, 3]",
    b"[[1, [2]]]",
    b'[{"text": "[MAX 1 2 ]"}]',
    b"null",
    b"[]",
    b'{"inputs": []}',
    b"[[]]",
    b'[""]',
    b'["[BAD ]"]',
    b'["[MAX ' + b"1 " * 70 + b']"]',  # over max_len, without truncate
    b"",
]


def test_malformed_bodies_are_json_4xx_without_the_body(server):
    for sent in MALFORMED:
        status, body, _ = exchange(server.port, post(sent, b"Connection: close\r\n"))
        assert_json_error(status, body, sent, statuses=[400])
    too_many = json.dumps(["[MAX 1 2 ]"] * (MAX_BATCH + 1)).encode()
    status, body, _ = exchange(server.port, post(too_many, b"Connection: close\r\n"))
    assert_json_error(status, body, too_many, statuses=[413])
    head = b"GET /health HTTP/1.1\r\nHost: t\r\n"
    for garbage in (
        b"\x16\x03\x01\x00\xa5\x01\x00",
        head + b"X: y\r\n" * 50_000 + b"\r\n",
        head + b"X: y\r\n" * 4000 + b"\r\n",
    ):
        status, body, _ = exchange(server.port, garbage)  # a TLS hello, 300 KB of headers, 24 KB of headers
        assert_json_error(status, body, statuses=[400, 431])


def test_oversized_bodies_are_cut_at_the_limit(server):
    big = b"[" + b'"[MAX 1 2 ]", ' * (MAX_BODY // 8) + b"]"  # 1.75 MB, over max_body whatever its headers say
    cases = {
        "negative length": (b"POST /predict HTTP/1.1\r\nHost: t\r\nContent-Length: -1\r\n\r\n" + big, [400]),
        "honest length": (post(big), [413]),
        "huge length": (b"POST /predict HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999999999\r\n\r\n", [413]),
        "lying length": (b"POST /predict HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n" + big, [400, 413]),
        "chunked": (
            b"POST /predict HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (big[i : i + 65536] for i in range(0, len(big), 65536)))
            + b"0\r\n\r\n",
            [413],
        ),
    }
    for name, (data, statuses) in cases.items():
        status, body, seconds = exchange(server.port, data)
        assert_json_error(status, body, statuses=statuses, what=name)
        assert seconds < REQUEST_TIMEOUT + SLACK, name


# -- slow and idle clients -----------------------------------------------------------------------


def timed_close(port, first, then=b"", every=0.0):
    """Send ``first``, then ``then`` byte by byte every ``every`` s until the server answers;
    ``(status or None, seconds until the server closed)``."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=REQUEST_TIMEOUT + 10)
    start = time.monotonic()
    try:
        sock.sendall(first)
        for b in then:
            if select.select([sock], [], [], every)[0]:
                break  # an answer, or the close
            sock.sendall(bytes([b]))
        try:
            status, _ = read_response(sock)
            while sock.recv(1024):
                pass
        except ConnectionResetError:
            status = None
        return status, time.monotonic() - start
    finally:
        sock.close()


def test_slow_clients_are_cut_off_within_request_timeout(server):
    cases = {
        "slow headers": (b"POST /predict HTTP/1.1\r\n", b""),
        "a trickle of header bytes": (b"POST /predict HTTP/1.1\r\n", b"X-Slow: 1234567890"),
        "short body": (b"POST /predict HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n0123456789", b""),
    }
    results = {}
    threads = [threading.Thread(target=lambda n=n, c=c: results.update({n: timed_close(server.port, *c, every=0.3)}))
               for n, c in cases.items()]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(REQUEST_TIMEOUT + 15)
    for name, (status, seconds) in results.items():
        assert status in (408, None), name
        assert REQUEST_TIMEOUT - 0.5 < seconds < REQUEST_TIMEOUT + SLACK, (name, seconds)
    assert len(results) == len(cases)


def test_idle_connections_are_closed_within_idle_timeout(server):
    results = {}

    def after_a_request():
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        try:
            sock.sendall(post(b'["[MAX 1 2 ]"]'))
            status, _ = read_response(sock)
            start = time.monotonic()
            assert sock.recv(1024) == b""  # closed by the server, not by our timeout
            results["kept alive"] = (status, time.monotonic() - start)
        finally:
            sock.close()

    def fresh():
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            start = time.monotonic()
            assert sock.recv(1024) == b""
            results["fresh"] = (200, time.monotonic() - start)

    threads = [threading.Thread(target=after_a_request), threading.Thread(target=fresh)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert set(results) == {"kept alive", "fresh"}
    for name, (status, seconds) in results.items():
        assert status == 200 and IDLE_TIMEOUT - 0.5 < seconds < IDLE_TIMEOUT + SLACK, (name, seconds)


# -- load ----------------------------------------------------------------------------------------


def test_200_simultaneous_clients_all_get_an_answer(server, gate):
    n = 200
    barrier, results, errors = threading.Barrier(n), [], []

    def client():
        try:
            barrier.wait(30)
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            try:
                sock.sendall(post(b'["[MAX 1 2 ]", [3, 4]]'))
                status, body = read_response(sock)
                results.append((status, json.loads(body)))
            finally:
                sock.close()
        except Exception as e:  # a reset, a refusal, a timeout
            errors.append(repr(e))

    threads = [threading.Thread(target=client) for _ in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while len(results) + len(errors) < n - MAX_CONCURRENCY and time.monotonic() < deadline:
        time.sleep(0.02)
    gate.set()  # the requests in flight may finish now
    for t in threads:
        t.join(30)
    assert errors == [] and len(results) == n
    statuses = [s for s, _ in results]
    assert statuses.count(200) == MAX_CONCURRENCY and statuses.count(503) == n - MAX_CONCURRENCY
    assert all(len(b["predictions"]) == 2 for s, b in results if s == 200)
    assert all("busy" in b["error"] for s, b in results if s == 503)
    assert server.app.service.in_flight == 0


def test_connections_beyond_max_connections_get_503(predictor):
    with Server(predictor, ServeSettings(port=0, max_connections=2, idle_timeout=5)) as s:
        idle = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(2)]
        try:
            time.sleep(0.2)
            status, body, _ = exchange(s.port, post(b'["[MAX 1 2 ]"]'))
            assert_json_error(status, body, statuses=[503])
        finally:
            for sock in idle:
                sock.close()
        time.sleep(0.2)
        assert call(s.port, "POST", "/predict", b'["[MAX 1 2 ]"]')[0] == 200


# -- errors inside ---------------------------------------------------------------------------------


def test_a_bug_is_a_500_that_says_internal_error(server, predictor, monkeypatch, caplog):
    def broken(*args, **kw):
        raise RuntimeError("secret detail")

    monkeypatch.setattr(predictor, "predict", broken)
    caplog.set_level(logging.ERROR, logger="xsearch.serve")
    status, _, body = call(server.port, "POST", "/predict", b'["[MAX 1 2 ]"]')
    assert status == 500 and body == {"error": "internal error"}
    assert any(r.exc_info and "secret detail" in str(r.exc_info[1]) for r in caplog.records)


def test_predictor_refuses_bools_and_out_of_range_ids(predictor):
    cases = [([[True, 2]], "bool"), ([[1, np.bool_(False)]], "bool"), ([[10**27]], r"outside \[0, 16\)"),
             ([[-1]], "outside"), ([[16]], "token id 16 "), ([[1, 2.0]], "float"), ([[1, "2"]], "str")]  # fmt: skip
    for bad, match in cases:
        with pytest.raises(ValueError, match=match):
            predictor.predict(bad)
    ids, mask = predictor.encode([[np.int64(3), 4], (5,)])
    assert ids.tolist() == [[3, 4], [5, 0]] and mask.tolist() == [[True, True], [True, False]]


# -- settings, binding, packaging ----------------------------------------------------------------


def test_settings_are_checked():
    for kw, field in [({"port": 70000}, "port"), ({"port": -1}, "port"), ({"max_batch": 0}, "max_batch"),
                      ({"max_body": -5}, "max_body"), ({"max_concurrency": 0}, "max_concurrency"),
                      ({"threads": 0}, "threads"), ({"request_timeout": 0}, "request_timeout"),
                      ({"idle_timeout": -1.0}, "idle_timeout"), ({"host": ""}, "host"),
                      ({"max_batch": True}, "max_batch")]:  # fmt: skip
        with pytest.raises(SettingError) as err:
            ServeSettings(**kw)
        assert err.value.fields == (field,) and field in str(err.value)
    s = ServeSettings()
    assert (s.host, s.port, s.max_batch, s.max_body) == ("127.0.0.1", 8080, 64, 1 << 20)


def test_binding_errors_name_the_address(predictor):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(XSearchError, match=f"127.0.0.1:{port}.*in use"):
            Server(predictor, ServeSettings(port=port)).start()
    with pytest.raises(XSearchError, match="192.0.2.1:0"):  # TEST-NET: no machine has it
        Server(predictor, ServeSettings(host="192.0.2.1", port=0)).start()


def test_missing_extra_is_unavailable(predictor, monkeypatch):
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    with pytest.raises(UnavailableError, match=r"pip install 'xsearch\[serve\]'"):
        build_app(predictor)


def test_serving_never_imports_torch(model_path):
    code = (
        "import json, sys, urllib.request\n"
        "from xsearch.export.serve import Server, ServeSettings\n"
        f"with Server({str(model_path)!r}, ServeSettings(port=0)) as s:\n"
        "    req = urllib.request.Request(f'http://127.0.0.1:{s.port}/predict', data=b'[\"[MAX 1 2 ]\"]')\n"
        "    print(json.load(urllib.request.urlopen(req, timeout=20))['predictions'][0]['label'])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() in [str(i) for i in range(10)]
