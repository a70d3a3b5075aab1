#!/usr/bin/env python3
"""Sequence throughput, measured: 64 concurrent sequences of 100 steps against a python
accumulator, shmserve against the real Triton in one run, alternating servers every
round.

The models (written into a fresh repository every server loads):
- acc: a python accumulator that keeps each sequence's sum itself, keyed by the
  request's correlation id (what a python model must do on Triton, whose python
  backend hands state inputs in but keeps no state outputs); sequence_batching direct,
  max_batch_size 32, two instances, so all 64 sequences hold a slot at once;
- acc_state (shmserve only): the same accumulator with implicit state (ACC_IN /
  ACC_OUT) kept by the worker per slot.

The client is tritonclient.grpc.aio in this process: one coroutine per sequence, each
sending its steps one after the other (START on the first, END on the last) and
checking every running sum. Beside steps/s and latency it prints the CPU time of every
server process by role (and the client's) per request over the measured pass.

    scripts/bench_sequence.py --rounds 2
    scripts/bench_sequence.py --skip triton          # without the anchor
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_batching import TRITON, roles, server_command  # noqa: E402
from bench_mlp import process_tree, wait_ready  # noqa: E402

MODEL_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils

END = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END


def _flag(request, name):
    return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().flat[0])


class TritonPythonModel:
    """OUTPUT = the sequence's running sum of INPUT; fillers (READY 0) answer zeros."""

    def initialize(self, args):
        self.sums = {}
        self.implicit = "acc_state" in args["model_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            if not _flag(request, "READY"):
                total = np.zeros_like(x)
            elif self.implicit:
                total = pb_utils.get_input_tensor_by_name(request, "ACC_IN").as_numpy() + x
            else:
                cid = request.correlation_id()
                base = 0 if _flag(request, "START") else self.sums.get(cid, 0)
                total = base + x
                if request.flags() & END:
                    self.sums.pop(cid, None)
                else:
                    self.sums[cid] = total
            tensors = [pb_utils.Tensor("OUTPUT", total.astype(np.int32))]
            if self.implicit:
                tensors.append(pb_utils.Tensor("ACC_OUT", total.astype(np.int32)))
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses
'''


def config(name: str, state: bool) -> str:
    text = f"""name: "{name}"
backend: "python"
max_batch_size: 32
sequence_batching {{
  direct {{ }}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }}
  ]
"""
    if state:
        text += """  state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32
            dims: [ 1 ] } ]
"""
    return text + """}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""


def write_repo(repo: Path, with_state: bool) -> None:
    models = {"acc": False, **({"acc_state": True} if with_state else {})}
    for name, state in models.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config(name, state))
        (repo / name / "1" / "model.py").write_text(MODEL_PY)


async def drive(url: str, model: str, sequences: int, steps: int, base: int):
    """`sequences` coroutines of `steps` steps; returns each step's latency (s)."""
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    latencies: list[float] = []

    async def one(i: int) -> None:
        corrid = base + i
        want = 0
        for k in range(steps):
            value = i + k
            want += value
            inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            inp.set_data_from_numpy(np.array([[value]], dtype=np.int32))
            t0 = time.perf_counter()
            r = await client.infer(model, [inp], sequence_id=corrid,
                                   sequence_start=k == 0, sequence_end=k == steps - 1)
            latencies.append(time.perf_counter() - t0)
            got = int(r.as_numpy("OUTPUT").flat[0])
            if got != want:
                raise RuntimeError(f"sequence {corrid} step {k}: sum {got}, want {want}")

    try:
        await asyncio.gather(*(one(i) for i in range(sequences)))
    finally:
        await client.close()
    return latencies


def measure(kind: str, model: str, repo: Path, args, round_: int) -> dict:
    ports = args.ports
    for port in ports:  # another server there would answer in this one's place
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                raise SystemExit(f"port {port} is taken: pass other --ports")
    log = open(Path(args.log_dir) / f"{kind}-{model}.log", "ab")
    # not from the repository root for Triton: its python stub would import our
    # triton_python_backend_utils.py from there instead of its own
    cwd = ROOT if kind.startswith("shmserve") else repo
    proc = subprocess.Popen(server_command(kind, repo, ports), cwd=cwd, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"127.0.0.1:{ports[1]}"
    try:
        wait_ready(ports[0], proc, 180)
        base = 1_000_000 * round_
        asyncio.run(drive(url, model, args.sequences, 10, base))  # warm up
        pids = process_tree(proc.pid)
        cpu0, self0, t0 = roles(pids), resource.getrusage(resource.RUSAGE_SELF), \
            time.perf_counter()
        lat = asyncio.run(drive(url, model, args.sequences, args.steps, base + 10_000))
        seconds = time.perf_counter() - t0
        cpu1, self1 = roles(pids), resource.getrusage(resource.RUSAGE_SELF)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    n = len(lat)
    cpu_us = {role: round(1e6 * (cpu1[role] - cpu0.get(role, 0.0)) / n, 1) for role in cpu1}
    cpu_us["client"] = round(1e6 * ((self1.ru_utime + self1.ru_stime)
                                    - (self0.ru_utime + self0.ru_stime)) / n, 1)
    lat.sort()
    return {"server": kind, "model": model, "round": round_,
            "sequences": args.sequences, "steps": args.steps,
            "steps_per_s": round(n / seconds, 1),
            "p50_ms": round(1e3 * statistics.median(lat), 2),
            "p99_ms": round(1e3 * lat[int(0.99 * (n - 1))], 2),
            "cpu_us_per_request": cpu_us,
            "server_cpu_us_per_request": round(sum(v for k, v in cpu_us.items()
                                                   if k != "client"), 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--sequences", type=int, default=64)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--servers", default="triton,shmserve,shmserve-state")
    p.add_argument("--skip", action="append", default=[])
    p.add_argument("--ports", type=lambda t: [int(x) for x in t.split(",")],
                   default=[28730, 28731, 28732])
    p.add_argument("--log-dir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    servers = [s for s in args.servers.split(",") if s not in args.skip]
    if "triton" in servers and not os.path.exists(TRITON):
        sys.exit(f"{TRITON} not found: run ../shared/anchor/setup.sh, or --skip triton")
    args.log_dir = args.log_dir or tempfile.mkdtemp(prefix="bench-sequence-")
    rows = []
    with tempfile.TemporaryDirectory(prefix="sequence-repo-") as tmp:
        repo = Path(tmp)
        write_repo(repo, with_state="shmserve-state" in servers)
        for r in range(args.rounds):
            # alternate the order every round so the machine's drift spreads over all
            order = servers if r % 2 == 0 else servers[::-1]
            for kind in order:
                # shmserve-state: shmserve on the implicit-state model
                model = "acc_state" if kind == "shmserve-state" else "acc"
                row = measure("shmserve" if kind == "shmserve-state" else kind, model,
                              repo, args, r + 1)
                row["server"] = kind
                rows.append(row)
                print(json.dumps(row), flush=True)
    by = {}
    for row in rows:
        by.setdefault(row["server"], []).append(row["steps_per_s"])
    if "triton" in by:
        base = statistics.mean(by["triton"])
        for kind, values in by.items():
            print(f"{kind}: {statistics.mean(values):.0f} steps/s "
                  f"({statistics.mean(values) / base:.2f}x triton)")
    print(f"logs in {args.log_dir}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
