"""HTTP front-end of `ppscope dispatch --serve`: an OpenAI-compatible endpoint with SGLang's
control routes, in front of the PP loop's `ServeState` (microbench/dispatch/serve.py).

Routes (shapes as SGLang 0.5.23's entrypoints/http_server.py and entrypoints/openai/, only what
the live probe and a user need):
- `POST /v1/completions`, `POST /v1/chat/completions`: `prompt` (text, or token ids) /
  `messages`; `max_tokens` (chat also `max_completion_tokens`; default 16); `stream` (SSE: one
  `data: {...}` chunk per generated token, the last with `finish_reason: "length"`, an optional
  usage chunk with `stream_options.include_usage`, then `data: [DONE]`) or one JSON reply with
  `usage`. `n` must be 1; `temperature`, `ignore_eos` and other sampling fields are accepted and
  have no effect (the probe never stops early).
- `GET /v1/models`, `GET /health` (and `/health_generate`: 200 once the loop runs, 503 before and
  after), `GET /get_server_info` (and `/server_info`): the settings under SGLang's names, with
  `internal_states`; `GET /get_internal_state`: that list alone (SGLang 0.5.23 has no such route:
  it shows it inside `/server_info`).
- `POST /set_internal_state` (also PUT): `{"server_args": {"pp_max_micro_batch_size": N}}`
  (SGLang's body; a bare `{"pp_max_micro_batch_size": N}` is taken too) -> `[true]` once rank 0
  applied it at a loop boundary (every rank applies it at the same iteration), `[false]` when
  refused (unknown key, N out of [1, max_running_requests // pp]), as SGLang answers.
- `POST /start_profile` (`output_dir`, `num_steps`, `activities`, `profile_id`) and
  `POST /stop_profile` (GET too): start / stop the torch profiler on every rank; the reply to
  a stop comes once every rank's trace is written.
- `GET /metrics`: Prometheus text (ServeState.metrics_text).

Every error is one line of JSON (`{"object": "error", "message": ..., "code": N}`) with its
status code; request bodies are bounded (MAX_BODY) and read with a socket timeout; no traceback
ever reaches a client. Stdlib only (http.server.ThreadingHTTPServer, one thread per connection).
"""
from __future__ import annotations

import json
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from microbench.dispatch.serve import (DEFAULT_MAX_TOKENS, MAX_TOKENS_LIMIT, QueueFull, ServeClosed,
                              ServeState, prompt_tokens_of_text, token_text)

MAX_BODY = 1 << 20          # 1 MiB: a prompt of ~260k tokens at 4 bytes per token
READ_TIMEOUT_S = 30.0       # a client that stops sending its request is dropped
CONTROL_TIMEOUT_S = 120.0   # a stop_profile waits for every rank's trace
TOKEN_WAIT_S = 1.0          # poll interval while a request waits for its next token


class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _int_field(body: dict, name: str, lo: int, hi: int, default=None):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise BadRequest(400, f"{name} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def completion_request(body, chat: bool) -> tuple[int, int, bool, bool]:
    """A completions / chat body -> (prompt tokens, max_tokens, stream, include_usage)."""
    if not isinstance(body, dict):
        raise BadRequest(400, "the request body must be a JSON object")
    if _int_field(body, "n", 1, 1, 1) != 1:
        raise BadRequest(400, "n must be 1")
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest(400, "messages must be a non-empty list")
        text = []
        for m in msgs:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                text.append(c)
            elif isinstance(c, list):   # content parts: their text
                text += [p.get("text", "") for p in c if isinstance(p, dict)
                         and isinstance(p.get("text", ""), str)]
            elif c is not None:
                raise BadRequest(400, "message content must be text or a list of parts")
        prompt = prompt_tokens_of_text("".join(text))
        mt = body.get("max_completion_tokens", body.get("max_tokens"))
        max_tokens = _int_field({"max_tokens": mt}, "max_tokens", 1, MAX_TOKENS_LIMIT,
                                DEFAULT_MAX_TOKENS)
    else:
        p = body.get("prompt")
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
            p = p[0]   # a batch of one
        if isinstance(p, str):
            prompt = prompt_tokens_of_text(p)
        elif isinstance(p, list) and p and all(isinstance(x, int) and not isinstance(x, bool)
                                               for x in p):
            prompt = len(p)   # token ids: exact
        else:
            raise BadRequest(400, "prompt must be a string or a list of token ids (one prompt)")
        max_tokens = _int_field(body, "max_tokens", 1, MAX_TOKENS_LIMIT, DEFAULT_MAX_TOKENS)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(400, "stream must be true or false")
    so = body.get("stream_options") or {}
    usage = bool(isinstance(so, dict) and so.get("include_usage"))
    return prompt, max_tokens, stream, usage


def control_args(path: str, body) -> tuple[str, dict]:
    """A control route's body -> (kind, checked args)."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise BadRequest(400, "the request body must be a JSON object")
    if path == "/set_internal_state":
        args = body.get("server_args", body)
        if not isinstance(args, dict) or not args:
            raise BadRequest(400, 'expected {"server_args": {"pp_max_micro_batch_size": N}}')
        for k, v in args.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise BadRequest(400, f"server_args.{k} must be a number, got {v!r}")
        return "set_internal_state", {k: (int(v) if float(v).is_integer() else v)
                                      for k, v in args.items()}
    if path == "/start_profile":
        out = {}
        od = body.get("output_dir")
        if od is not None and (not isinstance(od, str) or not od or "\x00" in od):
            raise BadRequest(400, "output_dir must be a non-empty string")
        out["output_dir"] = od
        out["num_steps"] = _int_field(body, "num_steps", 1, 1 << 20)
        acts = body.get("activities")
        if acts is not None:
            if not isinstance(acts, list) or not all(isinstance(a, str) for a in acts):
                raise BadRequest(400, "activities must be a list of names (CPU, GPU)")
            bad = [a for a in acts if a not in ("CPU", "GPU")]
            if bad:
                raise BadRequest(400, f"activities {bad}: this probe records CPU and GPU only")
        out["activities"] = acts
        pid = body.get("profile_id")
        if pid is not None and (not isinstance(pid, str) or not pid.replace(".", "").replace(
                "-", "").replace("_", "").isalnum()):
            raise BadRequest(400, "profile_id must be letters, digits, '.', '-' or '_'")
        out["profile_id"] = pid
        return "start_profile", out
    return "stop_profile", {}


class Handler(BaseHTTPRequestHandler):
    server_version = "ppscope-dispatch-serve"
    sys_version = ""
    timeout = READ_TIMEOUT_S
    state: ServeState     # set on the subclass by make_server

    def log_message(self, fmt, *args):   # quiet: a served loop logs nothing per request
        pass

    # ---- replies
    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _error(self, status: int, message: str) -> None:
        msg = " ".join(str(message).split())[:500]
        self._json(status, {"object": "error", "message": msg, "type": _ERROR_TYPE.get(
            status, "InternalServerError"), "param": None, "code": status})

    def _body(self):
        n = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raise BadRequest(411, "send the body with a Content-Length")
        if n is None:
            return None
        try:
            n = int(n)
        except ValueError:
            raise BadRequest(400, "bad Content-Length") from None
        if n < 0:
            raise BadRequest(400, "bad Content-Length")
        if n > MAX_BODY:
            raise BadRequest(413, f"request body over {MAX_BODY} bytes")
        raw = self.rfile.read(n)
        if len(raw) < n:
            raise BadRequest(400, "request body shorter than its Content-Length")
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BadRequest(400, "the request body is not valid JSON") from None

    def _dispatch(self, method: str) -> None:
        path = urllib.parse.urlsplit(self.path).path.rstrip("/") or "/"
        try:
            route = _ROUTES.get(path)
            if route is None:
                raise BadRequest(404, f"no route {path}")
            methods, fn = route
            if method not in methods:
                raise BadRequest(405, f"{method} {path}: use {' or '.join(methods)}")
            body = self._body() if method in ("POST", "PUT") else None
            fn(self, path, body)
        except BadRequest as e:
            self._error(e.status, str(e))
        except (ServeClosed, QueueFull) as e:
            self._error(503, str(e))
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass   # the client went away or stalled: nothing to answer
        except Exception as e:  # noqa: BLE001 - one line to the client, never a traceback
            try:
                self._error(500, f"internal error: {type(e).__name__}")
            except OSError:
                pass
            print(f"serve: {self.command} {path}: {type(e).__name__}: "
                  f"{str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr)

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    # ---- routes
    def health(self, path, body):
        self._send(200 if self.state.healthy() else 503, b"", "text/plain")

    def models(self, path, body):
        name = self.state.args.served_model_name
        self._json(200, {"object": "list", "data": [
            {"id": name, "object": "model", "created": int(self.state.started),
             "owned_by": "sglang", "root": name}]})

    def server_info(self, path, body):
        st = self.state
        info = st.args.as_dict()
        info.update(internal_states=[st.internal_state()], version="ppscope dispatch --serve",
                    startup_time=st.started, frontend="python")
        self._json(200, info)

    def internal_state(self, path, body):
        self._json(200, [self.state.internal_state()])

    def metrics(self, path, body):
        self._send(200, self.state.metrics_text().encode(),
                   "text/plain; version=0.0.4; charset=utf-8")

    def control(self, path, body):
        kind, args = control_args(path, body)
        status, reply = self.state.control(kind, args, CONTROL_TIMEOUT_S)
        if status != 200:
            self._error(status, reply)
        elif isinstance(reply, str):
            self._send(200, reply.encode(), "text/plain; charset=utf-8")
        else:
            self._json(200, reply)

    def completions(self, path, body):
        chat = path == "/v1/chat/completions"
        prompt, max_tokens, stream, usage = completion_request(body, chat)
        model = body.get("model") if isinstance(body.get("model"), str) else \
            self.state.args.served_model_name
        s = self.state.submit(prompt, max_tokens, stream)
        rid, created = f"{'chatcmpl' if chat else 'cmpl'}-{s.req.rid}", int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": rid, "object": obj, "created": created, "model": model}
        texts: list[str] = []
        reason = None
        started = False
        try:
            while True:
                ev = s.next(TOKEN_WAIT_S)
                if ev is None:
                    if self.state.closed:
                        reason = reason or "abort"
                        break
                    continue
                if ev[0] == "end":
                    reason = "length" if ev[1] == "length" else "abort"
                    break
                _, k, last = ev
                text = token_text(k)
                texts.append(text)
                if not stream:
                    continue
                if not started:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.end_headers()   # HTTP/1.0: the body ends when the connection closes
                    started = True
                fin = "length" if last else None
                if chat:
                    delta = {"role": "assistant", "content": text} if k == 0 else \
                        {"content": text}
                    ch = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": fin}
                else:
                    ch = {"index": 0, "text": text, "logprobs": None, "finish_reason": fin,
                          "matched_stop": None}
                self.wfile.write(b"data: " + json.dumps({**head, "choices": [ch]}).encode()
                                 + b"\n\n")
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            s.cancel()
            raise
        use = {"prompt_tokens": prompt, "completion_tokens": len(texts),
               "total_tokens": prompt + len(texts)}
        if not stream:
            if reason != "length":
                raise ServeClosed(f"the request was aborted after {len(texts)} tokens "
                                  f"({self.state.closed or 'cancelled'})")
            if chat:
                ch = {"index": 0, "message": {"role": "assistant", "content": "".join(texts)},
                      "logprobs": None, "finish_reason": "length", "matched_stop": None}
                head["object"] = "chat.completion"
            else:
                ch = {"index": 0, "text": "".join(texts), "logprobs": None,
                      "finish_reason": "length", "matched_stop": None}
            return self._json(200, {**head, "choices": [ch], "usage": use})
        if not started:   # aborted before its first token
            raise ServeClosed(f"the request was aborted ({self.state.closed or 'cancelled'})")
        if reason != "length":
            err = {"object": "error", "message": f"aborted ({self.state.closed or 'cancelled'})",
                   "type": "ServiceUnavailableError", "code": 503}
            self.wfile.write(b"data: " + json.dumps({"error": err}).encode() + b"\n\n")
        elif usage:
            self.wfile.write(b"data: " + json.dumps({**head, "choices": [], "usage": use})
                             .encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


_ERROR_TYPE = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed",
               411: "LengthRequired", 413: "PayloadTooLarge", 503: "ServiceUnavailableError",
               504: "GatewayTimeout"}
_G, _P, _GP, _PP = ("GET",), ("POST",), ("GET", "POST"), ("POST", "PUT")
_ROUTES = {
    "/health": (_G, Handler.health), "/health_generate": (_G, Handler.health),
    "/v1/models": (_G, Handler.models),
    "/get_server_info": (_G, Handler.server_info), "/server_info": (_G, Handler.server_info),
    "/get_internal_state": (_G, Handler.internal_state),
    "/metrics": (_G, Handler.metrics),
    "/set_internal_state": (_PP, Handler.control),
    "/start_profile": (_GP, Handler.control), "/stop_profile": (_GP, Handler.control),
    "/v1/completions": (_P, Handler.completions),
    "/v1/chat/completions": (_P, Handler.completions),
}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256


def make_server(state: ServeState, host: str, port: int) -> ThreadingHTTPServer:
    """Bind (OSError if the address is taken) and return the server; `start` runs it."""
    handler = type("BoundHandler", (Handler,), {"state": state})
    return _Server((host, port), handler)


def start(server: ThreadingHTTPServer) -> threading.Thread:
    th = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                          name="ppscope-serve-http", daemon=True)
    th.start()
    return th


def parse_address(text: str) -> tuple[str, int]:
    """`[HOST:]PORT` -> (host, port); host defaults to 127.0.0.1. ValueError, one line."""
    host, sep, port = str(text).strip().rpartition(":")
    if not sep:
        host = "127.0.0.1"
    host = host.strip("[]") or "127.0.0.1"
    try:
        p = int(port)
    except ValueError:
        raise ValueError(f"--serve {text!r}: expected [HOST:]PORT, e.g. 30000 or "
                         "0.0.0.0:30000") from None
    if not 1 <= p <= 65535:
        raise ValueError(f"--serve {text!r}: port must be 1..65535")
    if any(c.isspace() for c in host) or "/" in host:
        raise ValueError(f"--serve {text!r}: bad host")
    return host, p
