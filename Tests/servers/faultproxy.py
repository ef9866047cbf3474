#!/usr/bin/env python3
"""A fault-injecting HTTP/1.1 reverse proxy for S3 tests (standard library only).

Listens on 127.0.0.1:PORT and forwards every request to one upstream
(http://127.0.0.1:UPSTREAM), keeping connections alive both ways.  Request
bodies are read by Content-Length or `Transfer-Encoding: chunked` (de-chunked
and forwarded with a Content-Length); `Expect: 100-continue` is answered by
the proxy itself.  The Host header is forwarded unchanged, so SigV4
signatures made for the proxy's address verify upstream.

Faults, decided per request in this order, each with its own probability:

  error     answer 500 InternalError or 503 SlowDown (S3 XML body), not forwarded
  throttle  answer 429 SlowDown, not forwarded
  stall     read the request, answer nothing for stall_seconds, then close
  reset     close the client connection with a TCP RST (SO_LINGER 0), either
            before forwarding or after the upstream answered (the request took
            effect but the client never hears) -- chosen at random
  truncate  forward, send the response head with its full Content-Length, then
            only part of the body, then close

CLI::

    python3 Tests/servers/faultproxy.py --upstream http://127.0.0.1:8333 --port 0 \\
        [--control-port 0] [--error-rate 0.1] [--throttle-rate 0] [--stall-rate 0.02] \\
        [--reset-rate 0.02] [--truncate-rate 0.02] [--stall-seconds 60] [--seed N]

prints one JSON line {"port", "control_port", "upstream", "pid", "config"} and
serves until SIGTERM/SIGINT (then prints the counters as JSON to stderr;
SIGUSR1 prints them too).

Control endpoint (http://127.0.0.1:CONTROL_PORT, JSON answers):

  GET  /stats               {"counters": {...}, "config": {...}}
  POST /config              JSON body (or query string) with any of error_rate,
                            throttle_rate, stall_rate, reset_rate, truncate_rate,
                            stall_seconds, seed; answers the new config
  POST /off                 every rate to 0
  POST /reset               counters to 0

Module::

    with FaultProxy("http://127.0.0.1:8333", error_rate=1.0) as p:   # own thread
        p.port, p.control_port; p.configure(error_rate=0); p.stats()
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import socket
import struct
import sys
import threading
import urllib.parse

HOST = "127.0.0.1"
RATE_KEYS = ("error_rate", "throttle_rate", "stall_rate", "reset_rate", "truncate_rate")
CONFIG_KEYS = RATE_KEYS + ("stall_seconds", "seed")
COUNTER_KEYS = (
    "connections", "requests", "forwarded", "responses",
    "error_500", "error_503", "throttle_429", "stalls", "resets_before", "resets_after",
    "truncations", "truncate_skipped", "upstream_failures", "client_errors",
)
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authenticate",
              "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade"}
MAX_HEAD = 256 * 1024
CHUNK = 64 * 1024

ERROR_BODIES = {
    500: ("InternalError", "We encountered an internal error. Please try again."),
    503: ("SlowDown", "Please reduce your request rate."),
    429: ("SlowDown", "Please reduce your request rate."),
}
REASONS = {100: "Continue", 200: "OK", 400: "Bad Request", 404: "Not Found",
           429: "Too Many Requests", 431: "Request Header Fields Too Large",
           500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}


class BadRequest(Exception):
    pass


class _Closed(Exception):
    """The client connection is finished (closed or reset by the proxy)."""


def _parse_head(head: bytes, request: bool):
    lines = head.decode("latin-1").split("\r\n")
    first = lines[0]
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        if line[0] in " \t" and headers:  # obsolete folding
            headers[-1] = (headers[-1][0], headers[-1][1] + " " + line.strip())
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise BadRequest(f"bad header line {line!r}")
        headers.append((name.strip(), value.strip()))
    parts = first.split(" ", 2)
    if request:
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            raise BadRequest(f"bad request line {first!r}")
        return parts[0], parts[1], parts[2], headers
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise BadRequest(f"bad status line {first!r}")
    return parts[0], int(parts[1]), parts[2] if len(parts) > 2 else "", headers


def _get(headers, name: str) -> str | None:
    name = name.lower()
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


def _tokens(headers, name: str) -> set[str]:
    name = name.lower()
    out = set()
    for k, v in headers:
        if k.lower() == name:
            out.update(t.strip().lower() for t in v.split(",") if t.strip())
    return out


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    """The bytes up to and including the blank line; None on a clean EOF."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial.strip():
            return None
        raise
    except asyncio.LimitOverrunError:
        raise BadRequest("header section too large")


async def _read_chunked(reader: asyncio.StreamReader, raw: bool):
    """Yield the pieces of a chunked body: decoded data, or (raw) the exact bytes."""
    while True:
        line = await reader.readuntil(b"\r\n")
        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            trailer = [line]
            while True:
                t = await reader.readuntil(b"\r\n")
                trailer.append(t)
                if t == b"\r\n":
                    break
            if raw:
                yield b"".join(trailer)
            return
        data = await reader.readexactly(size + 2)
        yield (line + data) if raw else data[:-2]


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0) instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    def __init__(self, upstream: str, port: int = 0, control_port: int = 0,
                 error_rate: float = 0.0, throttle_rate: float = 0.0, stall_rate: float = 0.0,
                 reset_rate: float = 0.0, truncate_rate: float = 0.0,
                 stall_seconds: float = 60.0, seed: int | None = None, log=None):
        u = urllib.parse.urlsplit(upstream)
        self.log = log  # a text file: one line per request (fault, status, response headers)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"upstream must be http://host:port, not {upstream!r}")
        self.upstream = upstream
        self.up_host = u.hostname
        self.up_port = u.port or 80
        self.port = port
        self.control_port = control_port
        self.config = {"error_rate": 0.0, "throttle_rate": 0.0, "stall_rate": 0.0,
                       "reset_rate": 0.0, "truncate_rate": 0.0, "stall_seconds": 60.0,
                       "seed": None}
        self._apply({"error_rate": error_rate, "throttle_rate": throttle_rate,
                     "stall_rate": stall_rate, "reset_rate": reset_rate,
                     "truncate_rate": truncate_rate, "stall_seconds": stall_seconds,
                     "seed": seed})
        self.counters = dict.fromkeys(COUNTER_KEYS, 0)
        self.active_connections = 0
        self._servers: list[asyncio.base_events.Server] = []
        self._conn_tasks: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None
        self._request_seq = 0

    # ---------------- configuration and counters ----------------

    def _apply(self, changes: dict) -> dict:
        unknown = set(changes) - set(CONFIG_KEYS)
        if unknown:
            raise ValueError(f"unknown settings {sorted(unknown)}; known: {list(CONFIG_KEYS)}")
        new = dict(self.config)
        for k, v in changes.items():
            if k == "seed":
                new[k] = None if v in (None, "", "null") else int(v)
            else:
                v = float(v)
                if k in RATE_KEYS and not 0.0 <= v <= 1.0:
                    raise ValueError(f"{k} must be within [0, 1], not {v}")
                if v < 0:
                    raise ValueError(f"{k} must be >= 0")
                new[k] = v
        self.config = new
        if "seed" in changes:
            self.rng = random.Random(new["seed"])
        elif not hasattr(self, "rng"):
            self.rng = random.Random(new["seed"])
        return dict(new)

    def _call(self, fn, *args):
        """Run fn in the proxy's loop thread when it has one (thread safety)."""
        loop = self._loop
        if loop is None or not loop.is_running() or self._in_loop_thread():
            return fn(*args)

        async def run():
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), loop).result(10)

    def _in_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def configure(self, **changes) -> dict:
        """Change rates / stall_seconds / seed at run time; returns the new config."""
        return self._call(self._apply, changes)

    def off(self) -> dict:
        return self.configure(**dict.fromkeys(RATE_KEYS, 0.0))

    def stats(self) -> dict:
        def snap():
            c = dict(self.counters)
            c["active_connections"] = self.active_connections
            return {"counters": c, "config": dict(self.config)}
        return self._call(snap)

    def reset_counters(self) -> None:
        def zero():
            for k in self.counters:
                self.counters[k] = 0
        self._call(zero)

    def _choose_fault(self) -> str | None:
        c, r = self.config, self.rng
        if c["error_rate"] and r.random() < c["error_rate"]:
            return "error"
        if c["throttle_rate"] and r.random() < c["throttle_rate"]:
            return "throttle"
        if c["stall_rate"] and r.random() < c["stall_rate"]:
            return "stall"
        if c["reset_rate"] and r.random() < c["reset_rate"]:
            return "reset"
        if c["truncate_rate"] and r.random() < c["truncate_rate"]:
            return "truncate"
        return None

    # ---------------- running ----------------

    async def start_async(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        srv = await asyncio.start_server(self._handle_client, HOST, self.port, limit=MAX_HEAD)
        ctl = await asyncio.start_server(self._handle_control, HOST, self.control_port, limit=MAX_HEAD)
        self._servers = [srv, ctl]
        self.port = srv.sockets[0].getsockname()[1]
        self.control_port = ctl.sockets[0].getsockname()[1]

    async def stop_async(self) -> None:
        for s in self._servers:
            s.close()
        for t in list(self._conn_tasks):
            t.cancel()
        if self._conn_tasks:
            await asyncio.gather(*self._conn_tasks, return_exceptions=True)
        for s in self._servers:
            with contextlib.suppress(Exception):
                await s.wait_closed()
        self._servers = []
        if self._stopped:
            self._stopped.set()

    async def serve_forever(self) -> None:
        await self._stopped.wait()

    def start(self) -> "FaultProxy":
        """Run the proxy in a daemon thread with its own event loop."""
        ready = threading.Event()
        error: list[BaseException] = []

        def run():
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start_async())
            except BaseException as e:  # noqa: BLE001
                error.append(e)
                ready.set()
                return
            ready.set()
            try:
                loop.run_until_complete(self.serve_forever())
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name="faultproxy", daemon=True)
        self._thread.start()
        ready.wait()
        if error:
            raise error[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self.stop_async(), self._loop).result(30)
            self._thread.join(30)
        self._thread = None

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def control_url(self) -> str:
        return f"http://{HOST}:{self.control_port}"

    # ---------------- the proxy ----------------

    def _track(self) -> None:
        task = asyncio.current_task()
        self._conn_tasks.add(task)
        task.add_done_callback(self._conn_tasks.discard)

    async def _handle_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._track()
        self.counters["connections"] += 1
        self.active_connections += 1
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        up: list = [None, None]  # upstream reader, writer (kept alive across requests)
        try:
            while True:
                keep = await self._one_request(reader, writer, up)
                if not keep:
                    break
        except _Closed:
            pass
        except BadRequest as e:
            self.counters["client_errors"] += 1
            with contextlib.suppress(Exception):
                await self._send_simple(writer, 400, "text/plain", str(e).encode(), close=True)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        except asyncio.CancelledError:
            # the proxy is stopping; finish quietly (a re-raised cancellation
            # makes asyncio's stream callback log a traceback)
            _reset(writer)
        finally:
            self.active_connections -= 1
            self._close_upstream(up)
            if not writer.transport.is_closing():
                writer.close()
            # A stop() that cancels the task while it waits here must not
            # end it with CancelledError either (same traceback).
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await writer.wait_closed()

    def _close_upstream(self, up: list) -> None:
        if up[1] is not None:
            with contextlib.suppress(Exception):
                up[1].transport.abort()
        up[0] = up[1] = None

    async def _send_simple(self, writer, status: int, ctype: str, body: bytes, close: bool,
                           head_only: bool = False, extra: list | None = None) -> None:
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}",
                 f"Content-Type: {ctype}", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in (extra or [])]
        if close:
            lines.append("Connection: close")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if not head_only:
            writer.write(body)
        await writer.drain()

    def _error_body(self, status: int, target: str) -> bytes:
        code, message = ERROR_BODIES[status]
        self._request_seq += 1
        resource = urllib.parse.urlsplit(target).path
        return ('<?xml version="1.0" encoding="UTF-8"?>\n'
                f"<Error><Code>{code}</Code><Message>{message}</Message>"
                f"<Resource>{resource}</Resource>"
                f"<RequestId>faultproxy-{self._request_seq}</RequestId></Error>").encode()

    async def _one_request(self, reader, writer, up: list) -> bool:
        """Handle one request; returns whether the client connection stays open."""
        head = await _read_head(reader)
        if head is None:
            return False
        method, target, version, headers = _parse_head(head, request=True)
        self.counters["requests"] += 1
        conn_tokens = _tokens(headers, "connection")
        client_close = "close" in conn_tokens or (version == "HTTP/1.0" and "keep-alive" not in conn_tokens)
        chunked = "chunked" in _tokens(headers, "transfer-encoding")
        clen = _get(headers, "content-length")
        if not chunked and clen is not None:
            try:
                clen_n = int(clen)
            except ValueError:
                raise BadRequest(f"bad Content-Length {clen!r}")
        else:
            clen_n = None
        has_body = chunked or bool(clen_n)
        expect = (_get(headers, "expect") or "").lower() == "100-continue"

        fault = self._choose_fault()
        if self.log and fault:
            print(f"faultproxy: {method} {target}: {fault}", file=self.log, flush=True)

        if fault in ("error", "throttle"):
            status = 429 if fault == "throttle" else self.rng.choice((500, 503))
            self.counters["throttle_429" if status == 429 else f"error_{status}"] += 1
            # With Expect: 100-continue the client has not sent the body (and
            # some clients, botocore, mis-parse the next response on a
            # connection whose Expect request got a final answer without a
            # 100): say "close" and close.
            unread = expect
            if has_body and not expect:
                await self._read_body(reader, chunked, clen_n)
            await self._send_simple(writer, status, "application/xml", self._error_body(status, target),
                                    close=client_close or unread, head_only=(method == "HEAD"))
            return not (client_close or unread)

        if expect:
            # Also for an empty body (as Ceph RGW does; Go servers do not, and
            # botocore then poisons its kept-alive connection: boto/botocore#3755).
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        body = await self._read_body(reader, chunked, clen_n) if has_body else b""

        if fault == "stall":
            self.counters["stalls"] += 1
            await asyncio.sleep(self.config["stall_seconds"])
            raise _Closed()

        reset_when = None
        if fault == "reset":
            reset_when = self.rng.choice(("before", "after"))
            if reset_when == "before":
                self.counters["resets_before"] += 1
                _reset(writer)
                raise _Closed()

        # Forward.
        fwd = [(k, v) for k, v in headers
               if k.lower() not in HOP_BY_HOP and k.lower() not in ("expect", "content-length")]
        if chunked or clen is not None:
            fwd.append(("Content-Length", str(len(body))))
        req = (f"{method} {target} HTTP/1.1\r\n"
               + "".join(f"{k}: {v}\r\n" for k, v in fwd) + "\r\n").encode("latin-1") + body
        try:
            ureader, status, rhead_bytes, rheaders = await self._exchange(up, req)
        except (OSError, asyncio.IncompleteReadError, BadRequest, ValueError) as e:
            self.counters["upstream_failures"] += 1
            self._close_upstream(up)
            msg = f"faultproxy: upstream {self.upstream} failed: {type(e).__name__}: {e}".encode()
            await self._send_simple(writer, 502, "text/plain", msg, close=True,
                                    head_only=(method == "HEAD"))
            return False
        self.counters["forwarded"] += 1

        # Response framing.
        no_body = method == "HEAD" or status in (204, 304) or 100 <= status < 200
        rchunked = "chunked" in _tokens(rheaders, "transfer-encoding")
        rclen = _get(rheaders, "content-length")
        upstream_close = "close" in _tokens(rheaders, "connection")
        if no_body:
            body_kind, rlen = "none", 0
        elif rchunked:
            body_kind, rlen = "chunked", None
        elif rclen is not None:
            body_kind, rlen = "length", int(rclen)
        else:
            body_kind, rlen = "eof", None
            upstream_close = True

        if reset_when == "after":
            async for _ in self._body_pieces(ureader, body_kind, rlen):
                pass
            if upstream_close:
                self._close_upstream(up)
            self.counters["resets_after"] += 1
            _reset(writer)
            raise _Closed()

        truncate = fault == "truncate"
        if truncate and body_kind in ("none",) or (truncate and body_kind == "length" and rlen == 0):
            self.counters["truncate_skipped"] += 1
            truncate = False

        close_client = client_close or body_kind == "eof"
        out_headers = [(k, v) for k, v in rheaders
                       if k.lower() not in ("connection", "keep-alive", "proxy-connection")]
        if close_client:
            out_headers.append(("Connection", "close"))
        status_line = rhead_bytes.split(b"\r\n", 1)[0].decode("latin-1")
        if self.log:
            print(f"faultproxy: {method} {target} -> {status_line} {rheaders}"
                  f"{' [truncate]' if truncate else ''}", file=self.log, flush=True)
        writer.write((status_line + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in out_headers)
                      + "\r\n").encode("latin-1"))

        if truncate:
            self.counters["truncations"] += 1
            if body_kind == "length":
                keep_n = self.rng.randrange(0, rlen)
            else:
                keep_n = None  # chunked / eof: forward only the first piece, partly
            sent = 0
            async for piece in self._body_pieces(ureader, body_kind, rlen):
                if keep_n is None:
                    keep_n = self.rng.randrange(0, max(1, len(piece)))
                take = piece[: max(0, keep_n - sent)]
                if take:
                    writer.write(take)
                    sent += len(take)
                if sent >= keep_n:
                    break
            self._close_upstream(up)  # the rest of the upstream body is unread
            await writer.drain()
            raise _Closed()  # graceful close (FIN) with the body short

        async for piece in self._body_pieces(ureader, body_kind, rlen):
            writer.write(piece)
            await writer.drain()
        await writer.drain()
        self.counters["responses"] += 1
        if upstream_close:
            self._close_upstream(up)
        return not close_client

    async def _read_body(self, reader, chunked: bool, clen_n: int | None) -> bytes:
        if chunked:
            parts = [p async for p in _read_chunked(reader, raw=False)]
            return b"".join(parts)
        if clen_n:
            return await reader.readexactly(clen_n)
        return b""

    async def _body_pieces(self, ureader, kind: str, length: int | None):
        if kind == "none":
            return
        if kind == "length":
            left = length
            while left > 0:
                piece = await ureader.read(min(CHUNK, left))
                if not piece:
                    raise asyncio.IncompleteReadError(b"", left)
                left -= len(piece)
                yield piece
        elif kind == "chunked":
            async for piece in _read_chunked(ureader, raw=True):
                yield piece
        else:
            while True:
                piece = await ureader.read(CHUNK)
                if not piece:
                    return
                yield piece

    async def _exchange(self, up: list, req: bytes):
        """Send req upstream (reusing the kept-alive connection; one retry on a
        fresh connection if a reused one turns out closed) and read the head."""
        for attempt in (0, 1):
            reused = up[1] is not None
            if not reused:
                up[0], up[1] = await asyncio.open_connection(self.up_host, self.up_port, limit=MAX_HEAD)
                s = up[1].get_extra_info("socket")
                if s is not None:
                    with contextlib.suppress(OSError):
                        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                up[1].write(req)
                await up[1].drain()
                while True:
                    head = await _read_head(up[0])
                    if head is None:
                        raise ConnectionResetError("upstream closed the connection")
                    _, status, _, rheaders = _parse_head(head, request=False)
                    if 100 <= status < 200 and status != 101:
                        continue  # interim response
                    return up[0], status, head, rheaders
            except (ConnectionError, asyncio.IncompleteReadError):
                self._close_upstream(up)
                if reused and attempt == 0:
                    continue
                raise
        raise ConnectionError("unreachable")

    # ---------------- control endpoint ----------------

    async def _handle_control(self, reader, writer):
        self._track()
        try:
            head = await _read_head(reader)
            if head is None:
                return
            method, target, _, headers = _parse_head(head, request=True)
            n = int(_get(headers, "content-length") or 0)
            body = await reader.readexactly(n) if n else b""
            u = urllib.parse.urlsplit(target)
            params = {k: v[-1] for k, v in urllib.parse.parse_qs(u.query).items()}
            status, answer = 200, None
            try:
                if u.path in ("/", "/stats", "/counters") and method in ("GET", "HEAD"):
                    answer = self.stats()
                elif u.path == "/config" and method == "GET":
                    answer = dict(self.config)
                elif u.path == "/config" and method in ("POST", "PUT"):
                    changes = dict(params)
                    if body.strip():
                        changes.update(json.loads(body))
                    answer = self._apply(changes)
                elif u.path == "/off" and method in ("POST", "PUT"):
                    answer = self._apply(dict.fromkeys(RATE_KEYS, 0.0))
                elif u.path == "/reset" and method in ("POST", "PUT"):
                    for k in self.counters:
                        self.counters[k] = 0
                    answer = self.stats()
                else:
                    status, answer = 404, {"error": f"no {method} {u.path}; see GET /stats, "
                                                    "POST /config, POST /off, POST /reset"}
            except (ValueError, TypeError) as e:
                status, answer = 400, {"error": str(e)}
            await self._send_simple(writer, status, "application/json",
                                    (json.dumps(answer) + "\n").encode(), close=True,
                                    head_only=(method == "HEAD"))
        except (BadRequest, ConnectionError, asyncio.IncompleteReadError, OSError,
                asyncio.CancelledError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT")
    ap.add_argument("--port", type=int, default=0, help="listen port on 127.0.0.1 (0: any free)")
    ap.add_argument("--control-port", type=int, default=0, help="control endpoint port (0: any free)")
    ap.add_argument("--error-rate", type=float, default=0.0, help="answer 500/503 without forwarding")
    ap.add_argument("--throttle-rate", type=float, default=0.0, help="answer 429 without forwarding")
    ap.add_argument("--stall-rate", type=float, default=0.0, help="never answer for --stall-seconds")
    ap.add_argument("--reset-rate", type=float, default=0.0, help="TCP RST before or after forwarding")
    ap.add_argument("--truncate-rate", type=float, default=0.0, help="cut the response body short")
    ap.add_argument("--stall-seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--log", action="store_true", help="log every request and fault to stderr")
    args = ap.parse_args(argv)

    proxy = FaultProxy(args.upstream, port=args.port, control_port=args.control_port,
                       error_rate=args.error_rate, throttle_rate=args.throttle_rate,
                       stall_rate=args.stall_rate, reset_rate=args.reset_rate,
                       truncate_rate=args.truncate_rate, stall_seconds=args.stall_seconds,
                       seed=args.seed, log=sys.stderr if args.log else None)

    async def run():
        await proxy.start_async()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(proxy.stop_async()))
        loop.add_signal_handler(signal.SIGUSR1,
                                lambda: print(json.dumps(proxy.stats()), file=sys.stderr, flush=True))
        print(json.dumps({"port": proxy.port, "control_port": proxy.control_port,
                          "upstream": proxy.upstream, "pid": __import__("os").getpid(),
                          "config": proxy.config}), flush=True)
        await proxy.serve_forever()
        print(json.dumps(proxy.stats()), file=sys.stderr, flush=True)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
