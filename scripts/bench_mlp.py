#!/usr/bin/env python3
"""Served vs raw: a small ONNX MLP through shmserve against onnxruntime in-process.

Builds the MLP (512 -> 2048 -> 512, batch up to 64) into a fresh model repository,
serves it with dynamic batching, drives it with scripts/bench over gRPC at the given
concurrency, and reads from the server's shutdown summary which batch sizes it formed.
Then it runs the same model in onnxruntime in this process, the same batches in the
same number and sizes, back to back, and prints requests/s of both and their ratio:
how much of the framework's own speed survives serving.

    scripts/bench_mlp --concurrency 16 --duration 10
    scripts/bench_mlp --device gpu                  # the model on CUDA (a GPU machine)
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


def served(repo: Path, args) -> tuple[dict, dict[int, int]]:
    """(bench row, {batch size: batches}) from one served run."""
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
        out = Path(log_path.parent / "bench.json")
        subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"),
                        "--url", f"127.0.0.1:{grpc}", "--protocol", "grpc", "--model", "mlp",
                        "--shape", "1,512", "--concurrency", str(args.concurrency),
                        "--duration", str(args.duration), "--warmup", str(args.warmup),
                        "--shm", args.shm, "--no-verify", "--json", str(out)],
                       check=True, cwd=ROOT)
        row = json.loads(out.read_text())["rows"][0]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    text = log_path.read_text()
    m = re.search(r"model 'mlp' version 1: (\d+) rows in (\d+) batches; batch sizes \{([^}]*)\}",
                  text)
    if m is None:
        raise RuntimeError(f"no batch summary in the server log {log_path}")
    sizes = {int(k): int(v) for k, v in (p.split(":") for p in m.group(3).split(", ") if p)}
    return row, sizes


def raw(repo: Path, sizes: dict[int, int], args) -> float:
    """Seconds onnxruntime in-process takes for the same batches."""
    import onnxruntime as ort
    providers = (["CUDAExecutionProvider"] if args.device == "gpu"
                 else ["CPUExecutionProvider"])
    sess = ort.InferenceSession(str(repo / "mlp" / "1" / "model.onnx"), providers=providers)
    rng = np.random.default_rng(0)
    inputs = {b: rng.standard_normal((b, 512)).astype(np.float32) for b in sizes}
    for b in inputs:  # warm up every shape once
        sess.run(None, {"INPUT0": inputs[b]})
    start = time.perf_counter()
    for b, n in sizes.items():
        x = {"INPUT0": inputs[b]}
        for _ in range(n):
            sess.run(None, x)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--delay-us", type=int, default=500,
                   help="max_queue_delay_microseconds of the dynamic batcher")
    p.add_argument("--instances", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--shm", choices=["none", "system"], default="none")
    p.add_argument("--ports", type=lambda t: [int(x) for x in t.split(",")],
                   default=[28300, 28301, 28302])
    p.add_argument("--json", default=None)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlp-repo-") as tmp:
        repo = Path(tmp)
        build(repo, args)
        row, sizes = served(repo, args)
        rows = sum(b * n for b, n in sizes.items())
        seconds = raw(repo, sizes, args)
    raw_rate = rows / seconds
    served_rate = row["throughput"]
    print(f"batch sizes the server formed: {dict(sorted(sizes.items()))}")
    print(f"served: {served_rate:.1f} infer/s (p50 {row['p50_ms']:.2f} ms) at concurrency "
          f"{args.concurrency}, {args.shm} shm")
    print(f"raw onnxruntime, same batches: {raw_rate:.1f} infer/s")
    print(f"served / raw: {served_rate / raw_rate:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "sizes": sizes, "served": row, "raw_infer_per_s": raw_rate,
            "ratio": served_rate / raw_rate, "machine": os.uname().nodename}, indent=1))


if __name__ == "__main__":
    main()
