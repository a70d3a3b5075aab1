#!/usr/bin/env python3
"""A decoupled step inside an ensemble, measured: `ens_repeat` (tests/models_ensemble:
the decoupled repeater sends one response per input element, each runs a python
identity step, the ensemble streams one response per element) against `repeat` alone,
over the gRPC stream, shmserve and the real Triton in one run, alternating servers
every round.

Per point: responses/s, time to first response (p50), and the CPU time of every
server process by role (and of this client) per request. Ratios: the ensemble's
responses/s over the repeater's on the same server (the price of one more python step
per response), and shmserve's over Triton's for each model.

    scripts/bench_ensdec.py --rounds 2 --duration 5
    scripts/bench_ensdec.py --skip triton
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
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
from bench_mlp import process_tree, wait_ready  # noqa: E402

MODELS = ("repeat", "ens_repeat")


def write_repo(repo: Path) -> None:
    shutil.copytree(ROOT / "tests" / "models_decoupled" / "repeat", repo / "repeat")
    for name in ("py_echo_int", "ens_repeat"):
        shutil.copytree(ROOT / "tests" / "models_ensemble" / name, repo / name)


def stream_client(url: str, model: str, elements: int, stop: threading.Event,
                  out: list) -> None:
    """One stream, one request in flight: (finished at, time to first response,
    responses) per request."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    inp = grpcclient.InferInput("IN", [elements], "INT32")
    inp.set_data_from_numpy(np.arange(elements, dtype=np.int32))
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
                if response.outputs:
                    n += 1
                    if first is None:
                        first = time.perf_counter() - t0
                if response.parameters["triton_final_response"].bool_param:
                    break
            out.append((time.perf_counter(), first, n))
    finally:
        client.stop_stream()
        client.close()


def measure(kind: str, model: str, repo: Path, args) -> dict:
    http_port, grpc_port, _ = args.ports
    log = open(Path(args.log_dir) / f"{kind}-{model}.log", "ab")
    cwd = ROOT if kind.startswith("shmserve") else repo  # Triton: not from our checkout
    proc = subprocess.Popen(server_command(kind, repo, args.ports), cwd=cwd, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(http_port, proc, 180)
        stop = threading.Event()
        done: list = []
        threads = [threading.Thread(target=stream_client, daemon=True, args=(
            f"127.0.0.1:{grpc_port}", model, args.elements, stop, done))
            for _ in range(args.concurrency)]
        for t in threads:
            t.start()
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
    window = done[n0:n1]
    requests = len(window)
    seconds = t1 - t0
    ttfr = sorted(f for _, f, _ in window if f is not None)
    cpu_us = {role: round(1e6 * (cpu1[role] - cpu0.get(role, 0.0)) / requests, 1)
              for role in cpu1} if requests else {}
    cpu_us["client"] = round(1e6 * (me1 - me0) / requests, 1) if requests else 0.0
    return {"server": kind, "model": model, "concurrency": args.concurrency,
            "responses_per_s": round(sum(n for _, _, n in window) / seconds, 1),
            "requests_per_s": round(requests / seconds, 2),
            "ttfr_p50_ms": round(1e3 * ttfr[len(ttfr) // 2], 2) if ttfr else None,
            "cpu_us_per_request": cpu_us,
            "server_cpu_us_per_request": round(sum(v for k, v in cpu_us.items()
                                                   if k != "client"), 1)}


def summary(rows: list[dict], servers: list[str]) -> dict:
    """Mean responses/s per (server, model) over the rounds, and the ratios."""
    mean = {}
    for s in servers:
        for m in MODELS:
            vals = [r["responses_per_s"] for r in rows
                    if r["server"] == s and r["model"] == m]
            if vals:
                mean[(s, m)] = sum(vals) / len(vals)
    out = {"responses_per_s": {f"{s}/{m}": round(v, 1) for (s, m), v in mean.items()}}
    for s in servers:
        if (s, "repeat") in mean and (s, "ens_repeat") in mean:
            out[f"{s}: ensemble/repeat"] = round(mean[(s, "ens_repeat")]
                                                 / mean[(s, "repeat")], 2)
    if "triton" in servers and "shmserve" in servers:
        for m in MODELS:
            if ("triton", m) in mean and ("shmserve", m) in mean:
                out[f"{m}: shmserve/triton"] = round(mean[("shmserve", m)]
                                                     / mean[("triton", m)], 2)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--elements", type=int, default=100, help="responses per request")
    p.add_argument("--servers", default="triton,shmserve")
    p.add_argument("--skip", action="append", default=[])
    p.add_argument("--ports", type=lambda t: [int(x) for x in t.split(",")],
                   default=[28460, 28461, 28462])
    p.add_argument("--log-dir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    servers = [s for s in args.servers.split(",") if s not in args.skip]
    if "triton" in servers and not os.path.exists(TRITON):
        sys.exit(f"{TRITON} not found: run ../shared/anchor/setup.sh, or --skip triton")
    args.log_dir = args.log_dir or tempfile.mkdtemp(prefix="bench-ensdec-")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ensdec-repo-") as tmp:
        repo = Path(tmp)
        write_repo(repo)
        for r in range(args.rounds):
            order = servers if r % 2 == 0 else servers[::-1]
            for model in MODELS:
                for kind in order:
                    row = measure(kind, model, repo, args)
                    row["round"] = r + 1
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    result = summary(rows, servers)
    print(json.dumps(result, indent=1))
    print(f"logs in {args.log_dir}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows,
                                               "summary": result}, indent=1))


if __name__ == "__main__":
    main()
