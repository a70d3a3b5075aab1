#!/usr/bin/env python3
"""How many frontend processes (issue 23, part 4): shmserve with 1, 2, 4, 8 and 16
frontends (those up to this machine's CPUs), beside the real Triton, under the C
clients (wrk over HTTP, h2load over gRPC) and under tritonclient (scripts/bench at
--concurrency over --client-processes, both protocols), in alternating rounds. Every
row carries the server's CPU per request by role.

It ends with what a default rule needs: per load, the best frontend count and the
smallest count within --tolerance of its throughput, and Triton's figures beside them.

    scripts/frontends_sweep.py [--frontends 1,2,4,8,16] [--rounds 1] [--duration 4]
        [--concurrency 64] [--client-processes 4] [--json PATH]
    source .device/on_device.sh && python3 scripts/frontends_sweep.py --json $OUT/fe.json

The model is the anchor's identity_fp32 ([1,16] FP32, dynamic batching, two CPU
instances), as in scripts/bench_cclient.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_cclient  # noqa: E402
import benchkit  # noqa: E402
from bench_mlp import run_bench  # noqa: E402

MODEL = bench_cclient.MODEL


def counts_here(asked: list[int], cpus: int) -> list[int]:
    """The frontend counts worth measuring on `cpus` CPUs: those asked, none above
    the CPUs (a frontend more than there are CPUs only waits for one)."""
    return sorted({n for n in asked if 1 <= n <= cpus}) or [1]


def choose(rows: list[dict], tolerance: float) -> dict[str, dict]:
    """Per load: shmserve's mean throughput per frontend count, the best count, the
    smallest count within `tolerance` of the best (the cheaper choice when the
    difference is noise), and Triton's mean where it was measured."""
    out: dict[str, dict] = {}
    for load in sorted({r["load"] for r in rows}):
        mine: dict[int, list[float]] = {}
        triton = [r["infer_per_s"] for r in rows
                  if r["load"] == load and r["server"] == "triton" and not r.get("error")]
        for r in rows:
            if r["load"] == load and r["server"] == "shmserve" and not r.get("error"):
                mine.setdefault(r["frontends"], []).append(r["infer_per_s"])
        if not mine:
            continue
        means = {n: statistics.mean(v) for n, v in sorted(mine.items())}
        best = max(means, key=means.get)
        good = min(n for n, v in means.items() if v >= (1 - tolerance) * means[best])
        out[load] = {"infer_per_s": means, "best": best, "chosen": good,
                     "triton_infer_per_s": statistics.mean(triton) if triton else None}
    return out


def format_choice(choice: dict[str, dict]) -> str:
    lines = [f"{'load':>12} {'best':>5} {'chosen':>7} {'triton/s':>9}  shmserve infer/s "
             "by frontends"]
    for load, c in choice.items():
        by_n = ", ".join(f"{n}: {v:.0f}" for n, v in c["infer_per_s"].items())
        triton = f"{c['triton_infer_per_s']:.0f}" if c["triton_infer_per_s"] else "-"
        lines.append(f"{load:>12} {c['best']:>5} {c['chosen']:>7} {triton:>9}  {by_n}")
    return "\n".join(lines)


def measure_server(srv: benchkit.Server, frontends: int | None, args, files,
                   protocols: list[str]) -> list[dict]:
    """Every load against one started server: the C tools, then tritonclient."""
    rows = []
    tool_args = argparse.Namespace(
        warmup=args.warmup, duration=args.duration, connections=args.connections,
        wrk_threads=args.tool_threads, h2_connections=args.h2_connections,
        h2_streams=args.h2_streams, h2_threads=args.tool_threads, verbose=False)
    for protocol, tool in (("http", "wrk"), ("grpc", "h2load")):
        if protocol not in protocols or shutil.which(tool) is None:
            continue
        row = bench_cclient.measure(srv, protocol, tool_args, files)
        row.update(load=tool, frontends=frontends)
        rows.append(row)
    for protocol in protocols:
        port = srv.ports[0] if protocol == "http" else srv.ports[1]
        bench_args = ["-u", f"127.0.0.1:{port}", "-i", protocol, "-m", MODEL,
                      "--shape", "1,16", "--concurrency", str(args.concurrency),
                      "--client-processes", str(args.client_processes)]
        try:
            got, seconds, cpu0, cpu1 = run_bench(bench_args, args.warmup, args.duration,
                                                 srv.bench_sampler())
        except RuntimeError as exc:  # a failed client is a row, not the end of the run
            rows.append({"server": srv.kind, "load": f"{protocol} c={args.concurrency}",
                         "frontends": frontends, "infer_per_s": 0.0, "error": str(exc)})
            continue
        rate = got["throughput"]
        row = {"server": srv.kind, "load": f"{protocol} c={args.concurrency}",
               "frontends": frontends, "infer_per_s": rate, "p50_ms": got.get("p50_ms")}
        row.update(benchkit.cpu_columns(cpu0, cpu1, rate * seconds))
        rows.append(row)
    return rows


def main() -> int:
    p = benchkit.parser(__doc__)
    benchkit.add_common_args(p, [18430, 18431, 18432], duration=4.0, warmup=1.0,
                             servers="shmserve,triton", rounds=1)
    p.add_argument("--frontends", type=lambda t: [int(x) for x in t.split(",")],
                   default=[1, 2, 4, 8, 16])
    p.add_argument("--protocols", default="http,grpc")
    p.add_argument("--concurrency", type=int, default=64,
                   help="tritonclient's requests in flight, over --client-processes")
    p.add_argument("--client-processes", type=int, default=4)
    p.add_argument("--connections", type=int, default=64, help="wrk's connections")
    p.add_argument("--h2-connections", type=int, default=16)
    p.add_argument("--h2-streams", type=int, default=4)
    p.add_argument("--tool-threads", type=int, default=None,
                   help="wrk's and h2load's threads (default: a quarter of the CPUs)")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="a smaller count within this share of the best is chosen")
    args = benchkit.parse(p, "frontends-sweep-")
    cpus = len(os.sched_getaffinity(0))
    args.tool_threads = args.tool_threads or max(1, cpus // 4)
    counts = counts_here(args.frontends, cpus)
    protocols = args.protocols.split(",")
    kinds = benchkit.servers(args)
    # one item per server configuration: Triton once a round, shmserve per count
    configs = [("triton", None)] if "triton" in kinds else []
    configs += [("shmserve", n) for n in counts] if "shmserve" in kinds else []
    print(f"# {cpus} CPUs; shmserve frontends {counts}; loads: wrk, h2load, tritonclient "
          f"c={args.concurrency} over {args.client_processes} processes", flush=True)
    rows: list[dict] = []
    with benchkit.repository("frontends-sweep-repo-", benchkit.write_model, MODEL,
                             benchkit.ANCHOR_IDENTITY_CONFIG, benchkit.IDENTITY_PY) as repo, \
            tempfile.TemporaryDirectory(prefix="frontends-sweep-") as tmp:
        files = bench_cclient.write_inputs(Path(tmp), 16)
        for rnd, order in benchkit.alternating(args.rounds, configs):
            for kind, n in order:
                extra = ["--frontend-processes", str(n)] if n else []
                log = Path(args.log_dir) / f"{kind}-{n or 0}.log"
                with benchkit.Server(kind, repo, args.ports, log, extra,
                                     check_ports=True) as srv:
                    bench_cclient.check_http(args.ports[0], files["body"],
                                             files["header_len"], 16)
                    bench_cclient.check_grpc(args.ports[1], files["message"], 16)
                    for row in measure_server(srv, n, args, files, protocols):
                        row["round"] = rnd
                        benchkit.record(rows, row)
    choice = choose(rows, args.tolerance)
    print()
    print(format_choice(choice))
    benchkit.finish(args, rows + [{"choice": {k: {**v, "infer_per_s": {
        str(n): r for n, r in v["infer_per_s"].items()}} for k, v in choice.items()}}])
    return 0


if __name__ == "__main__":
    sys.exit(main())
