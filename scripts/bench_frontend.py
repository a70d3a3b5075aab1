#!/usr/bin/env python3
"""A frontend alone: the HTTP/1.1 transport's infer path in one process, for its CPU
per request without the noise of the other processes sharing the cores.

It drives the real pieces a frontend process runs for every wrk request: the native
HTTP/1.1 protocol (frontend/transport/http1.py) fed the bytes of scripts/bench_cclient's
body on `--connections` connections at once, the InferEndpoint, the SchedulerDataPlane
with its channel to the scheduler (a real unix socket), and the response written back.
The scheduler and the worker are one stand-in on the same loop that answers every
InferRequest at once with its input as the output, inline, as a python identity's
worker does; its own cost (decoding InferRequest, encoding the answers) is in the
figure, the same for both sides of an A/B. What it leaves out: uvloop's reads and
writes of the client sockets (the transports here are fakes that collect the bytes).

    .venv/bin/python scripts/bench_frontend.py [--requests 40000] [--connections 64]
        [--rounds 3] [--profile]

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
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import uvloop  # noqa: E402
from tritonclient.grpc import model_config_pb2  # noqa: E402

import cprofile_report  # noqa: E402
from bench_cclient import MODEL, http_body  # noqa: E402
from frontend.dataplane import SchedulerDataPlane  # noqa: E402
from frontend.http_server import make_http_app  # noqa: E402
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
    """A client socket's transport that keeps count of the responses written."""

    def __init__(self, bench: "Bench"):
        super().__init__()
        self.bench = bench
        self.last = b""

    def write(self, data) -> None:
        self.last = data
        self.bench.written()

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


class Bench:
    def __init__(self, folder: str, connections: int, elements: int):
        self.core = SchedulerDataPlane(f"ipc://{folder}/fe", f"ipc://{folder}/sched",
                                       f"shmserve-bench-fe-{os.getpid()}", 1 << 24)
        self.sched = Inbox(f"ipc://{folder}/sched", SCHEDULER_INBOX)
        self.answers = Outbox()
        self.request = request_bytes(elements)
        self.connections = connections
        self.conns: list[tuple[HttpProtocol, Transport]] = []
        self.left = 0
        self.done: asyncio.Future | None = None

    def attach(self, loop) -> None:
        self.core.attach(loop)
        self.answers.loop = loop
        self.sched.attach(loop, self.answer)
        self.core.on_model_state(ModelStateUpdate(MODEL, 1, ModelReadyState.READY,
                                                  config=identity_config(16)))
        app = make_http_app(self.core)
        for _ in range(self.connections):
            proto = HttpProtocol(app, set())
            transport = Transport(self)
            proto.connection_made(transport)
            self.conns.append((proto, transport))

    def answer(self, msg) -> None:
        """The scheduler's and worker's part, at once: the input back as the output."""
        out = [TensorRef("OUTPUT0", ref.datatype, ref.shape, data=ref.data)
               for ref in msg.inputs]
        self.answers.send(msg.reply_to, InferResponse(msg.id, outputs=out))

    def written(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.done.set_result(None)

    async def wave(self) -> None:
        """Every connection sends its request at once (wrk after a batch's answers),
        and the wave ends when every response is written."""
        self.left = len(self.conns)
        self.done = asyncio.get_running_loop().create_future()
        for proto, _ in self.conns:
            proto.data_received(self.request)
        await self.done

    def check(self) -> None:
        """Every connection's last answer: 200, with the input's bytes as the output."""
        data = self.request[-64:]
        for _, transport in self.conns:
            last = transport.last
            if not (last.startswith(b"HTTP/1.1 200 ") and last.endswith(data)):
                raise SystemExit(f"the frontend answered {last[:300]!r}")

    def close(self) -> None:
        self.sched.close()
        self.answers.close()
        self.core.close()


async def run(args, profile: cProfile.Profile | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-frontend-") as folder:
        bench = Bench(folder, args.connections, 16)
        bench.attach(asyncio.get_running_loop())
        settle_heap()  # as a served frontend's run_loop does
        try:
            waves = max(1, args.requests // args.connections)
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
    per = max(1, waves // args.segments) * args.connections
    us = sorted(1e6 * c / per for c in cpus)
    return {"requests": per * len(cpus), "cpu_us_per_request": round(sum(us) / len(us), 2),
            "min_us": round(us[0], 2), "median_us": round(us[len(us) // 2], 2),
            "requests_per_s": round(per * len(cpus) / wall)}


def calls_report(profile: cProfile.Profile, requests: int, top: int) -> str:
    """scripts/cprofile_report.py's table of the run (waits and start-up left out)."""
    with tempfile.TemporaryDirectory(prefix="bench-frontend-prof-") as folder:
        profile.dump_stats(os.path.join(folder, f"frontend-{os.getpid()}.prof"))
        return cprofile_report.report(Path(folder), requests, top, None)


def served(requests: int, connections: int) -> int:
    """Requests one `--rounds 1 --segments 1` run serves, its warm-up included."""
    waves = max(1, requests // connections)
    return (waves + max(1, waves // 10)) * connections


def instructions(args) -> float:
    """Instructions per request: two runs under callgrind, their difference."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    counts = []
    sizes = (args.requests, 4 * args.requests)
    with tempfile.TemporaryDirectory(prefix="bench-frontend-cg-") as folder:
        for n in sizes:
            out = subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={folder}/cg.out",
                 sys.executable, os.path.abspath(__file__), "--requests", str(n),
                 "--connections", str(args.connections), "--rounds", "1",
                 "--segments", "1"],
                capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
            found = re.search(r"Collected : (\d+)", out.stderr)
            if out.returncode != 0 or found is None:
                raise SystemExit(f"the run under valgrind failed: {out.stderr[-2000:]}")
            counts.append(int(found.group(1)))
    between = served(sizes[1], args.connections) - served(sizes[0], args.connections)
    return (counts[1] - counts[0]) / between


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=40000)
    p.add_argument("--connections", type=int, default=64)
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
    if args.instructions:  # which passes of the loop carry how many frames moves a
        # little with timing even under valgrind (+-5% here): the median of the rounds
        counts = sorted(instructions(args) for _ in range(args.rounds))
        print(f"{counts[len(counts) // 2]:,.0f} instructions per request (median; "
              f"rounds: {', '.join(f'{c:,.0f}' for c in counts)})")
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
