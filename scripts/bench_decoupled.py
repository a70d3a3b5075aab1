#!/usr/bin/env python3
"""Decoupled streaming, measured: a model that sends 100 small responses per request
(tests/models_decoupled/repeat with a 100-element input: one [1] INT32 + one [1] UINT32
output per response, then an empty final), shmserve against the real Triton, in one
run, alternating servers every round.

Routes:
- grpc: ModelStreamInfer with tritonclient's stream (both servers); each of
  `--concurrency` client threads keeps one stream and one request in flight;
- generate_stream: the generate extension's server-sent events (both servers);
- infer_stream: shmserve's binary HTTP stream (shmserve only).

Per point: responses/s, requests/s, time to first response (p50 and p99, from sending
the request to its first response), and the CPU time of every server process by role
(and of this client process) per request over the measured window.

    scripts/bench_decoupled.py --rounds 2 --duration 6
    scripts/bench_decoupled.py --skip triton
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_batching import TRITON, roles, server_command  # noqa: E402
from bench_mlp import cpu_by_role, process_tree, wait_ready  # noqa: E402

RESPONSES = 100
_FRAME_HEAD = struct.Struct("<QQ")


def write_repo(repo: Path) -> None:
    shutil.copytree(ROOT / "tests" / "models_decoupled" / "repeat", repo / "repeat")
    # the generate extension maps JSON keys to inputs: IN takes a list of ints


# --------------------------------------------------------------------- clients


def grpc_worker(url: str, stop: threading.Event, out: list) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    x = np.arange(RESPONSES, dtype=np.int32)
    inp = grpcclient.InferInput("IN", [RESPONSES], "INT32")
    inp.set_data_from_numpy(x)
    try:
        while not stop.is_set():
            t0 = time.perf_counter()
            client.async_stream_infer("repeat", [inp], enable_empty_final_response=True)
            first, n = None, 0
            while True:
                result, error = q.get(timeout=60)
                if error is not None:
                    raise RuntimeError(error)
                params = result.get_response().parameters
                if params["triton_final_response"].bool_param:
                    break
                if first is None:
                    first = time.perf_counter() - t0
                n += 1
            out.append((time.perf_counter(), first, n))
    finally:
        client.stop_stream()
        client.close()


def http_worker(port: int, route: str, stop: threading.Event, out: list) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    if route == "generate_stream":
        body = json.dumps({"IN": list(range(RESPONSES))}).encode()
    else:
        body = json.dumps({"inputs": [{"name": "IN", "datatype": "INT32",
                                       "shape": [RESPONSES],
                                       "data": list(range(RESPONSES))}],
                           "parameters": {"binary_data_output": True}}).encode()
    path = f"/v2/models/repeat/{route}"
    while not stop.is_set():
        t0 = time.perf_counter()
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"{resp.status}: {resp.read()[:200]!r}")
        first, n = None, 0
        if route == "generate_stream":
            buf = b""
            while True:
                chunk = resp.read1(65536)
                if not chunk:
                    break
                buf += chunk
                events = buf.split(b"\n\n")
                buf = events.pop()
                for _ in events:
                    if first is None:
                        first = time.perf_counter() - t0
                    n += 1
        else:
            while True:
                head = resp.read(_FRAME_HEAD.size)
                if not head:
                    break
                size, _ = _FRAME_HEAD.unpack(head)
                resp.read(size)
                if first is None:
                    first = time.perf_counter() - t0
                n += 1
        out.append((time.perf_counter(), first, n))


# --------------------------------------------------------------------- measuring


def measure(kind: str, route: str, repo: Path, args) -> dict:
    http_port, grpc_port, _ = args.ports
    log = open(Path(args.log_dir) / f"{kind}-{route}.log", "ab")
    cwd = ROOT if kind.startswith("shmserve") else repo  # Triton: not from our checkout
    proc = subprocess.Popen(server_command(kind, repo, args.ports), cwd=cwd, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(http_port, proc, 180)
        stop = threading.Event()
        done: list = []
        threads = []
        for _ in range(args.concurrency):
            if route == "grpc":
                target = (grpc_worker, (f"127.0.0.1:{grpc_port}", stop, done))
            else:
                target = (http_worker, (http_port, route, stop, done))
            t = threading.Thread(target=target[0], args=target[1], daemon=True)
            t.start()
            threads.append(t)
        time.sleep(args.warmup)
        pids = process_tree(proc.pid)
        t0, n0 = time.perf_counter(), len(done)
        cpu0, me0 = roles(pids), time.process_time()
        time.sleep(args.duration)
        t1, n1 = time.perf_counter(), len(done)
        cpu1, me1 = roles(pids), time.process_time()
        stop.set()
        for t in threads:
            t.join(60)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    window = [d for d in done[n0:n1]]
    requests = len(window)
    seconds = t1 - t0
    responses = sum(n for _, _, n in window)
    ttfr = sorted(f for _, f, _ in window if f is not None)
    cpu_us = {role: round(1e6 * (cpu1[role] - cpu0.get(role, 0.0)) / requests, 1)
              for role in cpu1} if requests else {}
    cpu_us["client"] = round(1e6 * (me1 - me0) / requests, 1) if requests else 0.0
    return {"server": kind, "route": route, "concurrency": args.concurrency,
            "responses_per_s": round(responses / seconds, 1),
            "requests_per_s": round(requests / seconds, 2),
            "responses_per_request": round(responses / requests, 1) if requests else 0,
            "ttfr_p50_ms": round(1e3 * ttfr[len(ttfr) // 2], 2) if ttfr else None,
            "ttfr_p99_ms": round(1e3 * ttfr[int(len(ttfr) * 0.99)], 2) if ttfr else None,
            "cpu_us_per_request": cpu_us,
            "server_cpu_us_per_request": round(sum(v for k, v in cpu_us.items()
                                                   if k != "client"), 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--routes", default="grpc,generate_stream,infer_stream")
    p.add_argument("--servers", default="triton,shmserve")
    p.add_argument("--skip", action="append", default=[])
    p.add_argument("--ports", type=lambda t: [int(x) for x in t.split(",")],
                   default=[28450, 28451, 28452])
    p.add_argument("--log-dir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    servers = [s for s in args.servers.split(",") if s not in args.skip]
    if "triton" in servers and not os.path.exists(TRITON):
        sys.exit(f"{TRITON} not found: run ../shared/anchor/setup.sh, or --skip triton")
    args.log_dir = args.log_dir or tempfile.mkdtemp(prefix="bench-decoupled-")
    rows = []
    with tempfile.TemporaryDirectory(prefix="decoupled-repo-") as tmp:
        repo = Path(tmp)
        write_repo(repo)
        for r in range(args.rounds):
            order = servers if r % 2 == 0 else servers[::-1]
            for route in args.routes.split(","):
                for kind in order:
                    if kind == "triton" and route == "infer_stream":
                        continue  # shmserve's own route
                    row = measure(kind, route, repo, args)
                    row["round"] = r + 1
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    print(f"logs in {args.log_dir}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
