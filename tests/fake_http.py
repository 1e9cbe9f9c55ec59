"""The request handler the tests' fake HTTP servers build on: no request log, one reply helper."""
from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


class QuietHandler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, code: int, body, ctype: str = "application/json") -> None:
        """One whole reply: `body` as it is where it is bytes, else as JSON."""
        if not isinstance(body, bytes):
            body = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
