#!/usr/bin/env python3
"""A frontend alone: a transport's infer path in one process, for its CPU per request
without the noise of the other processes sharing the cores.

It drives the real pieces a frontend process runs for every request of the C clients
(scripts/bench_cclient.py), with their bytes:
- `--protocol http` (wrk): the native HTTP/1.1 protocol (frontend/transport/http1.py)
  fed bench_cclient's body on `--connections` connections at once, and the
  InferEndpoint;
- `--protocol grpc` (h2load): the native gRPC server's HTTP/2 connections
  (frontend/transport/grpc_native.py), `--connections` of them with `--streams`
  ModelInfer calls each at once, HEADERS in HPACK's indexed form as h2load sends them
  after its first, and the InferenceServicer;
then the SchedulerDataPlane with its channel to the scheduler (a real unix socket), and
the responses written back. The scheduler and the worker are one stand-in on the same
loop that answers every InferRequest at once with its input as the output, inline, as
a python identity's worker does; its own cost (decoding InferRequest, encoding the
answers) is in the figure, the same for both sides of an A/B. What it leaves out:
uvloop's reads and writes of the client sockets (the transports here are fakes that
collect the bytes).

    .venv/bin/python scripts/bench_frontend.py [--protocol http|grpc] [--requests 40000]
        [--connections 64 (http) / 16 (grpc)] [--streams 4] [--rounds 3] [--profile]

`--profile` prints the Python calls per request (cProfile) instead of timing.
`--instructions` counts the instructions a request costs, which do not move with a
noisy machine's neighbours as its CPU time does: two runs under valgrind's callgrind
(`--requests` and four times as many), and their difference divided by the requests
between them, the median of `--rounds` (a minute a round; valgrind must be
installed).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import struct
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hpack  # noqa: E402
import uvloop  # noqa: E402
from tritonclient.grpc import model_config_pb2  # noqa: E402

import callgrind_count  # noqa: E402
import cprofile_report  # noqa: E402
from bench_cclient import GRPC_PATH, MODEL, grpc_message, http_body  # noqa: E402
from frontend.dataplane import SchedulerDataPlane  # noqa: E402
from frontend.grpc_server import handler_table  # noqa: E402
from frontend.http_server import make_http_app  # noqa: E402
from frontend.transport import h2_frames as h2  # noqa: E402
from frontend.transport.engines import grpc_engine  # noqa: E402
from frontend.transport.grpc_native import GrpcConnection  # noqa: E402
from frontend.transport.http1 import HttpProtocol  # noqa: E402
from shm.channel import Inbox, Outbox  # noqa: E402
from shm.lifecycle import settle_heap  # noqa: E402
from shm.messages.frontend import ModelStateUpdate  # noqa: E402
from shm.messages.repository import ModelReadyState  # noqa: E402
from shm.messages.results import InferResponse  # noqa: E402
from shm.messages.scheduler import SCHEDULER_INBOX  # noqa: E402
from shm.tensor import TensorRef  # noqa: E402


def identity_config(elements: int) -> bytes:
    cfg = model_config_pb2.ModelConfig(name=MODEL, max_batch_size=64, backend="python")
    cfg.input.add(name="INPUT0", data_type=model_config_pb2.TYPE_FP32, dims=[elements])
    cfg.output.add(name="OUTPUT0", data_type=model_config_pb2.TYPE_FP32, dims=[elements])
    return cfg.SerializeToString()


def request_bytes(elements: int) -> bytes:
    """wrk's request, as bench_cclient's Lua script makes it send."""
    body, header_len = http_body(elements)
    return (b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
            b"Inference-Header-Content-Length: %d\r\n"
            b"Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n"
            % (MODEL.encode(), header_len, len(body))) + body


class Transport(asyncio.Transport):
    """A client socket's transport: it keeps what was written in the current wave and
    tells `done` after every write."""

    def __init__(self, done):
        super().__init__()
        self.done = done
        self.wave: list[bytes] = []
        self.answered = True  # until a wave feeds it requests

    def write(self, data) -> None:
        self.wave.append(bytes(data))
        self.done(self)

    def writelines(self, chunks) -> None:
        self.wave.extend(bytes(c) for c in chunks)
        self.done(self)

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 8000) if name in ("sockname", "peername") else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class Bench:
    """The data plane, the stand-in behind it, and the waves of requests; a protocol's
    subclass makes the connections (`connect`), feeds a wave (`feed`), says when a
    connection has all its answers (`answered`) and checks them (`check`)."""

    def __init__(self, folder: str, connections: int, elements: int):
        self.core = SchedulerDataPlane(f"ipc://{folder}/fe", f"ipc://{folder}/sched",
                                       f"shmserve-bench-fe-{os.getpid()}", 1 << 24)
        self.sched = Inbox(f"ipc://{folder}/sched", SCHEDULER_INBOX)
        self.answers = Outbox()
        self.elements = elements
        self.connections = connections
        self.left = 0
        self.done: asyncio.Future | None = None

    def attach(self, loop) -> None:
        self.core.attach(loop)
        self.answers.loop = loop
        self.sched.attach(loop, self.answer)
        self.core.on_model_state(ModelStateUpdate(MODEL, 1, ModelReadyState.READY,
                                                  config=identity_config(self.elements)))
        self.connect()

    def answer(self, msg) -> None:
        """The scheduler's and worker's part, at once: the input back as the output."""
        out = [TensorRef("OUTPUT0", ref.datatype, ref.shape, data=ref.data)
               for ref in msg.inputs]
        self.answers.send(msg.reply_to, InferResponse(msg.id, outputs=out))

    def written(self, transport: Transport) -> None:
        if not transport.answered and self.answered(transport):
            transport.answered = True
            self.left -= 1
            if self.left == 0:
                self.done.set_result(None)

    async def wave(self) -> None:
        """Every connection sends its requests at once (the C clients after a batch's
        answers), and the wave ends when every connection has all its answers."""
        self.left = self.connections
        self.done = asyncio.get_running_loop().create_future()
        self.feed()
        await self.done

    def close(self) -> None:
        self.sched.close()
        self.answers.close()
        self.core.close()


class HttpBench(Bench):
    """wrk's request on `connections` HTTP/1.1 connections, one at a time each."""

    def connect(self) -> None:
        self.request = request_bytes(self.elements)
        app = make_http_app(self.core)
        self.conns: list[tuple[HttpProtocol, Transport]] = []
        for _ in range(self.connections):
            proto = HttpProtocol(app, set())
            transport = Transport(self.written)
            proto.connection_made(transport)
            self.conns.append((proto, transport))

    def answered(self, transport: Transport) -> bool:
        return True  # one response a write

    def feed(self) -> None:
        for proto, transport in self.conns:
            transport.wave.clear()
            transport.answered = False
            proto.data_received(self.request)

    def check(self) -> None:
        """Every connection's last answer: 200, with the input's bytes as the output."""
        data = self.request[-4 * self.elements:]
        for _, transport in self.conns:
            last = transport.wave[-1] if transport.wave else b""
            if not (last.startswith(b"HTTP/1.1 200 ") and last.endswith(data)):
                raise SystemExit(f"the frontend answered {last[:300]!r}")


class GrpcBench(Bench):
    """h2load's ModelInfer calls: `streams` at once on each of `connections` HTTP/2
    connections, each call its HEADERS and one DATA frame with END_STREAM."""

    def __init__(self, folder: str, connections: int, elements: int, streams: int):
        super().__init__(folder, connections, elements)
        self.streams = streams

    def connect(self) -> None:
        service = handler_table(self.core)
        self.server = grpc_engine("native", service, "127.0.0.1:0", self.core)
        self.server.sock.close()  # never listens: the connections are made here
        encoder = hpack.Encoder()
        headers = [(":method", "POST"), (":scheme", "http"), (":path", GRPC_PATH),
                   (":authority", "127.0.0.1:8001"), ("user-agent", "h2load nghttp2/1.52"),
                   ("content-type", "application/grpc"), ("te", "trailers")]
        message = grpc_message(self.elements)
        self.message = struct.pack(">BI", 0, len(message)) + message
        headers.append(("content-length", str(len(self.message))))
        # the first call of a connection adds its headers to HPACK's table, the later
        # ones name them by index
        self.blocks = (encoder.encode(headers), encoder.encode(headers))
        big = (1 << 30) - 1  # h2load's windows (-w 30 -W 30)
        hello = (h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0, struct.pack(
            ">HIHI", h2.ENABLE_PUSH, 0, h2.INITIAL_WINDOW_SIZE, big))
            + h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", big - h2.DEFAULT_WINDOW)))
        self.conns: list[list] = []  # [connection, transport, next stream id, unacked]
        for _ in range(self.connections):
            conn = GrpcConnection(self.server)
            transport = Transport(self.written)
            conn.connection_made(transport)
            conn.data_received(hello + h2.frame(h2.SETTINGS, h2.ACK, 0))
            self.conns.append([conn, transport, 1, 0])
        self.by_transport = {id(c[1]): c[0] for c in self.conns}
        self.reply_data = None  # DATA bytes an answer takes of the window (check())

    def answered(self, transport: Transport) -> bool:
        return not self.by_transport[id(transport)].streams

    def feed(self) -> None:
        frame, headers, data = h2.frame, h2.HEADERS | 0, h2.DATA
        for entry in self.conns:
            conn, transport, sid, unacked = entry
            transport.wave.clear()
            transport.answered = False
            parts = []
            if self.reply_data is not None:
                unacked += self.streams * self.reply_data
                if unacked > 1 << 29:  # as nghttp2 gives back half a window
                    parts.append(frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", unacked)))
                    unacked = 0
            for _ in range(self.streams):
                parts.append(frame(headers, h2.END_HEADERS, sid, self.blocks[sid > 1]))
                parts.append(frame(data, h2.END_STREAM, sid, self.message))
                sid += 2
            entry[2], entry[3] = sid, unacked
            conn.data_received(b"".join(parts))

    def check(self) -> None:
        """Every call of the last wave: a DATA frame with the input's bytes in it, and
        trailers ending its stream."""
        data = self.message[-4 * self.elements:]
        for conn, transport, sid, _ in self.conns:
            wire, pos, replies, ends = b"".join(transport.wave), 0, [], 0
            while pos + 9 <= len(wire):
                length, kind, flags = (int.from_bytes(wire[pos:pos + 3], "big"),
                                       wire[pos + 3], wire[pos + 4])
                payload = wire[pos + 9:pos + 9 + length]
                if kind == h2.DATA:
                    replies.append(payload)
                elif kind == h2.HEADERS and flags & h2.END_STREAM:
                    ends += 1
                pos += 9 + length
            if (len(replies) != self.streams or ends != self.streams
                    or not all(r.endswith(data) for r in replies)):
                raise SystemExit(f"the frontend answered {wire[:300]!r}")
            self.reply_data = len(replies[0])

    def close(self) -> None:
        for conn, *_ in self.conns:
            conn.abort()
        super().close()


async def run(args, profile: cProfile.Profile | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-frontend-") as folder:
        bench = (HttpBench(folder, args.connections, 16) if args.protocol == "http" else
                 GrpcBench(folder, args.connections, 16, args.streams))
        bench.attach(asyncio.get_running_loop())
        settle_heap()  # as a served frontend's run_loop does
        try:
            waves = max(1, args.requests // per_wave(args))
            for _ in range(max(1, waves // 10)):  # warm: connections, arena, caches
                await bench.wave()
            bench.check()
            if profile is not None:
                profile.enable()
            t0 = time.perf_counter()
            cpus = []
            for _ in range(args.segments):
                cpu0 = time.process_time()
                for _ in range(max(1, waves // args.segments)):
                    await bench.wave()
                cpus.append(time.process_time() - cpu0)
            wall = time.perf_counter() - t0
            if profile is not None:
                profile.disable()
            bench.check()
        finally:
            bench.close()
    per = max(1, waves // args.segments) * per_wave(args)
    us = sorted(1e6 * c / per for c in cpus)
    return {"requests": per * len(cpus), "cpu_us_per_request": round(sum(us) / len(us), 2),
            "min_us": round(us[0], 2), "median_us": round(us[len(us) // 2], 2),
            "requests_per_s": round(per * len(cpus) / wall)}


def calls_report(profile: cProfile.Profile, requests: int, top: int) -> str:
    """scripts/cprofile_report.py's table of the run (waits and start-up left out)."""
    with tempfile.TemporaryDirectory(prefix="bench-frontend-prof-") as folder:
        profile.dump_stats(os.path.join(folder, f"frontend-{os.getpid()}.prof"))
        return cprofile_report.report(Path(folder), requests, top, None)


def per_wave(args) -> int:
    """Requests in a wave: one on each connection, or `--streams` over gRPC."""
    return args.connections * (args.streams if args.protocol == "grpc" else 1)


def served(requests: int, args) -> int:
    """Requests one `--rounds 1 --segments 1` run serves, its warm-up included."""
    waves = max(1, requests // per_wave(args))
    return (waves + max(1, waves // 10)) * per_wave(args)


def instructions(args) -> float:
    """Instructions per request: two runs under callgrind, their difference."""
    def argv(n: int) -> list[str]:
        return [os.path.abspath(__file__), "--requests", str(n), "--protocol",
                args.protocol, "--connections", str(args.connections), "--streams",
                str(args.streams), "--rounds", "1", "--segments", "1"]
    return callgrind_count.per_unit(argv, args.requests, 4 * args.requests,
                                    lambda n: served(n, args))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=40000)
    p.add_argument("--protocol", choices=("http", "grpc"), default="http",
                   help="wrk's HTTP/1.1 requests, or h2load's gRPC calls")
    p.add_argument("--connections", type=int,
                   help="client connections (default: 64 for http, as wrk's in "
                        "bench_cclient; 16 for grpc, as h2load's)")
    p.add_argument("--streams", type=int, default=4,
                   help="gRPC calls at once on each connection (h2load's -m)")
    p.add_argument("--rounds", type=int, default=3, help="processes, one after another")
    p.add_argument("--segments", type=int, default=10,
                   help="timed parts of a round: their least and median cost are shown, "
                        "as a noisy machine's stalls land in a few of them")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--json", action="store_true", help="one JSON line per round")
    p.add_argument("--instructions", action="store_true",
                   help="count instructions per request under callgrind")
    args = p.parse_args()
    if args.connections is None:
        args.connections = 64 if args.protocol == "http" else 16
    if args.instructions:  # which passes of the loop carry how many frames moves a
        # little with timing even under valgrind (+-5% here): the median of the rounds
        print(callgrind_count.median_line(
            [instructions(args) for _ in range(args.rounds)], "request"))
        return
    if args.profile:
        profile = cProfile.Profile()
        row = uvloop.run(run(args, profile))
        print(calls_report(profile, row["requests"], args.top))
        return
    for rnd in range(args.rounds):
        row = uvloop.run(run(args, None))
        row["round"] = rnd + 1
        print(json.dumps(row) if args.json else
              f"round {rnd + 1}: CPU us per request: least {row['min_us']:.2f}, median "
              f"{row['median_us']:.2f}, mean {row['cpu_us_per_request']:.2f} "
              f"({row['requests_per_s']} requests/s, {row['requests']} requests)")


if __name__ == "__main__":
    main()
