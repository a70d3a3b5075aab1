#!/usr/bin/env python3
"""A/B of a protocol's two transports, alternating. For each round and each mode,
start shmserve (examples/model_repository, one frontend) with that transport, run
scripts/bench (identity_fp32 [1,16], c=16, `--duration` s), then the C load generator
(HTTP: wrk, 64 connections; gRPC: h2load, 16 connections x 4 streams; the bodies of
scripts/bench_cclient.py) for `--duration` s, and print both runs' throughput and the
frontend process's CPU per request.

    scripts/frontend_ab.py --protocol http --rounds 3   # --http-frontend uvicorn,native
    scripts/frontend_ab.py --protocol grpc --rounds 3   # --grpc-frontend grpcio,native

On the 2-core VM, 3 rounds, frontend CPU per request:
- HTTP: scripts/bench c=16 107-110 us (uvicorn) vs 85-94 us (native); wrk 9.4k-12.0k
  req/s at 66-80 us (uvicorn) vs 15.8k-17.3k req/s at 44-47 us (native);
- gRPC: scripts/bench c=16 350-357 us (grpcio) vs 101-113 us (native); h2load 3.0k-3.4k
  req/s at 282-306 us (grpcio) vs 9.0k-14.0k req/s at 62-73 us (native).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_cclient import GRPC_PATH, parse_h2load, parse_wrk, write_inputs  # noqa: E402
from scheduler.bench.procs import cpu_seconds  # noqa: E402
from tests.e2e.harness import ServerProcess  # noqa: E402

REPO = ROOT / "examples" / "model_repository"
MODES = {"http": "uvicorn,native", "grpc": "grpcio,native"}


def frontend_pids(srv: ServerProcess, protocol: str) -> list[int]:
    port = srv.http_port if protocol == "http" else srv.grpc_port
    out = subprocess.run(["pgrep", "-f", f"frontend.main.*--{protocol}-port {port} "],
                         capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def load_command(protocol: str, srv: ServerProcess, seconds: int, files: dict) -> list:
    if protocol == "http":
        return ["wrk", "-t2", "-c64", f"-d{seconds}s", "--latency", "-s",
                str(files["lua"]), f"http://{srv.http_url}/v2/models/identity_fp32/infer"]
    return ["h2load", "-D", str(seconds), "-c", "16", "-m", "4", "-t", "1", "-d",
            str(files["grpc"]), "-H", "content-type: application/grpc", "-H",
            "te: trailers", f"http://{srv.grpc_url}{GRPC_PATH}"]


def run(protocol: str, mode: str, args, files: dict) -> None:
    srv = ServerProcess(REPO, f"--{protocol}-frontend", mode, frontends=1).start()
    try:
        url = srv.http_url if protocol == "http" else srv.grpc_url
        bench = subprocess.run(
            [str(ROOT / "scripts" / "bench"), "--url", url, "--protocol", protocol,
             "--model", "identity_fp32", "--shape", "1,16", "--concurrency", "16",
             "--duration", str(args.duration)], capture_output=True, text=True)
        lines = [line for line in (bench.stdout + bench.stderr).splitlines()
                 if line.strip()]
        print(f"--- {mode}: scripts/bench c=16", *lines[-args.bench_lines:], sep="\n  ")
        subprocess.run(load_command(protocol, srv, 1, files), capture_output=True)  # warm-up
        pids = frontend_pids(srv, protocol)
        c0 = sum(cpu_seconds(p) or 0.0 for p in pids)
        out = subprocess.run(load_command(protocol, srv, args.duration, files),
                             capture_output=True, text=True).stdout
        c1 = sum(cpu_seconds(p) or 0.0 for p in pids)
        row = (parse_wrk if protocol == "http" else parse_h2load)(out)
        n = row["requests"]
        tool = "wrk 64 connections" if protocol == "http" else "h2load 64 streams"
        print(f"--- {mode}: {tool}: {n / args.duration:.0f} req/s, failed "
              f"{row['failed']}, frontend CPU {1e6 * (c1 - c0) / max(n, 1):.1f} us/req",
              flush=True)
    finally:
        srv.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--protocol", choices=("http", "grpc"), default="http")
    p.add_argument("--modes", default=None, help="default: both transports of --protocol")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=int, default=5)
    p.add_argument("--bench-lines", type=int, default=8)
    args = p.parse_args()
    modes = (args.modes or MODES[args.protocol]).split(",")
    with tempfile.TemporaryDirectory(prefix="frontend-ab-") as tmp:
        files = write_inputs(Path(tmp), 16)
        for r in range(args.rounds):
            for mode in modes:
                print(f"=== round {r + 1} {args.protocol} {mode}", flush=True)
                run(args.protocol, mode, args, files)


if __name__ == "__main__":
    main()
