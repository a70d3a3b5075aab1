#!/usr/bin/env python3
"""The worker alone: CPU microseconds per request of running batches of a python
model, in one process, with no sockets.

It drives the real pieces a worker runs for every batch: the msgspec decoder of its
inbox (ExecuteBatch frames as the scheduler sends them), the python backend's request
and response objects around the model's execute(), the outputs written inline or into
the arena, and the InferResponse and BatchDone frames encoded for the frontend and the
scheduler. What it leaves out is the socket reads and writes (one read per batch, one
write per frontend and one to the scheduler per batch), which scripts/bench's
per-process CPU figures include.

    .venv/bin/python scripts/bench_worker.py [--batch 8] [--batches 20000] [--rounds 3]
        [--model examples/model_repository/identity_fp32] [--shape 1,16]

`--instructions` counts the instructions a request costs instead of timing it (two
runs under valgrind's callgrind, `--batches` and four times as many, and their
difference; the median of `--rounds`), which a noisy machine's neighbours do not move.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import typing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import msgspec  # noqa: E402
import numpy as np  # noqa: E402

from scheduler.repository.config import config_to_json, load_config, normalize, validate  # noqa: E402
from shm.channel import _HEADER  # noqa: E402
from shm.messages.frontend import InferRequest  # noqa: E402
from shm.messages.results import InferResponse  # noqa: E402
from shm.messages.worker import WORKER_INBOX, ExecuteBatch, LoadInstance  # noqa: E402
from shm.tensor import TensorRef  # noqa: E402
from workers.main import Worker  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import callgrind_count  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(worker: Worker, model_dir: str) -> tuple[str, dict]:
    """Load the model's instance into `worker`: (its key, its config as JSON)."""
    config = normalize(load_config(model_dir), model_files=["model.py"])
    validate(config)
    name = os.path.basename(model_dir.rstrip("/"))
    msg = LoadInstance("bench/1/0", f"{name}_0", name, 1, model_dir,
                       json.dumps(config_to_json(config)).encode())
    worker.on_load(msg)
    thread = worker.threads.get(msg.instance)
    if thread is not None:  # its warmup runs there
        deadline = time.monotonic() + 60
        while not thread.idle():
            if time.monotonic() > deadline:
                raise RuntimeError("the instance did not load")
            time.sleep(0.01)
    if msg.instance not in worker.instances:
        raise RuntimeError(f"{name} did not load")
    return msg.instance, config_to_json(config)


def run(args) -> list[dict]:
    """One row per round; with `args.check`, also decodes the last batch's responses
    and fails unless every request got its input back."""
    shape = [int(x) for x in args.shape.split(",")]
    tmp = tempfile.mkdtemp(prefix="bench-worker-")
    model_dir = os.path.join(tmp, os.path.basename(args.model.rstrip("/")))
    shutil.copytree(args.model, model_dir)
    # its inbox socket in the temporary folder, which close() unlinks
    worker = Worker("bench", f"ipc://{tmp}/inbox", "bench-scheduler", f"bw{os.getpid()}",
                    64 << 20)
    sent = {"frames": 0, "last": []}

    def drop(address, frames, what):  # the frames are encoded; the write is left out
        sent["frames"] += len(frames)
        sent["last"] = frames
        return True

    worker.outbox._send = drop
    worker.response_outbox._send = drop
    rows = []
    # the instance thread's warmup answers the (absent) scheduler before its outbox is
    # patched: that one message is dropped on purpose
    logging.getLogger("shmserve.channel").setLevel(logging.ERROR)
    try:
        instance, config = load(worker, model_dir)
        for thread in worker.threads.values():  # an instance thread has its own outbox
            thread.outbox._send = drop
        data = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        refs = [TensorRef(i["name"], "FP32", shape, data=data.tobytes())
                for i in config.get("input", [])]
        encoder = msgspec.msgpack.Encoder()
        decoder = msgspec.msgpack.Decoder(typing.Union[WORKER_INBOX])  # as the inbox's
        frames = [encoder.encode(ExecuteBatch(b, instance, [
            InferRequest(b * args.batch + i, "bench-frontend", config["name"], 1, refs,
                         batch_size=shape[0]) for i in range(args.batch)]))
            for b in range(64)]
        for _ in range(args.rounds):
            sent["frames"] = 0
            cpu, wall = time.process_time(), time.perf_counter()
            for n in range(args.batches):
                worker.on_execute(decoder.decode(frames[n % 64]))
            thread = worker.threads.get(instance)
            while thread is not None and not thread.idle():
                time.sleep(0.001)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            requests = args.batches * args.batch
            rows.append({"model": config["name"], "batch": args.batch, "requests": requests,
                         "frames_out": sent["frames"],
                         "cpu_us_per_request": round(1e6 * cpu / requests, 2),
                         "wall_us_per_request": round(1e6 * wall / requests, 2)})
        if getattr(args, "check", False):
            responses = msgspec.msgpack.Decoder(InferResponse)
            for frame in sent["last"][:-1]:  # the last frame is the BatchDone
                response = responses.decode(frame[_HEADER.size:])
                assert not response.error, response.error
                out = response.outputs[0]
                got = np.frombuffer(out.data, dtype=np.float32).reshape(out.shape)
                np.testing.assert_array_equal(got, data)
    finally:
        worker.close()  # finalizes the instance, stops its thread, closes the sockets
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=os.path.join(ROOT, "examples", "model_repository",
                                                    "identity_fp32"))
    p.add_argument("--shape", default="1,16")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--batches", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--check", action="store_true",
                   help="check the last batch's responses against the input")
    p.add_argument("--instructions", action="store_true",
                   help="count instructions per request under callgrind")
    args = p.parse_args()
    if args.instructions:
        def argv(n: int) -> list[str]:
            return [os.path.abspath(__file__), "--model", args.model, "--shape", args.shape,
                    "--batch", str(args.batch), "--batches", str(n), "--rounds", "1"]
        print(callgrind_count.median_line(
            [callgrind_count.per_unit(argv, args.batches, 4 * args.batches,
                                      lambda n: n * args.batch)
             for _ in range(args.rounds)], "request"))
        return
    for row in run(args):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
