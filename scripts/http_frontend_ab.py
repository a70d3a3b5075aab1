#!/usr/bin/env python3
"""A/B of the HTTP/1.1 transports, alternating: for each round and each of
`--modes` (uvicorn, native), start shmserve (examples/model_repository, one frontend)
with that --http-frontend, run scripts/bench (http, identity_fp32 [1,16], c=16, 5 s),
then wrk (64 connections, the body of scripts/bench_cclient.py) for 5 s, and print
both runs' throughput and the frontend process's CPU per request.

    scripts/http_frontend_ab.py --rounds 3

On the 2-core VM, 3 rounds: scripts/bench c=16 5206-5302 infer/s, frontend 107-110 us
per request (uvicorn) vs 5236-5968 infer/s, 85-94 us (native); wrk 9441-11959 req/s,
66-80 us (uvicorn) vs 15788-17319 req/s, 44-47 us (native).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_cclient import parse_wrk, write_inputs  # noqa: E402
from tests.e2e.harness import ServerProcess  # noqa: E402

REPO = ROOT / "examples" / "model_repository"


def cpu_of(pids) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def frontend_pids(srv) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"frontend.main.*--http-port {srv.http_port} "],
                         capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def run(mode: str, args, lua: Path) -> None:
    srv = ServerProcess(REPO, "--http-frontend", mode, frontends=1).start()
    try:
        bench = subprocess.run(
            [str(ROOT / "scripts" / "bench"), "--url", srv.http_url, "--protocol", "http",
             "--model", "identity_fp32", "--shape", "1,16", "--concurrency", "16",
             "--duration", str(args.duration)], capture_output=True, text=True)
        lines = [line for line in (bench.stdout + bench.stderr).splitlines()
                 if line.strip()]
        print(f"--- {mode}: scripts/bench c=16", *lines[-args.bench_lines:], sep="\n  ")
        url = f"http://{srv.http_url}/v2/models/identity_fp32/infer"
        wrk = ["wrk", "-t2", "-c64", "-s", str(lua)]
        subprocess.run([*wrk, "-d1s", url], capture_output=True)  # warm-up
        pids = frontend_pids(srv)
        c0 = cpu_of(pids)
        out = subprocess.run([*wrk, f"-d{args.duration}s", "--latency", url],
                             capture_output=True, text=True).stdout
        c1 = cpu_of(pids)
        row = parse_wrk(out)
        n = row["requests"]
        print(f"--- {mode}: wrk 64 connections: {n / args.duration:.0f} req/s, "
              f"failed {row['failed']}, p50 {row['p50']}, frontend CPU "
              f"{1e6 * (c1 - c0) / max(n, 1):.1f} us/req", flush=True)
    finally:
        srv.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="uvicorn,native")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=int, default=5)
    p.add_argument("--bench-lines", type=int, default=8)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="http-ab-") as tmp:
        lua = write_inputs(Path(tmp), 16)["lua"]
        for r in range(args.rounds):
            for mode in args.modes.split(","):
                print(f"=== round {r + 1} {mode}", flush=True)
                run(mode, args, lua)


if __name__ == "__main__":
    main()
