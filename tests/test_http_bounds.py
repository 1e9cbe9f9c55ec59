"""Network reads are bounded (microbench/sglang/http.py): a total deadline for a reply that
trickles in, a byte cap for one that never ends, and no redirect followed off the given host.
Real sockets on loopback, a tiny server per test."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from microbench.sglang import http as H
from microbench.sglang import metrics
from reports.base.errors import CliError


def _serve(handler) -> str:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def run():
        conn, _ = srv.accept()
        conn.recv(65536)
        try:
            handler(conn)
        except OSError:
            pass
        finally:
            conn.close()
            srv.close()
    threading.Thread(target=run, daemon=True).start()
    return f"http://127.0.0.1:{srv.getsockname()[1]}"


def test_a_reply_that_trickles_in_hits_the_total_deadline():
    def drip(conn):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(40):
            conn.sendall(b"x")
            time.sleep(0.1)
    t0 = time.monotonic()
    with pytest.raises(CliError, match="within the deadline"):
        H.request(_serve(drip), "GET", "/v1/models", timeout=1.0)
    assert time.monotonic() - t0 < 2.5     # each byte came in time; the whole reply did not


def test_an_endless_reply_hits_the_byte_cap():
    def endless(conn):
        conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
        while True:
            conn.sendall(b"y" * 65536)
    with pytest.raises(CliError, match="larger than 1 MB"):
        H.request(_serve(endless), "GET", "/v1/models", timeout=10.0, max_bytes=1 << 20)


def test_a_redirect_is_never_followed():
    def redirect(conn):
        conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: http://198.51.100.7/metrics\r\n"
                     b"Content-Length: 0\r\n\r\n")
    with pytest.raises(CliError, match="does not follow redirects"):
        metrics.read_metrics(_serve(redirect) + "/metrics")
