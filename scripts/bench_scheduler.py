#!/usr/bin/env python3
"""The scheduler alone: requests per second through decode -> enqueue -> batch ->
dispatch -> BatchDone -> statistics, in one process, with no model and no sockets.

It drives the real pieces the scheduler process runs for every request: the msgspec
decoder of its inbox (InferRequest frames as frontends send them), the model's
DynamicBatchScheduler with the shared RateLimiter, the encoder of ExecuteBatch frames
to workers, and BatchDone decoding with statistics. What it leaves out is the socket
reads and writes, which scripts/bench's per-process CPU figures include.

    .venv/bin/python scripts/bench_scheduler.py [--requests 200000] [--burst 16]
        [--max-batch 8] [--instances 2] [--delay-us 0] [--no-histograms] [--rounds 3]

`--burst` requests arrive in one read of the inbox (the loop pumps once per burst, as
the server does after each burst); with two instances and bursts of 16, batches are 8.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import msgspec  # noqa: E402
from tritonclient.grpc import model_config_pb2  # noqa: E402

from scheduler.scheduling.dynamic_scheduler import DynamicBatchScheduler  # noqa: E402
from scheduler.scheduling.queued import Queued  # noqa: E402
from scheduler.scheduling.rate_limiter import InstanceSlot, RateLimiter  # noqa: E402
from shm.channel import _frame, _union  # noqa: E402
from shm.messages.frontend import InferRequest  # noqa: E402
from shm.messages.scheduler import SCHEDULER_INBOX  # noqa: E402
from shm.messages.worker import BatchDone  # noqa: E402
from shm.tensor import TensorRef  # noqa: E402


def model_config(max_batch: int, delay_us: int) -> model_config_pb2.ModelConfig:
    cfg = model_config_pb2.ModelConfig(name="identity", max_batch_size=max_batch)
    cfg.input.add(name="INPUT0", data_type=model_config_pb2.TYPE_FP32, dims=[16])
    cfg.output.add(name="OUTPUT0", data_type=model_config_pb2.TYPE_FP32, dims=[16])
    cfg.dynamic_batching.max_queue_delay_microseconds = delay_us
    return cfg


def request_frames(n: int) -> list[bytes]:
    """InferRequest messages as a frontend encodes them ([1,16] FP32 inline)."""
    body = bytes(64)
    return [_frame(InferRequest(i, "/run/fe0.sock", "identity", 0,
                                [TensorRef("INPUT0", "FP32", [1, 16], data=body)],
                                batch_size=1, start_ns=time.monotonic_ns()))[4:]
            for i in range(n)]


def run(args) -> dict:
    decode = msgspec.msgpack.Decoder(_union(SCHEDULER_INBOX)).decode
    limiter = RateLimiter()
    sent: list = []
    sched = DynamicBatchScheduler(
        "identity", 1, model_config(args.max_batch, args.delay_us), limiter,
        types.SimpleNamespace(  # the loop's Callbacks, as far as the scheduler uses them
            send_batch=lambda slot, batch, requests: sent.append(_frame(batch)),  # as the outbox does
            fail=lambda req, code, why: None, respond=None, pump_soon=set().add,
            wake=lambda sched: None),
        histograms=not args.no_histograms, environ={})
    slots = [InstanceSlot(f"identity/1/identity_0_{i}#1", f"identity_0_{i}", "KIND_CPU", 0)
             for i in range(args.instances)]
    for slot in slots:
        limiter.add(sched, slot)
    frames = request_frames(args.requests)
    batch_sizes: dict[int, int] = {}

    def finish_running():
        # every dispatched batch comes back as a BatchDone frame from its worker
        for slot in slots:
            if slot.batch is None:
                continue
            t = time.monotonic_ns()
            done = decode(_frame(BatchDone(slot.batch, slot.key, t, t, t, t))[4:])
            requests, _ = sched.batch_done(done, t)
            batch_sizes[len(requests)] = batch_sizes.get(len(requests), 0) + 1

    cpu0, wall0 = time.process_time(), time.perf_counter()
    for start in range(0, len(frames), args.burst):
        now = time.monotonic_ns()
        for frame in frames[start:start + args.burst]:
            sched.enqueue(Queued(decode(frame)), now)  # as the loop's on_infer does
        sched.pump(time.monotonic_ns())
        finish_running()
        sched.pump(time.monotonic_ns())  # the freed instances take what is left
        finish_running()
    while sched.pending:
        sched.pump(time.monotonic_ns() + args.delay_us * 1000)
        finish_running()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    assert sched.stats.success_count == args.requests, sched.stats.success_count
    return {"requests": args.requests, "wall_s": round(wall, 3),
            "requests_per_s": round(args.requests / wall),
            "cpu_us_per_request": round(cpu / args.requests * 1e6, 2),
            "batch_sizes": dict(sorted(batch_sizes.items())),
            # what the scheduler sends workers: ExecuteBatch frames, per request
            "execute_bytes_per_request": round(sum(map(len, sent)) / args.requests, 1),
            "histograms": not args.no_histograms}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=200_000)
    p.add_argument("--burst", type=int, default=16)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--delay-us", type=int, default=0)
    p.add_argument("--no-histograms", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    for _ in range(args.rounds):
        print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
