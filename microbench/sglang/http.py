"""Bounded HTTP for the live probe and /metrics: every read has a total deadline and a byte cap,
and redirects are never followed (a server may not send ppscope's traffic to another host).

`http.client` (stdlib): the socket timeout bounds one wait, not a reply that trickles in a byte
at a time, so the body is read in chunks and the deadline is checked between them; the socket
timeout is shrunk to what is left of it before each read.
"""
from __future__ import annotations

import http.client
import json
import re
import time
import urllib.parse

from reports.base.errors import CliError

MAX_REPLY_BYTES = 16 << 20     # an OpenAI-style JSON reply or a /metrics page is far smaller
CHUNK = 64 << 10


_HOST = re.compile(r"^[A-Za-z0-9._\-:\[\]%]+$")   # a name, IPv4, or [IPv6]; no space or control


def shown(url: str) -> str:
    """A URL as an error message quotes it: one line, at most 80 characters."""
    r = repr(url) if not url.isprintable() or " " in url else url
    return r if len(r) <= 80 else r[:77] + "..."


def split_url(url: str) -> tuple[str, int, str, bool]:
    """(host, port, base path, tls) of an http(s) URL; a bare host:port means http."""
    if not url or not url.isprintable() or any(c.isspace() for c in url):
        raise CliError(f"{shown(url)}: not an http(s) URL (it has spaces or control characters)")
    u = urllib.parse.urlparse(url if "://" in url else "http://" + url)
    if u.scheme not in ("http", "https") or not u.hostname or not _HOST.match(u.netloc.rsplit(
            "@", 1)[-1]):
        raise CliError(f"{shown(url)}: not an http(s) URL")
    try:
        port = u.port or (443 if u.scheme == "https" else 80)
    except ValueError:
        raise CliError(f"{url}: bad port") from None
    return u.hostname, port, u.path.rstrip("/"), u.scheme == "https"


def connect(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    host, port, base, tls = split_url(url)
    cls = http.client.HTTPSConnection if tls else http.client.HTTPConnection
    return cls(host, port, timeout=max(0.05, timeout)), base


def read_body(r: http.client.HTTPResponse, conn, deadline: float, max_bytes: int,
              what: str) -> bytes:
    """The whole body, or a one-line CliError past the deadline or the byte cap."""
    out = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CliError(f"{what}: no complete reply within the deadline ({len(out)} bytes "
                           "so far)")
        if conn.sock is not None:
            conn.sock.settimeout(max(0.05, left))
        try:
            b = r.read1(CHUNK) if hasattr(r, "read1") else r.read(CHUNK)
        except TimeoutError:   # socket.timeout: the deadline ran out inside a wait
            raise CliError(f"{what}: no complete reply within the deadline ({len(out)} bytes "
                           "so far)") from None
        if not b:
            return bytes(out)
        out += b
        if len(out) > max_bytes:
            raise CliError(f"{what}: reply larger than {max_bytes >> 20} MB; stopped reading")


def request(url: str, method: str, path: str, body: dict | None = None, *,
            timeout: float = 30.0, max_bytes: int = MAX_REPLY_BYTES) -> tuple[int, bytes]:
    """(status, body bytes). A redirect is returned as its status, never followed."""
    deadline = time.monotonic() + timeout
    c, base = connect(url, timeout)
    what = f"{url}{path}"
    try:
        data = json.dumps(body).encode() if body is not None else None
        c.request(method, base + path, body=data, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if 300 <= r.status < 400:
            raise CliError(f"{what}: the server redirects ({r.status} to "
                           f"{r.getheader('Location')!r}); ppscope does not follow redirects")
        return r.status, read_body(r, c, deadline, max_bytes, what)
    except (OSError, http.client.HTTPException) as e:
        raise CliError(f"{url}: {reach_error(e)}") from None
    finally:
        c.close()


def reach_error(e: Exception) -> str:
    """What went wrong talking to a server, in words: a reply that is not HTTP is said to be
    one (its bytes are never echoed), a refused or timed-out connection is `cannot reach`."""
    if isinstance(e, http.client.RemoteDisconnected):
        return "the server closed the connection without a reply"
    if isinstance(e, (http.client.BadStatusLine, http.client.LineTooLong,
                      http.client.IncompleteRead)) or (
            isinstance(e, http.client.HTTPException) and not isinstance(e, OSError)):
        return "the reply is not HTTP (is it an HTTP server on that port?)"
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    return f"cannot reach server ({msg[:120]})"
