#!/usr/bin/env python3
"""Served vs raw: a small ONNX MLP through shmserve against onnxruntime in-process.

Builds the MLP (512 -> 2048 -> 512, batch up to 64) into a fresh model repository,
serves it with dynamic batching, drives it with scripts/bench over gRPC at the given
concurrency, and reads from the server's shutdown summary which batch sizes it formed.
Then it runs the same model in onnxruntime in this process, the same batches in the
same number and sizes, back to back, and prints requests/s of both and their ratio:
how much of the framework's own speed survives serving. Each round starts a fresh
server, so its batch sizes are its own; rounds alternate served and raw, which spreads a
shared machine's stalls over both.

It also reads the CPU time of every server process and of the client over the measured
window and prints it per request, beside the raw run's CPU time per request: a view of
where the time goes that stalls of the whole machine do not distort.

    scripts/bench_mlp --concurrency 16 --duration 10 --rounds 3
    scripts/bench_mlp --device gpu --shm cuda      # on a GPU machine: the model on CUDA,
                                                   # inputs and outputs in CUDA regions,
                                                   # raw side with IO binding on the device
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# one implementation of the process tree and CPU by role, shared with scripts/bench
from scheduler.bench.procs import cpu_by_role, process_tree  # noqa: E402,F401
from gpu_report import copies_from_log  # noqa: E402

CONFIG = """
name: "mlp"
platform: "onnxruntime_onnx"
max_batch_size: 64
dynamic_batching {{ max_queue_delay_microseconds: {delay} }}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 512 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 512 ] }} ]
instance_group [ {{ count: {count} kind: {kind} }} ]
"""


def build(repo: Path, args) -> None:
    from tests import onnx_models
    kind = "KIND_GPU" if args.device == "gpu" else "KIND_CPU"
    onnx_models.mlp(repo / "mlp", config=CONFIG.format(delay=args.delay_us,
                                                        count=args.instances, kind=kind))


def wait_ready(port: int, proc, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready",
                                        timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError("server not ready")


def run_bench(bench_args: list[str], warmup: float, duration: float, sample):
    """Run scripts/bench with `bench_args` for `duration` seconds after `warmup`, calling
    `sample(client)` (client: its Popen) at the start and at the end of the inner part
    of the measured window, which the client reaches after starting its processes and
    warming up and leaves before tearing down. Returns (bench's row, seconds between the
    two samples, first sample, second sample)."""
    folder = Path(tempfile.mkdtemp(prefix="bench-"))
    out, window_file = folder / "bench.json", folder / "window.json"
    client = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "bench.py"), *bench_args, "--duration",
         str(duration), "--warmup", str(warmup), "--json", str(out),
         "--window-file", str(window_file)],
        cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        # the client says when its measured window opens and closes (its processes
        # may take seconds to start on a busy machine): sample inside it
        while not window_file.exists():
            if client.poll() is not None:
                raise RuntimeError(f"scripts/bench exited with {client.returncode}")
            time.sleep(0.05)
        window = json.loads(window_file.read_text())
        margin = min(1.0, duration / 4)
        time.sleep(max(window["start"] + margin - time.monotonic(), 0.0))
        t0, first = time.monotonic(), sample(client)
        time.sleep(max(window["end"] - margin - time.monotonic(), 0.0))
        t1, second = time.monotonic(), sample(client)
    finally:
        if client.wait() != 0:
            raise RuntimeError(f"scripts/bench exited with {client.returncode}")
    return json.loads(out.read_text())["rows"][0], t1 - t0, first, second


def served(repo: Path, args) -> tuple[dict, dict[int, int], dict[str, float], dict]:
    """(bench row, {batch size: batches}, {role: CPU ms per request}, the bytes the
    model's workers copied by kind) from one served run; a fresh server each time."""
    log_path = Path(tempfile.mkdtemp(prefix="bench-mlp-")) / "server.log"
    http, grpc, metrics = args.ports
    cmd = [sys.executable, "-m", "scheduler.main", "--model-repository", str(repo),
           "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
           "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
           "--allow-client-shm=true"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_ready(http, proc)
        pids: list[int] = []

        def sample(client):
            if not pids:
                pids.extend(process_tree(proc.pid) + process_tree(client.pid))
            return cpu_by_role(pids)

        row, seconds, cpu0, cpu1 = run_bench(
            ["--url", f"127.0.0.1:{grpc}", "--protocol", "grpc", "--model", "mlp",
             "--shape", "1,512", "--concurrency", str(args.concurrency), "--shm", args.shm,
             "--client-processes", str(args.client_processes), "--no-verify"],
            args.warmup, args.duration, sample)
        requests = row["throughput"] * seconds
        cpu_ms = {role: 1e3 * (cpu1[role] - cpu0.get(role, 0.0)) / requests
                  for role in cpu1} if requests else {}
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    text = log_path.read_text()
    m = re.search(r"model 'mlp' version 1: (\d+) rows in (\d+) batches; batch sizes \{([^}]*)\}",
                  text)
    if m is None:
        raise RuntimeError(f"no batch summary in the server log {log_path}")
    sizes = {int(k): int(v) for k, v in (p.split(":") for p in m.group(3).split(", ") if p)}
    copies = copies_from_log(text).get("mlp", {})
    return row, sizes, cpu_ms, {k: copies.get(k) for k in ("host", "h2d", "d2h", "d2d")}


def raw(repo: Path, sizes: dict[int, int], args) -> tuple[float, float]:
    """(wall seconds, CPU seconds) onnxruntime in this process takes for the same
    batches. On the GPU the inputs already lie on the device and the outputs stay there
    (IO binding, buffers allocated once), as a tuned application would run it."""
    import onnxruntime as ort
    path = str(repo / "mlp" / "1" / "model.onnx")
    rng = np.random.default_rng(0)
    inputs = {b: rng.standard_normal((b, 512)).astype(np.float32) for b in sizes}
    if args.device == "gpu":
        from workers.onnx_backend import preload_cuda_libraries
        preload_cuda_libraries()  # as the server's onnxruntime backend does
        sess = ort.InferenceSession(path, providers=["CUDAExecutionProvider"])
        if "CUDAExecutionProvider" not in sess.get_providers():
            raise RuntimeError("onnxruntime has no CUDA provider here (onnxruntime-gpu?)")
        bindings = {}
        for b, x in inputs.items():
            binding = sess.io_binding()
            binding.bind_ortvalue_input(
                "INPUT0", ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0))
            binding.bind_ortvalue_output("OUTPUT0", ort.OrtValue.ortvalue_from_shape_and_type(
                [b, 512], np.float32, "cuda", 0))
            bindings[b] = binding

        def step(b):
            sess.run_with_iobinding(bindings[b])
    else:
        # the session options the server's onnxruntime backend uses by default
        opts = ort.SessionOptions()
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        feeds = {b: {"INPUT0": x} for b, x in inputs.items()}

        def step(b):
            sess.run(None, feeds[b])
    for b in inputs:  # warm up every shape once
        step(b)
    wall, cpu = time.perf_counter(), time.process_time()
    for b, n in sizes.items():
        for _ in range(n):
            step(b)
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--client-processes", type=int, default=1,
                   help="client processes sharing the concurrency; one Python client "
                        "tops out near 7k requests/s, below a GPU model's rate")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--delay-us", type=int, default=500,
                   help="max_queue_delay_microseconds of the dynamic batcher")
    p.add_argument("--instances", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--shm", choices=["none", "system", "cuda"], default="none")
    p.add_argument("--rounds", type=int, default=1,
                   help="served-then-raw rounds, each with a fresh server")
    p.add_argument("--ports", type=lambda t: [int(x) for x in t.split(",")],
                   default=[28300, 28301, 28302])
    p.add_argument("--json", default=None)
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="mlp-repo-") as tmp:
        repo = Path(tmp)
        build(repo, args)
        for r in range(args.rounds):
            row, sizes, cpu_ms, copies = served(repo, args)
            requests = sum(b * n for b, n in sizes.items())
            wall, cpu = raw(repo, sizes, args)
            result = {"sizes": dict(sorted(sizes.items())), "served": row,
                      "raw_infer_per_s": requests / wall,
                      "ratio": row["throughput"] / (requests / wall),
                      "served_cpu_ms_per_request": cpu_ms, "copies": copies,
                      "raw_cpu_ms_per_request": 1e3 * cpu / requests}
            results.append(result)
            report(r, result, args)
    ratios = sorted(x["ratio"] for x in results)
    print(f"served / raw over {len(ratios)} round(s): median {ratios[len(ratios) // 2]:.2f}, "
          f"range {ratios[0]:.2f}-{ratios[-1]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "args": vars(args), "rounds": results, "machine": os.uname().nodename,
            "cpus": os.cpu_count()}, indent=1))


def report(r: int, x: dict, args) -> None:
    row = x["served"]
    print(f"round {r + 1}: batch sizes the server formed: {x['sizes']}")
    print(f"  served: {row['throughput']:.1f} infer/s (p50 {row['p50_ms']:.2f} ms) at "
          f"concurrency {args.concurrency}, {args.shm} shm, model on {args.device}")
    print(f"  raw onnxruntime, same batches: {x['raw_infer_per_s']:.1f} infer/s")
    print(f"  served / raw: {x['ratio']:.2f}")
    print("  bytes the server copied: " + ", ".join(f"{k} {v}" for k, v in x["copies"].items()))
    cpu = x["served_cpu_ms_per_request"]
    parts = ", ".join(f"{role} {ms:.2f}" for role, ms in sorted(cpu.items()))
    server = sum(ms for role, ms in cpu.items() if role != "client")
    print(f"  CPU ms per request: {parts}; server {server:.2f} against raw "
          f"{x['raw_cpu_ms_per_request']:.2f}")


if __name__ == "__main__":
    main()
