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

import asyncio
import statistics
import time
from pathlib import Path

import numpy as np

import benchkit

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
        benchkit.write_model(repo, name, config(name, state), MODEL_PY)


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
    log = Path(args.log_dir) / f"{kind}-{model}.log"
    with benchkit.Server(kind, repo, args.ports, log, check_ports=True) as server:
        base = 1_000_000 * round_
        asyncio.run(drive(server.grpc_url, model, args.sequences, 10, base))  # warm up
        cpu0, t0 = server.cpu(), time.perf_counter()
        cpu0["client"] = benchkit.own_cpu()
        lat = asyncio.run(drive(server.grpc_url, model, args.sequences, args.steps,
                                base + 10_000))
        seconds = time.perf_counter() - t0
        cpu1 = server.cpu()
        cpu1["client"] = benchkit.own_cpu()
    n = len(lat)
    lat.sort()
    return {"server": kind, "model": model, "round": round_,
            "sequences": args.sequences, "steps": args.steps,
            "steps_per_s": round(n / seconds, 1),
            "p50_ms": round(1e3 * statistics.median(lat), 2),
            "p99_ms": round(1e3 * lat[int(0.99 * (n - 1))], 2),
            **benchkit.cpu_columns(cpu0, cpu1, n)}


def main() -> None:
    p = benchkit.parser(__doc__)
    benchkit.add_common_args(p, [28730, 28731, 28732],
                             servers="triton,shmserve,shmserve-state")
    p.add_argument("--sequences", type=int, default=64)
    p.add_argument("--steps", type=int, default=100)
    args = benchkit.parse(p, "bench-sequence-")
    servers = benchkit.servers(args)
    rows = []
    with benchkit.repository("sequence-repo-", write_repo,
                             "shmserve-state" in servers) as repo:
        for r, order in benchkit.alternating(args.rounds, servers):
            for kind in order:
                # shmserve-state: shmserve on the implicit-state model
                model = "acc_state" if kind == "shmserve-state" else "acc"
                row = measure("shmserve" if kind == "shmserve-state" else kind, model,
                              repo, args, r)
                benchkit.record(rows, {**row, "server": kind})
    rate = benchkit.means(rows, "steps_per_s", "server")
    if ("triton",) in rate:
        for (kind,), value in rate.items():
            print(f"{kind}: {value:.0f} steps/s ({value / rate['triton',]:.2f}x triton)")
    benchkit.finish(args, rows)


if __name__ == "__main__":
    main()
