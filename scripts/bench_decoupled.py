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

Models (`--models`): `repeat` alone, and `ens_repeat`, an ensemble in which each of
repeat's responses runs a python step (tests/models_ensemble): the price of a
decoupled step inside an ensemble.

Per point: responses/s, requests/s, time to first response (p50 and p99, from sending
the request to its first response), and the CPU time of every server process by role
(and of this client process) per request over the measured window.

    scripts/bench_decoupled.py --rounds 2 --duration 6
    scripts/bench_decoupled.py --skip triton
    scripts/bench_decoupled.py --routes grpc --models repeat,ens_repeat
"""

from __future__ import annotations

import http.client
import json
import queue
import shutil
import struct
import threading
import time
from pathlib import Path

import numpy as np

import benchkit
from benchkit import ROOT

RESPONSES = 100
_FRAME_HEAD = struct.Struct("<QQ")


def write_repo(repo: Path) -> None:
    shutil.copytree(ROOT / "tests" / "models_decoupled" / "repeat", repo / "repeat")
    # the generate extension maps JSON keys to inputs: IN takes a list of ints
    for name in ("py_echo_int", "ens_repeat"):
        shutil.copytree(ROOT / "tests" / "models_ensemble" / name, repo / name)


# --------------------------------------------------------------------- clients


def grpc_worker(url: str, model: str, stop: threading.Event, out: list) -> None:
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
            client.async_stream_infer(model, [inp], enable_empty_final_response=True)
            first, n = None, 0
            while True:
                result, error = q.get(timeout=60)
                if error is not None:
                    raise RuntimeError(error)
                response = result.get_response()
                if response.outputs:  # the final flag may come with the last one
                    if first is None:
                        first = time.perf_counter() - t0
                    n += 1
                if response.parameters["triton_final_response"].bool_param:
                    break
            out.append((time.perf_counter(), first, n))
    finally:
        client.stop_stream()
        client.close()


def http_worker(port: int, route: str, model: str, stop: threading.Event,
                out: list) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    if route == "generate_stream":
        body = json.dumps({"IN": list(range(RESPONSES))}).encode()
    else:
        body = json.dumps({"inputs": [{"name": "IN", "datatype": "INT32",
                                       "shape": [RESPONSES],
                                       "data": list(range(RESPONSES))}],
                           "parameters": {"binary_data_output": True}}).encode()
    path = f"/v2/models/{model}/{route}"
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


def measure(kind: str, route: str, model: str, repo: Path, args) -> dict:
    log = Path(args.log_dir) / f"{kind}-{model}-{route}.log"
    with benchkit.Server(kind, repo, args.ports, log) as server:
        stop = threading.Event()
        done: list = []
        threads = []
        for _ in range(args.concurrency):
            if route == "grpc":
                target = (grpc_worker, (server.grpc_url, model, stop, done))
            else:
                target = (http_worker, (server.http, route, model, stop, done))
            t = threading.Thread(target=target[0], args=target[1], daemon=True)
            t.start()
            threads.append(t)
        time.sleep(args.warmup)
        t0, n0 = time.perf_counter(), len(done)
        cpu0, me0 = server.cpu(), benchkit.own_cpu()
        time.sleep(args.duration)
        t1, n1 = time.perf_counter(), len(done)
        cpu1, me1 = server.cpu(), benchkit.own_cpu()
        stop.set()
        for t in threads:
            t.join(60)
    window = [d for d in done[n0:n1]]
    requests = len(window)
    seconds = t1 - t0
    responses = sum(n for _, _, n in window)
    ttfr = sorted(f for _, f, _ in window if f is not None)
    cpu0["client"], cpu1["client"] = me0, me1
    return {"server": kind, "model": model, "route": route,
            "concurrency": args.concurrency,
            "responses_per_s": round(responses / seconds, 1),
            "requests_per_s": round(requests / seconds, 2),
            "responses_per_request": round(responses / requests, 1) if requests else 0,
            "ttfr_p50_ms": round(1e3 * ttfr[len(ttfr) // 2], 2) if ttfr else None,
            "ttfr_p99_ms": round(1e3 * ttfr[int(len(ttfr) * 0.99)], 2) if ttfr else None,
            **benchkit.cpu_columns(cpu0, cpu1, requests)}


def main() -> None:
    p = benchkit.parser(__doc__)
    benchkit.add_common_args(p, [28450, 28451, 28452], duration=6.0, warmup=2.0,
                             concurrency=1, servers="triton,shmserve")
    p.add_argument("--routes", default="grpc,generate_stream,infer_stream")
    p.add_argument("--models", default="repeat")
    args = benchkit.parse(p, "bench-decoupled-")
    servers = benchkit.servers(args)
    rows = []
    with benchkit.repository("decoupled-repo-", write_repo) as repo:
        for r, order in benchkit.alternating(args.rounds, servers):
            for model in args.models.split(","):
                for route in args.routes.split(","):
                    for kind in order:
                        if kind == "triton" and route == "infer_stream":
                            continue  # shmserve's own route
                        benchkit.record(rows, {**measure(kind, route, model, repo, args),
                                               "round": r})
    benchkit.finish(args, rows)


if __name__ == "__main__":
    main()
