"""The pure parts of scripts/attack_probe.py: the bytes it builds (HTTP/2 frames, HPACK,
gRPC, protobuf, gzip, HTTP/1.1), the frame reader, the HTTP/2 peer's bookkeeping
against an in-process fake server, the statistics and the table, and the memory
accounting over a fake /proc. No shmserve is started."""

import gzip
import json
import os
import socket
import sys
import threading
import time

import hpack
import pytest

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "..", "scripts")
sys.path.insert(0, os.path.abspath(SCRIPTS))

import attack_cases as cases  # noqa: E402
import attack_memory as mem  # noqa: E402
import attack_probe as probe  # noqa: E402
import attack_report as report  # noqa: E402
import attack_wire as w  # noqa: E402
from attack_peer import H2Peer  # noqa: E402


# --- frames -------------------------------------------------------------------------------

def test_frame_header_layout():
    f = w.frame(w.HEADERS, w.END_HEADERS | w.END_STREAM, 0x80000003, b"abc")
    assert f[:3] == b"\x00\x00\x03" and f[3] == w.HEADERS and f[4] == 0x5
    assert f[5:9] == b"\x00\x00\x00\x03"  # the reserved bit is cleared
    assert f[9:] == b"abc"


def test_control_frames_read_back_byte_by_byte():
    stream = (w.settings({w.INITIAL_WINDOW_SIZE: 0, w.MAX_FRAME_SIZE: 32768})
              + w.settings(ack=True) + w.ping(b"12345678") + w.rst_stream(5, w.CANCEL)
              + w.window_update(0, 1000)
              + w.frame(w.GOAWAY, 0, 0, b"\x00\x00\x00\x07\x00\x00\x00\x0bcalm"))
    r = w.FrameReader()
    frames = [f for i in range(len(stream)) for f in r.feed(stream[i:i + 1])]
    kinds = [(k, fl, sid) for k, fl, sid, _ in frames]
    assert kinds == [(w.SETTINGS, 0, 0), (w.SETTINGS, w.ACK, 0), (w.PING, 0, 0),
                     (w.RST_STREAM, 0, 5), (w.WINDOW_UPDATE, 0, 0), (w.GOAWAY, 0, 0)]
    assert w.parse_settings(frames[0][3]) == {w.INITIAL_WINDOW_SIZE: 0,
                                              w.MAX_FRAME_SIZE: 32768}
    assert frames[2][3] == b"12345678"
    assert w.parse_goaway(frames[5][3]) == (7, 11, b"calm")
    assert w.error_name(11) == "ENHANCE_YOUR_CALM" and w.error_name(99) == "0x63"


def test_frame_reader_keeps_only_the_head_of_a_huge_payload():
    big = w.frame(w.DATA, 0, 1, b"x" * 5000) + w.ping(b"after!!!")
    r = w.FrameReader(keep=100)
    got = r.feed(big[:50]) + r.feed(big[50:3000]) + r.feed(big[3000:])
    assert [(k, len(p)) for k, _, _, p in got] == [(w.DATA, 100), (w.PING, 8)]
    assert got[1][3] == b"after!!!"
    # and whole in one piece
    assert [(k, len(p)) for k, _, _, p in w.FrameReader(keep=100).feed(big)] == \
        [(w.DATA, 100), (w.PING, 8)]


def test_data_frames_split_at_the_frame_size_with_end_stream_last():
    frames = w.FrameReader().feed(b"".join(w.data_frames(3, b"a" * 40000, 16384)))
    assert [len(p) for _, _, _, p in frames] == [16384, 16384, 7232]
    assert [fl for _, fl, _, _ in frames] == [0, 0, w.END_STREAM]


# --- HPACK --------------------------------------------------------------------------------

@pytest.mark.parametrize("value, bits, encoded", [
    (10, 5, b"\x0a"), (1337, 5, b"\x1f\x9a\x0a"), (42, 8, b"\x2a"),  # RFC 7541 C.1
    (31, 5, b"\x1f\x00"), (127, 7, b"\x7f\x00")])
def test_hpack_integers_as_the_rfc_examples(value, bits, encoded):
    assert w.hpack_int(value, bits) == encoded


def test_request_block_decodes_to_a_grpc_request():
    block = w.request_block("h:1", extra=[("grpc-encoding", "gzip")])
    fields = hpack.Decoder().decode(block)
    assert fields == [(":method", "POST"), (":scheme", "http"), (":path", w.INFER_PATH),
                      (":authority", "h:1"), ("content-type", "application/grpc"),
                      ("te", "trailers"), ("grpc-encoding", "gzip")]


def test_amplification_block_expands_4000_times():
    entry, size = w.amplification_entry(4096)
    assert size + 32 <= 4096  # fits the default dynamic table (RFC 7541 4.1)
    d = hpack.Decoder(max_header_list_size=1 << 30)
    first = d.decode(w.request_block("h") + entry)
    assert first[-1] == ("x-amp", "a" * (size - len("x-amp")))
    later = d.decode(w.request_block("h") + w.hp_indexed(62) * 4000)
    refs = later[6:]
    assert len(refs) == 4000 and set(refs) == {first[-1]}
    # a smaller table: the entry shrinks to fit
    assert w.amplification_entry(1024)[1] + 32 <= 1024


# --- gRPC, protobuf, gzip -----------------------------------------------------------------

def test_model_infer_request_is_a_valid_protobuf():
    pb = pytest.importorskip("tritonclient.grpc.service_pb2")
    raw = bytes(range(64))
    msg = pb.ModelInferRequest.FromString(
        w.model_infer_request("identity_fp32", "INPUT0", [1, 16], raw))
    assert msg.model_name == "identity_fp32"
    assert msg.inputs[0].name == "INPUT0" and msg.inputs[0].datatype == "FP32"
    assert list(msg.inputs[0].shape) == [1, 16]
    assert msg.raw_input_contents == [raw]


def test_model_load_request_is_a_valid_protobuf():
    pb = pytest.importorskip("tritonclient.grpc.service_pb2")
    msg = pb.RepositoryModelLoadRequest.FromString(
        w.model_load_request("../x", '{"backend": "python"}', {"file:1/model.py": b"#"}))
    assert msg.model_name == "../x"
    assert msg.parameters["config"].string_param == '{"backend": "python"}'
    assert msg.parameters["file:1/model.py"].bytes_param == b"#"


def test_grpc_prefix_may_lie_about_the_length():
    assert w.grpc_prefix(0xFFFFFFFF) == b"\x00\xff\xff\xff\xff"
    assert w.grpc_message(b"abc", compressed=True) == b"\x01\x00\x00\x00\x03abc"


@pytest.mark.parametrize("size, chunk", [(3 << 20, 1 << 20), ((3 << 20) + 7, 1 << 20),
                                         (1000, 1 << 20)])
def test_gzip_of_zeros_inflates_to_exactly_that_many_zeros(size, chunk):
    bomb = w.gzip_of_zeros(size, chunk)
    assert gzip.decompress(bomb) == bytes(size)


def test_gzip_bomb_ratio():
    assert len(w.gzip_of_zeros(64 << 20)) < (64 << 20) // 500


# --- HTTP/1.1 -----------------------------------------------------------------------------

def test_http_request_adds_no_framing_headers():
    raw = w.http_request("POST", "/p", [("Content-Length", "-1")], b"body")
    assert raw == b"POST /p HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -1\r\n\r\nbody"
    assert w.parse_status_line(b"HTTP/1.1 400 Bad Request\r\n") == 400
    assert w.parse_status_line(b"garbage") is None


def test_deep_json_nests():
    assert json.loads(w.deep_json(3)) == {"a": {"a": {"a": 1}}}
    assert len(w.deep_json(100_000)) > 500_000


class _OneShotServer:
    """A loopback listener that answers each connection with `reply` (then closes it
    if `close`), or says nothing."""

    def __init__(self, reply: bytes = b"", close: bool = True):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.reply, self.close_after = reply, close
        self.conns = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            c.recv(65536)
            if self.reply:
                c.sendall(self.reply)
                if self.close_after:
                    c.close()

    def stop(self):
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize("reply, close, outcome", [
    (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", True, "400+close"),
    (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", False, "400 kept open"),
    (b"", False, "no answer in 0.3s")])
def test_http_exchange_classifies_the_answer(reply, close, outcome):
    srv = _OneShotServer(reply, close)
    try:
        got = cases.http_exchange("127.0.0.1", srv.port, b"GET / HTTP/1.1\r\n\r\n",
                                  timeout=0.3, linger=0.2)
    finally:
        srv.stop()
    assert got == outcome


def test_variants_try_each_at_least_once_however_short_the_window():
    srv = _OneShotServer(b"HTTP/1.1 400 Bad\r\n\r\n")
    try:
        t = cases.Target("127.0.0.1", srv.port, 0)
        r = cases._variants(t, time.monotonic(), [("a", b"x\r\n\r\n"), ("b", b"y\r\n\r\n")],
                            gap=0, timeout=0.5)
    finally:
        srv.stop()
    assert r["outcomes"] == {"a: 400+close": 1, "b: 400+close": 1}
    assert r["fate"] == "a: 400+close x1; b: 400+close x1"


# --- the HTTP/2 peer against a fake server ------------------------------------------------

def test_h2_peer_keeps_what_the_server_did():
    """The peer ACKs the server's SETTINGS and PING, applies its window and stream
    limit, and records trailers, RST_STREAMs and the GOAWAY before the close."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    received = []

    def server():
        c, _ = lsock.accept()
        c.settimeout(5)
        buf = b""
        while len(buf) < len(w.PREFACE) + 9:
            buf += c.recv(65536)
        enc = hpack.Encoder()
        c.sendall(w.settings({w.MAX_CONCURRENT_STREAMS: 5, w.INITIAL_WINDOW_SIZE: 100})
                  + w.ping(b"pingpong")
                  + w.frame(w.HEADERS, w.END_HEADERS | w.END_STREAM, 1,
                            enc.encode([(":status", "200"), ("grpc-status", "8")]))
                  + w.rst_stream(1, 0)  # stream 1 ended a second time
                  + w.rst_stream(3, 7) + w.window_update(0, 1000)
                  + w.frame(w.GOAWAY, 0, 0, b"\x00\x00\x00\x03\x00\x00\x00\x0bcalm"))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the peer's replies, until both ACKs came
            try:
                chunk = c.recv(65536)
            except OSError:
                break
            received.append(chunk)
            frames = w.FrameReader().feed(b"".join(received))
            if sum(fl & w.ACK for k, fl, _, _ in frames if k in (w.SETTINGS, w.PING)) >= 2:
                break
        c.close()

    th = threading.Thread(target=server, daemon=True)
    th.start()
    p = H2Peer("127.0.0.1", lsock.getsockname()[1])
    try:
        until = time.monotonic() + 5
        p.start(None, until)
        for sid in (p.new_sid(), p.new_sid()):
            p.headers(sid, w.request_block(p.authority), until, watch=True)
        p.wait_settings(until)
        while not p.closed and time.monotonic() < until:
            p.pump(0.05)
        th.join(5)
    finally:
        p.close()
        lsock.close()
    assert p.max_streams == 5 and p.stream_window(9) == 100
    assert p.conn_window == 65535 + 1000
    assert p.grpc_status == {"RESOURCE_EXHAUSTED": 1}
    assert p.ended[1][1] == "grpc-status RESOURCE_EXHAUSTED"
    assert p.ended[3][1] == "RST_STREAM REFUSED_STREAM"
    assert p.ended_count == 2 and p.open_sids == set()  # each stream ends once
    assert p.goaway[1:3] == (3, 11)
    fate = "; ".join(p.fate_parts())
    assert "GOAWAY ENHANCE_YOUR_CALM" in fate and "(calm)" in fate
    assert "RST_STREAM NO_ERROR x1, REFUSED_STREAM x1" in fate and "closed at" in fate
    replies = w.FrameReader().feed(b"".join(received))
    assert (w.SETTINGS, w.ACK) in [(k, fl) for k, fl, _, _ in replies]
    assert any(k == w.PING and fl == w.ACK and pl == b"pingpong"
               for k, fl, _, pl in replies)


# --- statistics and the table -------------------------------------------------------------

def test_percentile_interpolates_like_numpy():
    assert report.percentile([], 50) is None
    assert report.percentile([5.0], 99) == 5.0
    assert report.percentile([1, 2, 3, 4], 50) == 2.5
    assert report.percentile(list(range(101)), 99) == 99


def test_victim_stats_counts_timeouts_and_errors_in_the_window():
    recs = [[0.0, 5.0, "ok"], [1.0, 7.0, "ok"], [2.0, None, "timeout"],
            [3.0, None, "error"], [4.0, 100.0, "ok"], [9.0, 1.0, "ok"]]
    s = report.victim_stats(recs, 0.5, 5.0)
    assert (s["calls"], s["ok"], s["timeouts"], s["errors"]) == (4, 2, 1, 1)
    assert s["max_ms"] == 100.0 and s["p50_ms"] == pytest.approx(53.5)
    assert report.fmt_victim(s) == "99 / 100 ms, 2 err (1 timeout), 2 ok"
    assert report.fmt_victim(report.victim_stats([])) == "no calls"


def test_table_rows():
    row = {"label": "rapid reset", "fate": "GOAWAY ENHANCE_YOUR_CALM at 0.1s | x",
           "victim": {"grpc": report.victim_stats([[0, 3.0, "ok"]]),
                      "http": report.victim_stats([[0, None, "timeout"]])},
           "memory": {"start": 100 << 20, "delta_peak": 300 << 20, "delta_after": 1 << 19}}
    skipped = {"label": "load", "skipped": "needs --model-control-mode=explicit"}
    text = report.table([row, skipped], "shmserve")
    lines = text.splitlines()
    assert lines[0] == "### shmserve" and lines[2].startswith("| attack |")
    assert lines[4] == ("| rapid reset | 3.0 / 3.0 ms, 0 err, 1 ok | - / - ms, 1 err "
                        "(1 timeout), 0 ok | +300 / +0.5 MiB (of 100) | "
                        "GOAWAY ENHANCE_YOUR_CALM at 0.1s / x |")
    assert lines[5] == "| load | - | - | - | n/a: needs --model-control-mode=explicit |"
    both = report.side_by_side({"shmserve": [row, skipped], "triton": [row]})
    assert both.splitlines()[2].startswith(
        "| rapid reset | gRPC 3.0/3.0, HTTP -/- ms; 1 err; +300 / +0.5 MiB |")
    assert both.splitlines()[3] == "| load | n/a | - |"


def test_cases_are_selected_in_the_tables_order():
    assert [c.name for c in cases.select("ping-flood,rapid-reset")] == \
        ["rapid-reset", "ping-flood"]
    assert len(cases.select(None)) == len(cases.CASES) == len(cases.BY_NAME)
    with pytest.raises(ValueError, match="unknown case"):
        cases.select("rapid-reset,nope")


# --- memory over a fake /proc -------------------------------------------------------------

def _proc(root, pid, rss_kib, shmem_kib, children=(), maps=()):
    d = root / "proc" / str(pid)
    (d / "task" / str(pid)).mkdir(parents=True)
    (d / "status").write_text(f"Name:\tx\nVmRSS:\t{rss_kib} kB\nRssAnon:\t1 kB\n"
                              f"RssShmem:\t{shmem_kib} kB\n")
    (d / "task" / str(pid) / "children").write_text(" ".join(map(str, children)))
    (d / "maps").write_text("".join(
        f"7f00{i:04x}000-7f00{i:04x}fff rw-s 00000000 00:1a {ino} {path}\n"
        for i, (ino, path) in enumerate(maps))
        + "55d0000-55d1000 r-xp 00000000 08:01 1234 /usr/bin/python3\n")


def test_tree_memory_counts_each_segment_once_by_its_pages(tmp_path):
    """Three processes; a 1 MiB segment mapped by two of them counts once; a sparse
    one counts only what is allocated; an unmapped one with the server's prefix
    counts; private RSS is RSS less what is shared memory."""
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "shmserve-64-a").write_bytes(b"\1" * (1 << 20))
    with open(shm / "sparse", "wb") as f:
        f.truncate(64 << 20)  # announced, not touched: holds no pages
    (shm / "shmserve-64-kept").write_bytes(b"\1" * (256 << 10))
    (shm / "other-server").write_bytes(b"\1" * 4096)
    ino_a = (shm / "shmserve-64-a").stat().st_ino
    ino_sparse = (shm / "sparse").stat().st_ino
    seg = [(ino_a, "/dev/shm/shmserve-64-a")]
    _proc(tmp_path, 100, 10_000, 1024, children=[101, 102], maps=seg)
    _proc(tmp_path, 101, 20_000, 1024, maps=seg + [(ino_sparse, "/dev/shm/sparse")])
    _proc(tmp_path, 102, 5_000, 0, children=[103])
    _proc(tmp_path, 999, 50_000, 0)  # not in the tree
    proc = str(tmp_path / "proc")
    assert mem.tree_pids(100, proc) == [100, 101, 102]  # 103 is gone
    m = mem.tree_memory(100, proc, str(shm), prefixes=("shmserve-64",))
    assert m["pids"] == [100, 101, 102]
    assert m["rss"] == (10_000 - 1024 + 20_000 - 1024 + 5_000) * 1024
    assert m["shm"] == (1 << 20) + (256 << 10)
    assert m["total"] == m["rss"] + m["shm"] and m["shm_files"] == 3
    assert m["unresolved"] == 0


def test_tree_memory_of_a_tree_that_is_gone(tmp_path):
    (tmp_path / "proc").mkdir()
    m = mem.tree_memory(4242, str(tmp_path / "proc"), str(tmp_path))
    assert m == {"rss": 0, "shm": 0, "total": 0, "pids": [], "shm_files": 0,
                 "unresolved": 0}


def test_sampler_peak_and_series():
    s = mem.Sampler(None)
    s.samples = [(10.0, 1 << 20, 0, 0), (10.2, 5 << 20, 0, 0), (10.9, 2 << 20, 0, 0),
                 (12.0, 9 << 20, 0, 0)]
    assert s.peak(10.1, 11.0) == 5 << 20 and s.peak(13.0) is None
    assert s.series(10.0, 11.0) == [(0.0, 1.0), (0.9, 2.0)]


# --- one case, with the server, victim and sampler faked ------------------------------

class _FakeVictim:
    """Its one call starts the moment the window opens and hangs to its timeout."""

    def ask(self, cmd, wait):
        if cmd == "start":
            self.t = time.monotonic()
            return {"started": True}
        return {"grpc": [[self.t, None, "timeout"]], "http": [[self.t, 2.0, "ok"]],
                "first_error": {"grpc": "DEADLINE_EXCEEDED"}}


class _FakeServer:
    name, root = "fake", None

    def alive(self):
        return True


class _FakeSampler:
    def __init__(self):
        self.totals = iter([100 << 20, 110 << 20])

    def sample(self):
        return {"total": next(self.totals)}

    def peak(self, since):
        return 300 << 20


def test_run_case_counts_a_victim_call_that_hung_from_the_window_start():
    from types import SimpleNamespace
    case = cases.Case("x", "x attack", lambda t, until: {"fate": "closed at 0.1s"})
    args = SimpleNamespace(duration=0.01, after=0.0, timeout=5.0)
    row = probe.run_case(case, _FakeServer(), _FakeVictim(), _FakeSampler(),
                         cases.Target("127.0.0.1", 1, 2), args, {})
    assert row["victim"]["grpc"]["timeouts"] == 1 and row["victim"]["http"]["ok"] == 1
    assert row["fate"] == "closed at 0.1s"
    assert (row["memory"]["delta_peak"], row["memory"]["delta_after"]) == \
        (200 << 20, 10 << 20)


def test_run_case_skips_what_does_not_apply():
    case = cases.Case("x", "x attack", None, needs=("explicit",))
    row = probe.run_case(case, _FakeServer(), None, None, None, None, {"explicit": False})
    assert row["skipped"] == "needs --model-control-mode=explicit"


def test_run_case_reports_a_server_the_attack_killed():
    from types import SimpleNamespace

    class Dead(_FakeServer):
        def alive(self):
            return False

    case = cases.Case("x", "x attack", lambda t, until: {"fate": "reset at 0.1s"})
    row = probe.run_case(case, Dead(), _FakeVictim(), _FakeSampler(),
                         cases.Target("127.0.0.1", 1, 2),
                         SimpleNamespace(duration=0.01, after=0.0, timeout=5.0), {})
    assert row["server_died"] and row["fate"] == "reset at 0.1s; SERVER DIED"
