"""Scripts that run in processes of their own: scripts/bench_worker.py (a Worker sets
process-wide hooks, pb_utils' BLS) and scripts/cuda_host_parts.py (the fake CUDA
runtime's per-part host cost of a CUDA-region request)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_worker_answers_every_request_and_the_scheduler():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_worker.py"),
                          "--batch", "4", "--batches", "50", "--rounds", "2", "--check"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == 2
    for row in rows:
        # per batch: a response per request and one BatchDone
        assert row["requests"] == 200 and row["frames_out"] == 50 * 5
        assert 0 < row["cpu_us_per_request"] < 10_000


def test_cuda_host_parts_script_prints_every_part():
    """It runs and names each role's part, and the fake's apart."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "cuda_host_parts.py"),
                          "--number", "3", "--repeat", "2"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "SHMSERVE_FAKE_CUDA": "1"})
    assert out.returncode == 0, out.stderr
    for part in ("frontend: gRPC decode, tensors in CUDA regions",
                 "scheduler: built + regions resolved and released",
                 "worker: input view, output copy, batch wait", "fake cupy: copy"):
        assert part in out.stdout, out.stdout
    assert "'memcpy_async': 1, 'stream_synchronize': 1" in out.stdout
