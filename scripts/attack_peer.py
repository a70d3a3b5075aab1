"""Hostile peers for scripts/attack_probe.py: non-blocking sockets whose every operation
ends by a deadline, an HTTP/2 peer that keeps the connection's state (the server's
SETTINGS, windows, GOAWAY, RST_STREAMs, the statuses it answered) and a crowd of many
connections driven from one loop. What the server did to the connection is kept in
the object, for the probe's "attacker's fate" column."""

from __future__ import annotations

import errno
import resource
import select
import selectors
import socket
import time
from collections import Counter

import attack_wire as w

try:
    import hpack
except ImportError:  # the fate then lacks the statuses, nothing else
    hpack = None

STALL_S = 0.5  # a send making no progress this long: the server stopped reading


def raise_fd_limit(want: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE towards `want` (the hard limit caps it);
    returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft


def _ready(sock: socket.socket, events: int, timeout: float) -> bool:
    """poll() one socket (select() fails on descriptors past 1024, which the crowds
    of connections reach)."""
    p = select.poll()
    p.register(sock, events)
    try:
        return bool(p.poll(max(0.0, timeout) * 1000))
    except (OSError, ValueError):
        return False


class Peer:
    """One TCP connection, non-blocking; send() and recv() never wait past a deadline."""

    def __init__(self, host: str, port: int, connect_timeout: float = 2.0):
        self.t0 = time.monotonic()
        self.sock = socket.create_connection((host, port), timeout=connect_timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.sent = 0
        self.received = 0
        self.closed_at: float | None = None   # seconds after t0 the server closed it
        self.how_closed = ""                  # "closed" (FIN) or "reset"
        self.stall_at: float | None = None    # first time a send stalled STALL_S
        self.stall_sent = 0                   # bytes sent by then

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    @property
    def closed(self) -> bool:
        return self.closed_at is not None

    def _gone(self, how: str) -> None:
        if self.closed_at is None:
            self.closed_at, self.how_closed = self.elapsed(), how

    def send(self, data: bytes, until: float) -> int:
        """Send what the socket takes before `until`; the bytes sent."""
        view, done = memoryview(data), 0
        last_progress = time.monotonic()
        while done < len(view) and not self.closed:
            try:
                n = self.sock.send(view[done:])
                done += n
                self.sent += n
                last_progress = time.monotonic()
                continue
            except (BlockingIOError, InterruptedError):
                pass
            except OSError as exc:
                self._gone("reset" if exc.errno in (errno.ECONNRESET, errno.EPIPE)
                           else f"error {exc.errno}")
                break
            now = time.monotonic()
            if now - last_progress >= STALL_S and self.stall_at is None:
                self.stall_at, self.stall_sent = self.elapsed(), self.sent
            if now >= until:
                break
            _ready(self.sock, select.POLLOUT, min(0.05, until - now))
        return done

    def recv(self, limit: int = 1 << 20) -> bytes:
        """What has arrived, up to `limit` bytes; b"" when nothing (or closed)."""
        chunks, total = [], 0
        while total < limit and not self.closed:
            try:
                b = self.sock.recv(min(1 << 16, limit - total))
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._gone("reset")
                break
            if not b:
                self._gone("closed")
                break
            chunks.append(b)
            total += len(b)
        self.received += total
        return b"".join(chunks)

    def wait_readable(self, timeout: float) -> bool:
        if self.closed or timeout <= 0:
            return False
        return _ready(self.sock, select.POLLIN, timeout)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def fate_parts(self) -> list[str]:
        out = []
        if self.stall_at is not None:
            out.append(f"server stopped reading at {self.stall_at:.1f}s "
                       f"({self.stall_sent / 1e6:.1f} MB in)")
        if self.closed:
            out.append(f"{self.how_closed} at {self.closed_at:.1f}s")
        return out


class H2Peer(Peer):
    """An HTTP/2 client connection that answers SETTINGS and PING (unless told never
    to read), tracks flow-control windows, and records how the server treated it."""

    def __init__(self, host: str, port: int, refill: bool = True, **kw):
        super().__init__(host, port, **kw)
        self.authority = f"{host}:{port}"
        self.refill = refill                  # open our windows for DATA received
        self.reader = w.FrameReader()
        self.decoder = hpack.Decoder() if hpack else None
        self.decoder_broken = False
        self.server_settings: dict[int, int] = {}
        self.got_settings = False
        self.goaway: tuple[float, int, int, bytes] | None = None  # t, last id, code, debug
        self.rst = Counter()                  # RST_STREAM codes received, by name
        self.grpc_status = Counter()          # grpc-status values received, by name
        self.http_status = Counter()
        self.ended: dict[int, tuple[float, str]] = {}  # watched streams: t, outcome
        self.watch: set[int] = set()
        self.open_sids: set[int] = set()      # opened by headers(), not yet ended
        self.ended_count = 0                  # of those, ended (once each)
        self.conn_window = 65535              # what we may send
        self.stream_windows: dict[int, int] = {}
        self._block: dict[int, bytearray] = {}
        self._block_flags: dict[int, int] = {}
        self.data_in = 0
        self.next_sid = 1

    # ---------------------------------------------------------------- sending
    def start(self, values: dict[int, int] | None = None, until: float | None = None):
        self.send(w.PREFACE + w.settings(values or {}), until or time.monotonic() + 2)

    def wait_settings(self, until: float) -> None:
        while not self.got_settings and not self.closed and time.monotonic() < until:
            self.pump(min(0.05, until - time.monotonic()))

    def new_sid(self) -> int:
        sid, self.next_sid = self.next_sid, self.next_sid + 2
        return sid

    @property
    def max_frame(self) -> int:
        return self.server_settings.get(w.MAX_FRAME_SIZE, 16384)

    @property
    def max_streams(self) -> int:
        return self.server_settings.get(w.MAX_CONCURRENT_STREAMS, 1 << 31)

    def stream_window(self, sid: int) -> int:
        if sid not in self.stream_windows:
            self.stream_windows[sid] = self.server_settings.get(w.INITIAL_WINDOW_SIZE,
                                                                65535)
        return self.stream_windows[sid]

    def headers(self, sid: int, block: bytes, until: float, end_stream: bool = False,
                watch: bool = False) -> bool:
        """HEADERS (+ CONTINUATION when the block exceeds a frame)."""
        if watch:
            self.watch.add(sid)
        self.open_sids.add(sid)
        first, rest = block[:self.max_frame], block[self.max_frame:]
        flags = (w.END_STREAM if end_stream else 0) | (0 if rest else w.END_HEADERS)
        out = [w.frame(w.HEADERS, flags, sid, first)]
        while rest:
            chunk, rest = rest[:self.max_frame], rest[self.max_frame:]
            out.append(w.frame(w.CONTINUATION, 0 if rest else w.END_HEADERS, sid, chunk))
        data = b"".join(out)
        return self.send(data, until) == len(data)

    def body(self, sid: int, payload: bytes, until: float, end_stream: bool = True) -> int:
        """DATA frames within the server's windows, waiting (reading) for them to open;
        the bytes of `payload` sent by `until`."""
        done = 0
        view = memoryview(payload)
        while done < len(payload) and not self.closed and time.monotonic() < until:
            if sid in self.ended or self.goaway:
                break
            allow = min(self.conn_window, self.stream_window(sid), self.max_frame,
                        len(payload) - done)
            if allow <= 0:
                self.pump(min(0.05, max(0.0, until - time.monotonic())))
                continue
            last = done + allow == len(payload)
            data = w.frame(w.DATA, w.END_STREAM if (last and end_stream) else 0, sid,
                           bytes(view[done:done + allow]))
            if self.send(data, until) != len(data):
                break
            done += allow
            self.conn_window -= allow
            self.stream_windows[sid] -= allow
            self.pump(0)
        return done

    # ---------------------------------------------------------------- reading
    def pump(self, wait: float = 0.0, limit: int = 1 << 20) -> None:
        """Read what the server sent (waiting up to `wait` for something) and act on
        it: ACK its SETTINGS and PINGs, keep its windows, GOAWAY, RST_STREAMs and
        statuses."""
        if wait > 0:
            self.wait_readable(wait)
        data = self.recv(limit)
        if not data:
            return
        replies = []
        for kind, flags, sid, payload in self.reader.feed(data):
            if kind == w.SETTINGS and not flags & w.ACK:
                self._apply_settings(w.parse_settings(payload))
                replies.append(w.settings(ack=True))
            elif kind == w.PING and not flags & w.ACK:
                replies.append(w.ping(payload, ack=True))
            elif kind == w.GOAWAY:
                last, code, debug = w.parse_goaway(payload)
                if self.goaway is None:
                    self.goaway = (self.elapsed(), last, code, debug[:200])
            elif kind == w.RST_STREAM:
                code = int.from_bytes(payload[:4], "big") if len(payload) >= 4 else -1
                self.rst[w.error_name(code)] += 1
                self._end(sid, f"RST_STREAM {w.error_name(code)}")
            elif kind == w.WINDOW_UPDATE and len(payload) >= 4:
                inc = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
                if sid == 0:
                    self.conn_window += inc
                elif sid in self.stream_windows:
                    self.stream_windows[sid] += inc
            elif kind in (w.HEADERS, w.CONTINUATION):
                self._header_fragment(kind, flags, sid, payload)
            elif kind == w.DATA:
                self.data_in += len(payload)
                if self.refill and payload:
                    replies += [w.window_update(0, len(payload)),
                                w.window_update(sid, len(payload))]
                if flags & w.END_STREAM:
                    self._end(sid, "ended")
        if replies and not self.closed:
            self.send(b"".join(replies), time.monotonic() + 0.5)

    def _apply_settings(self, values: dict[int, int]) -> None:
        old = self.server_settings.get(w.INITIAL_WINDOW_SIZE, 65535)
        self.server_settings.update(values)
        self.got_settings = True
        delta = self.server_settings.get(w.INITIAL_WINDOW_SIZE, 65535) - old
        for sid in self.stream_windows:
            self.stream_windows[sid] += delta

    def _header_fragment(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if kind == w.HEADERS:
            self._block_flags[sid] = flags
            # padding and priority fields, when flagged
            if flags & 0x8 and payload:
                pad = payload[0]
                payload = payload[1:len(payload) - pad]
            if flags & 0x20:
                payload = payload[5:]
            self._block[sid] = bytearray()
        buf = self._block.setdefault(sid, bytearray())
        if len(buf) < 1 << 20:
            buf += payload
        if not flags & w.END_HEADERS:
            return
        block = self._block.pop(sid)
        end = self._block_flags.pop(sid, 0) & w.END_STREAM
        fields = self._decode(bytes(block))
        outcome = None
        for name, value in fields:
            if name == "grpc-status":
                try:
                    outcome = w.GRPC_STATUS.get(int(value), value)
                except ValueError:
                    outcome = value
                self.grpc_status[outcome] += 1
                outcome = f"grpc-status {outcome}"
            elif name == ":status":
                self.http_status[value] += 1
                if value != "200":
                    outcome = outcome or f":status {value}"
        if end:
            self._end(sid, outcome or "ended")

    def _decode(self, block: bytes) -> list[tuple[str, str]]:
        if self.decoder is None or self.decoder_broken:
            return []
        try:
            return [(k if isinstance(k, str) else k.decode(errors="replace"),
                     v if isinstance(v, str) else v.decode(errors="replace"))
                    for k, v in self.decoder.decode(block)]
        except Exception:  # noqa: BLE001 -- a block we cannot read: stop decoding
            self.decoder_broken = True
            return []

    def _end(self, sid: int, outcome: str) -> None:
        # once per stream: a server may end one twice (Triton 2.51 answers a reset
        # stream with trailers and RST_STREAM, six times over)
        if sid in self.open_sids:
            self.open_sids.discard(sid)
            self.ended_count += 1
        if sid in self.watch and sid not in self.ended:
            self.ended[sid] = (self.elapsed(), outcome)

    # ---------------------------------------------------------------- report
    def fate_parts(self) -> list[str]:
        out = []
        if self.goaway:
            t, last, code, debug = self.goaway
            msg = debug.decode(errors="replace").strip()
            out.append(f"GOAWAY {w.error_name(code)} at {t:.1f}s"
                       + (f" ({msg[:60]})" if msg else ""))
        if self.rst:
            out.append("RST_STREAM " + ", ".join(f"{k} x{v}" for k, v in
                                                  self.rst.most_common(3)))
        return out + super().fate_parts()


class Crowd:
    """Many connections driven from one loop: opened at a bounded pace, then read
    for what the server does to them (closes, answers, GOAWAYs). Each connection may
    carry a script of bytes dribbled out `per_send` bytes every `interval` seconds."""

    def __init__(self, host: str, until: float):
        self.host, self.until = host, until
        self.t0 = time.monotonic()
        self.sel = selectors.DefaultSelector()
        self.conns: list[dict] = []
        self.refused = Counter()
        self.closed_times: list[float] = []
        self.replies = Counter()       # first thing each connection got back

    def open(self, port: int, n: int, h2: bool = False, first: bytes = b"",
             dribble: bytes = b"", interval: float = 1.0, per_send: int = 1,
             pending_max: int = 256) -> int:
        """Open n connections to port (stopping at the deadline); each sends `first`
        at once, then `dribble` a little at a time. Returns how many opened."""
        opened, pending = 0, {}
        poller = select.poll()
        started = time.monotonic()
        i = 0
        while (i < n or pending) and time.monotonic() < self.until:
            while i < n and len(pending) < pending_max:
                s = socket.socket()
                s.setblocking(False)
                err = s.connect_ex((self.host, port))
                i += 1
                if err in (0, errno.EINPROGRESS):
                    pending[s.fileno()] = s
                    poller.register(s, select.POLLOUT)
                else:
                    self.refused[errno.errorcode.get(err, str(err))] += 1
                    s.close()
            for fd, _ in poller.poll(50):
                poller.unregister(fd)
                s = pending.pop(fd)
                err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    self.refused[errno.errorcode.get(err, str(err))] += 1
                    s.close()
                    continue
                c = {"sock": s, "h2": h2,
                     "reader": w.FrameReader(keep=1024) if h2 else None,
                     "closed": None, "first": first, "todo": dribble, "pos": 0,
                     "interval": interval,
                     "per_send": per_send,
                     # spread the first dribbles over one interval
                     "next": time.monotonic() + interval * (len(self.conns) % 97) / 97}
                if first:
                    try:
                        s.send(first)
                    except OSError:
                        pass
                self.conns.append(c)
                self.sel.register(s, selectors.EVENT_READ, c)
                opened += 1
            if time.monotonic() - started > 60:
                break
        for s in pending.values():  # not connected by the deadline
            self.refused["still connecting at the end"] += 1
            s.close()
        return opened

    def run(self) -> None:
        """Until the deadline: read every connection, dribble what is due."""
        while time.monotonic() < self.until:
            self.poll(min(0.05, self.until - time.monotonic()))
            now = time.monotonic()
            for c in self.conns:
                if c["closed"] is None and c["pos"] < len(c["todo"]) and c["next"] <= now:
                    pos = c["pos"]
                    try:
                        c["pos"] += c["sock"].send(c["todo"][pos:pos + c["per_send"]])
                    except (BlockingIOError, InterruptedError):
                        pass
                    except OSError:
                        self._closed(c, "reset")
                    c["next"] = now + c["interval"]

    def poll(self, timeout: float) -> None:
        if not self.conns:
            time.sleep(max(0.0, timeout))
            return
        for key, _ in self.sel.select(max(0.0, timeout)):
            c = key.data
            try:
                data = c["sock"].recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                self._closed(c, "reset")
                continue
            if not data:
                self._closed(c, "closed")
                continue
            if c["h2"]:
                self._h2_frames(c, data)
            elif "reply" not in c:
                status = w.parse_status_line(data)
                c["reply"] = f"HTTP {status}" if status else "bytes"
                self.replies[c["reply"]] += 1

    def _h2_frames(self, c: dict, data: bytes) -> None:
        acks = []
        for kind, flags, sid, payload in c["reader"].feed(data):
            if kind == w.SETTINGS and not flags & w.ACK:
                acks.append(w.settings(ack=True))
            elif kind == w.PING and not flags & w.ACK:
                acks.append(w.ping(payload, ack=True))
            elif kind == w.GOAWAY and "reply" not in c:
                c["reply"] = "GOAWAY " + w.error_name(w.parse_goaway(payload)[1])
                self.replies[c["reply"]] += 1
            elif kind == w.RST_STREAM and "reply" not in c:
                c["reply"] = "RST_STREAM " + w.error_name(
                    int.from_bytes(payload[:4], "big"))
                self.replies[c["reply"]] += 1
            elif kind == w.HEADERS and "reply" not in c:
                c["reply"] = "HEADERS"
                self.replies["HEADERS"] += 1
        # answered only once our preface is out (bytes before it would be garbage)
        preface_out = c["first"].startswith(w.PREFACE) or \
            (c["todo"].startswith(w.PREFACE) and c["pos"] >= len(w.PREFACE))
        if acks and preface_out:
            try:
                c["sock"].send(b"".join(acks))
            except OSError:
                pass

    def _closed(self, c: dict, how: str) -> None:
        if c["closed"] is None:
            c["closed"] = how
            self.closed_times.append(time.monotonic() - self.t0)
            try:
                self.sel.unregister(c["sock"])
            except (KeyError, ValueError):
                pass

    def close(self) -> None:
        for c in self.conns:
            try:
                self.sel.unregister(c["sock"])
            except (KeyError, ValueError):
                pass
            c["sock"].close()
        self.sel.close()

    def fate(self, opened: int) -> str:
        closed = len(self.closed_times)
        parts = [f"{opened:,} open"]
        if self.refused:
            parts.append("not opened: " + ", ".join(f"{k} x{v}" for k, v in
                                                   self.refused.most_common(3)))
        if closed:
            t = sorted(self.closed_times)
            parts.append(f"{closed:,} closed by the server ({t[0]:.1f}-{t[-1]:.1f}s)")
        else:
            parts.append("none closed by the server")
        if self.replies:
            parts.append(", ".join(f"{k} x{v}" for k, v in self.replies.most_common(3)))
        return "; ".join(parts)
