"""A TCP proxy that faults a share of HTTP/1.1 requests between a client and a server.

Run it as its own process (the ``fault_proxy`` fixture does), so it keeps
serving while the client under test blocks::

    python fault_proxy.py --upstream 127.0.0.1:PORT [--port 0] [--seed 0] \
        [--share 0.2] [--kinds refuse,reset,truncate,stall] [--stall-s 3]

It prints ``LISTENING <port>`` once it accepts connections.

The proxy parses each request (request line, headers, a ``Content-Length``
or chunked body) and each response (``Content-Length``, chunked, bodiless or
close-delimited), so it faults requests, not connections: a keep-alive
connection may carry many requests, and a fault ends the connection it hits.
Each request is forwarded on a fresh upstream connection.

Fault kinds:

* ``refuse``: reset the client connection (RST, ``SO_LINGER`` 0) before the
  request reaches the server: the request did not happen.
* ``reset``: forward the request, let the server answer, then reset the client
  connection without a byte of the answer: the request happened and the
  client cannot know (an ambiguous write).
* ``truncate``: forward the request, then send the head and a part of the
  body (or a part of the head when the body is empty) and close the
  connection normally (FIN): a short read that looks like an end of stream.
* ``stall``: forward the request, then hold the answer for ``stall_s``
  seconds (longer than the client's read timeout) and reset the connection.
* ``shorten`` (only when asked for): forward the answer with a part of its
  body and a ``Content-Length`` that says so: a short body no HTTP client can
  notice (a broken middlebox). Answers without a ``Content-Length`` body pass
  unchanged and are not counted.
* ``conflict`` (only when asked for): answer ``409 ConditionalRequestConflict``
  without forwarding, as AWS answers a conditional write that races another
  one in flight: the request did not happen, and the client should retry.

The schedule is deterministic: the ``n``-th request the proxy sees (counted
from 0 over all connections) is faulted when ``Random(f"{seed}/{n}")`` draws
below ``share``, with a kind drawn from the same generator, so a sequential
client meets the same faults on every run with the same seed. Optional
filters: ``match`` (a regex over ``"METHOD /path?query"``; other requests pass
untouched and draw nothing) and ``limit`` (at most this many faults).
``drop_headers`` (names) removes those request headers from every request
it forwards: a gateway that drops ``If-None-Match`` turns every conditional
create into an overwrite.

Requests to ``/__faultproxy__/...`` are answered by the proxy itself::

    GET  /__faultproxy__/stats    counters: requests, faulted by kind, the faults
    POST /__faultproxy__/config   JSON settings to change; answers the settings

Only the standard library is used, so the process starts in a blink.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import select
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Dict, List, Optional, Tuple

KINDS = ("refuse", "reset", "truncate", "stall", "shorten", "conflict")
DEFAULT_KINDS = ("refuse", "reset", "truncate", "stall")
CONTROL_PREFIX = "/__faultproxy__/"
DEFAULT_STALL_S = 3.0
IO_TIMEOUT_S = 30.0          # an upstream that says nothing this long is broken
MAX_FAULT_LOG = 10_000       # faulted requests kept for the stats report
MAX_HEAD_BYTES = 64 << 10


_CONFLICT_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>ConditionalRequestConflict'
                  b'</Code><Message>A conflicting conditional operation is currently in '
                  b'progress against this resource. Please try again.</Message></Error>')
_CONFLICT = (b"HTTP/1.1 409 Conflict\r\nContent-Type: application/xml\r\nContent-Length: "
             + str(len(_CONFLICT_BODY)).encode() + b"\r\n\r\n" + _CONFLICT_BODY)


class _Closed(Exception):
    """The peer closed the connection before a whole message arrived."""


class _Reader:
    """Buffered reads of HTTP messages from a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        if not chunk:
            return False
        self.buf += chunk
        return True

    def head(self) -> Optional[bytes]:
        """The next message head (through the blank line); None at a clean EOF."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > MAX_HEAD_BYTES:
                raise _Closed("message head too large")
            if not self._fill():
                if self.buf:
                    raise _Closed("EOF inside a message head")
                return None
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        return head + b"\r\n\r\n"

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise _Closed(f"EOF after {len(self.buf)} of {n} body bytes")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if not self._fill():
                raise _Closed("EOF inside a chunked body")
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line + b"\r\n"

    def chunked(self) -> bytes:
        """A chunked body, raw (sizes, data, trailers), to forward unchanged."""
        out = []
        while True:
            size_line = self.line()
            out.append(size_line)
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while True:  # trailers, up to the blank line
                    trailer = self.line()
                    out.append(trailer)
                    if trailer == b"\r\n":
                        return b"".join(out)
            out.append(self.exactly(size + 2))

    def rest(self) -> bytes:
        while self._fill():
            pass
        out, self.buf = self.buf, b""
        return out


def _parse_head(head: bytes) -> Tuple[str, List[Tuple[str, str]]]:
    lines = head[:-4].decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.append((name.strip(), value.strip()))
    return lines[0], headers


def _header(headers: List[Tuple[str, str]], name: str) -> Optional[str]:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def _build_head(first: str, headers: List[Tuple[str, str]]) -> bytes:
    return ("\r\n".join([first] + [f"{k}: {v}" for k, v in headers]) + "\r\n\r\n").encode("latin-1")


def _reset(sock: socket.socket) -> None:
    """Closes with RST: SO_LINGER on with a zero timeout."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class _Settings:
    """The fault schedule and counters, shared by the connection threads."""

    def __init__(self, seed: int, share: float, kinds: List[str], stall_s: float) -> None:
        self.lock = threading.Lock()
        self.seed, self.share, self.kinds, self.stall_s = seed, share, list(kinds), stall_s
        self.match: Optional[str] = None
        self.limit: Optional[int] = None
        self.drop_headers: List[str] = []
        self.reset_counters()

    def reset_counters(self) -> None:
        self.requests = 0        # requests seen (and numbered) under the current settings
        self.matched = 0
        self.planned = 0         # faults drawn (what ``limit`` bounds)
        self.forwarded = 0
        self.faulted: Dict[str, int] = {k: 0 for k in KINDS}
        self.faults: List[dict] = []

    def update(self, changes: dict) -> dict:
        with self.lock:
            for name, value in changes.items():
                if name == "seed":
                    self.seed = int(value)
                elif name == "share":
                    if not 0.0 <= float(value) <= 1.0:
                        raise ValueError(f"share must be in [0, 1], got {value!r}")
                    self.share = float(value)
                elif name == "kinds":
                    bad = [k for k in value if k not in KINDS]
                    if bad or not value:
                        raise ValueError(
                            f"kinds must be a non-empty subset of {KINDS}, got {value!r}")
                    self.kinds = list(value)
                elif name == "stall_s":
                    self.stall_s = float(value)
                elif name == "match":
                    if value is not None:
                        re.compile(value)
                    self.match = value
                elif name == "limit":
                    self.limit = None if value is None else int(value)
                elif name == "drop_headers":
                    self.drop_headers = [str(v).lower() for v in value]
                elif name == "reset_counters":
                    if value:
                        self.reset_counters()
                else:
                    raise ValueError(f"unknown setting {name!r}; known: seed, share, kinds, "
                                     "stall_s, match, limit, drop_headers, reset_counters")
            return self.describe()

    def describe(self) -> dict:
        return {"seed": self.seed, "share": self.share, "kinds": self.kinds,
                "stall_s": self.stall_s, "match": self.match, "limit": self.limit,
                "drop_headers": self.drop_headers}

    def decide(self, method: str, target: str) -> Tuple[int, Optional[str], random.Random]:
        """Numbers the request and draws its fault (None: pass it through)."""
        with self.lock:
            n = self.requests
            self.requests += 1
            rng = random.Random(f"{self.seed}/{n}")
            if self.match is not None and not re.search(self.match, f"{method} {target}"):
                return n, None, rng
            self.matched += 1
            if self.limit is not None and self.planned >= self.limit:
                return n, None, rng
            if self.share <= 0 or rng.random() >= self.share:
                return n, None, rng
            self.planned += 1
            return n, rng.choice(self.kinds), rng

    def record(self, n: int, kind: str, method: str, target: str) -> None:
        """Counts a fault the proxy did."""
        with self.lock:
            self.faulted[kind] += 1
            if len(self.faults) < MAX_FAULT_LOG:
                self.faults.append({"n": n, "kind": kind, "method": method, "target": target})

    def stats(self) -> dict:
        with self.lock:
            return {"requests": self.requests, "matched": self.matched,
                    "forwarded": self.forwarded, "faulted": dict(self.faulted),
                    "faulted_total": sum(self.faulted.values()),
                    "faults": list(self.faults), "settings": self.describe()}


class _Connection:
    """One client connection: requests in, a fault or the server's answer out."""

    def __init__(self, client: socket.socket, upstream: Tuple[str, int],
                 settings: _Settings) -> None:
        self.client, self.upstream, self.settings = client, upstream, settings
        self.reader = _Reader(client)

    def serve(self) -> None:
        try:
            while self._one():
                pass
        except (_Closed, OSError):
            pass
        finally:
            try:
                self.client.close()
            except OSError:
                pass

    def _one(self) -> bool:
        """Handles one request; False when the connection is done."""
        head = self.reader.head()
        if head is None:
            return False
        first, headers = _parse_head(head)
        method, target, _ = (first.split(" ", 2) + ["", ""])[:3]
        if (_header(headers, "expect") or "").lower() == "100-continue":
            # Answer the client's expectation here; the server gets the whole body.
            self.client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            headers = [(k, v) for k, v in headers if k.lower() != "expect"]
        if (_header(headers, "transfer-encoding") or "").lower() == "chunked":
            body = self.reader.chunked()
        else:
            body = self.reader.exactly(int(_header(headers, "content-length") or 0))
        if target.startswith(CONTROL_PREFIX):
            return self._control(method, target, body)
        n, kind, rng = self.settings.decide(method, target)
        if kind == "refuse":
            self.settings.record(n, kind, method, target)
            _reset(self.client)
            return False
        if kind == "conflict":
            self.settings.record(n, kind, method, target)
            self.client.sendall(_CONFLICT)
            return True
        dropped = ("connection", "keep-alive", *self.settings.drop_headers)
        upstream_headers = [(k, v) for k, v in headers if k.lower() not in dropped]
        upstream_headers.append(("Connection", "close"))
        response = self._forward(_build_head(first, upstream_headers) + body)
        with self.settings.lock:
            self.settings.forwarded += 1
        resp_head, resp_body, delimited = self._split(response, method)
        if kind == "shorten":
            shortened = self._shorten(resp_head, resp_body, rng)
            if shortened is None:
                kind = None
            else:
                resp_head, resp_body = shortened
        if kind is None:
            self.client.sendall(resp_head + resp_body)
            return delimited
        self.settings.record(n, kind, method, target)
        if kind == "shorten":
            self.client.sendall(resp_head + resp_body)
            return delimited
        if kind == "reset":
            _reset(self.client)
        elif kind == "truncate":
            if resp_body:
                self.client.sendall(resp_head + resp_body[:rng.randrange(0, len(resp_body))])
            else:
                self.client.sendall(resp_head[:rng.randrange(1, len(resp_head))])
            self.client.shutdown(socket.SHUT_WR)
            self.client.close()
        elif kind == "stall":
            # Hold the answer (a client that gives up closes its end: stop then).
            deadline = time.monotonic() + self.settings.stall_s
            while time.monotonic() < deadline:
                left = max(0.0, deadline - time.monotonic())
                ready, _, _ = select.select([self.client], [], [], left)
                if ready and not self.client.recv(65536, socket.MSG_PEEK):
                    break
                if ready:
                    time.sleep(0.05)  # pipelined bytes: keep holding until the deadline
            _reset(self.client)
        return False

    def _forward(self, request: bytes) -> bytes:
        with socket.create_connection(self.upstream, timeout=IO_TIMEOUT_S) as up:
            up.sendall(request)
            return _Reader(up).rest()

    @staticmethod
    def _split(response: bytes, method: str) -> Tuple[bytes, bytes, bool]:
        """(head to send, body, whether the client can tell where the body ends).

        The upstream connection was ``Connection: close``; a self-delimited
        answer keeps the client connection alive (its close header dropped).
        """
        head, sep, body = response.partition(b"\r\n\r\n")
        if not sep:
            return response, b"", False
        first, headers = _parse_head(head + sep)
        parts = first.split(" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        bodiless = method == "HEAD" or status in (204, 304) or 100 <= status < 200
        framed = bodiless or _header(headers, "content-length") is not None or \
            (_header(headers, "transfer-encoding") or "").lower() == "chunked"
        if bodiless:
            body = b""
        if not framed:
            return head + sep, body, False
        kept = [(k, v) for k, v in headers if k.lower() not in ("connection", "keep-alive")]
        return _build_head(first, kept), body, True

    @staticmethod
    def _shorten(head: bytes, body: bytes, rng: random.Random) -> Optional[Tuple[bytes, bytes]]:
        """The answer with a part of its body and a Content-Length to match."""
        first, headers = _parse_head(head)
        if not body or _header(headers, "content-length") is None:
            return None
        cut = rng.randrange(0, len(body))
        headers = [(k, str(cut) if k.lower() == "content-length" else v) for k, v in headers]
        return _build_head(first, headers), body[:cut]

    def _control(self, method: str, target: str, body: bytes) -> bool:
        action = target[len(CONTROL_PREFIX):].split("?")[0]
        try:
            if action == "stats" and method == "GET":
                status, out = 200, self.settings.stats()
            elif action == "config" and method == "POST":
                status, out = 200, self.settings.update(json.loads(body or b"{}"))
            else:
                status, out = 404, {"error": f"no control action {method} {action!r}"}
        except (ValueError, TypeError) as exc:
            status, out = 400, {"error": str(exc)}
        data = json.dumps(out).encode()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}[status]
        self.client.sendall(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        return True


def _exit_with_parent(parent: int) -> None:
    """Ends this process once the one that started it is gone (no orphan proxies)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def serve(upstream: Tuple[str, int], port: int, settings: _Settings) -> None:
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    print(f"LISTENING {listener.getsockname()[1]}", flush=True)
    while True:
        client, _ = listener.accept()
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_Connection(client, upstream, settings).serve, daemon=True).start()


# -- the test side: start, steer and stop the proxy process -----------------

class FaultProxy:
    """A fault proxy process in front of ``upstream`` (``http://host:port``).

    Args:
        upstream: the server's URL.
        seed: the fault schedule's seed.
        share: the share of requests faulted (0 to 1).
        kinds: fault kinds drawn from (see the module docstring).
        stall_s: how long a stall holds an answer (seconds).
    """

    def __init__(self, upstream: str, *, seed: int = 0, share: float = 0.0,
                 kinds=DEFAULT_KINDS, stall_s: float = DEFAULT_STALL_S) -> None:
        self.upstream = upstream
        host, _, port = upstream.split("://", 1)[-1].rstrip("/").rpartition(":")
        self._proc = subprocess.Popen(
            [sys.executable, __file__, "--upstream", f"{host}:{port}", "--seed", str(seed),
             "--share", str(share), "--kinds", ",".join(kinds), "--stall-s", str(stall_s)],
            stdout=subprocess.PIPE, text=True)
        line = self._proc.stdout.readline()
        if not line.startswith("LISTENING "):
            self._proc.kill()
            raise RuntimeError(f"fault proxy did not start (said {line!r})")
        self.port = int(line.split()[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def _call(self, action: str, payload: Optional[dict] = None) -> dict:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(f"{self.url}{CONTROL_PREFIX}{action}", data=data,
                                         method="GET" if data is None else "POST")
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.loads(resp.read())

    def configure(self, **settings) -> dict:
        """Changes settings (``seed``, ``share``, ``kinds``, ``stall_s``, ``match``,
        ``limit``, ``reset_counters=True``); returns them."""
        return self._call("config", settings)

    def stats(self) -> dict:
        """Requests seen, forwarded and faulted (by kind), and the faulted requests."""
        return self._call("stats")

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc.stdout.close()

    def __enter__(self) -> "FaultProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="host:port of the server")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: any free one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--share", type=float, default=0.0, help="share of requests faulted")
    parser.add_argument("--kinds", default=",".join(DEFAULT_KINDS),
                        help=f"comma-separated, of {KINDS}")
    parser.add_argument("--stall-s", type=float, default=DEFAULT_STALL_S)
    args = parser.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    settings = _Settings(args.seed, 0.0, list(DEFAULT_KINDS), args.stall_s)
    settings.update({"share": args.share, "kinds": args.kinds.split(",")})
    serve((host, int(port)), args.port, settings)


if __name__ == "__main__":
    main()
