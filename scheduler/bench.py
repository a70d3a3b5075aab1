#!/usr/bin/env python3
"""Closed-loop load generator for any server that speaks Triton's protocols.

Each point of the sweep runs `c` concurrent streams; a stream sends its next request as
soon as the previous one answered. The client is the same for every server (tritonclient,
one technique per protocol, chosen by measurement below), so numbers from two servers
measured with this script can be compared. It is a client, not part of the server: it
sits in this package only so that installing shmserve gives it as `shmserve-bench`
(`scripts/bench` runs the same main).

    shmserve-bench --url 127.0.0.1:8001 --protocol grpc --model identity_fp32 \
        --shape 1,16 --concurrency 1,4,16 --duration 5 --json /tmp/bench.json

A point's row: requests completed inside the measurement window, throughput, latency
percentiles of those requests, errors (any phase), output mismatches, and the client's
CPU share (CPU seconds of all client processes / wall seconds of the window; 1.0 is one
core busy, so on a 2-core machine the server gets what the client leaves), then the
1-minute load average and the share of CPU time the hypervisor stole during the point:
on a shared VM, stalls of 0.1-1 s hit both servers alike only over many rounds, so read
throughput with those two columns in view (p50 is far less sensitive to them).

Client techniques. Chosen by client CPU per request (getrusage of the client process),
the cost that decides how much load one client core can generate. Measured on the 2-core
dev VM against an echo server, [1,16] FP32, 12 interleaved repetitions of 300 requests
each; the VM was shared with other sessions (load 9-17, 10-40% steal), so absolute
numbers are inflated and only the order means something (us of client CPU per request,
min / 25th percentile / median):
                        c=1                  c=16
  grpc-callback    849 / 1419 / 2148     739 / 1222 / 1934   <- gRPC default
  grpc-threads     712 / 1564 / 2498    1443 / 1565 / 2528
  grpc-aio        1170 / 2580 / 3685    1030 / 1696 / 2294
  http-gevent      206 / 1078 / 1800    1327 / 1489 / 1949   <- HTTP default
  http-aio        1363 / 1997 / 2968     403 / 1545 / 1913
  grpc-callback: the sync client's `async_infer`, each stream's next request sent from
    the previous one's completion callback: no Python thread or event loop per stream.
  grpc-threads: the sync client's `infer` in one thread per stream.
  grpc-aio: tritonclient.grpc.aio, one asyncio task per stream.
  http-gevent: tritonclient.http (geventhttpclient), one greenlet per stream on one
    client with `concurrency=c` keep-alive connections.
  http-aio: tritonclient.http.aio (aiohttp), one asyncio task per stream.
`--client-impl` selects another technique, to re-measure on a different machine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import signal
import sys
import time
from dataclasses import asdict, dataclass, field

# the client processes; the tests and compare.py read these names from here too
from scheduler.bench_client import (  # noqa: F401
    RUNNERS, ClientPool, PointSession, PointSpec, Recorder, SetupError, Stream,
)

DEFAULT_IMPL = {"grpc": "grpc-callback", "http": "http-gevent"}
IMPLS = {
    "grpc": ("grpc-callback", "grpc-aio", "grpc-threads"),
    "http": ("http-gevent", "http-aio"),
}
NUMERIC_DTYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                  "INT64", "FP16", "FP32", "FP64")


# ----------------------------------------------------------------------------------------
# pure helpers (unit-tested)


def parse_int_list(text: str) -> list[int]:
    """'1,4,16' -> [1, 4, 16]; every item must be a positive integer."""
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise ValueError(f"empty list: {text!r}")
    out = []
    for t in items:
        v = int(t)
        if v <= 0:
            raise ValueError(f"must be positive: {t!r} in {text!r}")
        out.append(v)
    return out


def parse_shape(text: str) -> list[int]:
    """'1,16' or '1x16' or '[1, 16]' -> [1, 16]; dims must be positive."""
    s = str(text).strip().strip("[]()").replace("x", ",")
    return parse_int_list(s)


def format_shape(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def percentile(values, q: float) -> float:
    """q-th percentile (0..100) with linear interpolation between closest ranks, the same
    definition as numpy.percentile's default. NaN for an empty list."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile out of range: {q}")
    n = len(values)
    if n == 0:
        return math.nan
    s = sorted(values)
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return s[lo] + (s[hi] - s[lo]) * frac


def split_concurrency(concurrency: int, processes: int) -> list[int]:
    """Spread `concurrency` streams over at most `processes` processes, as evenly as
    possible; no process gets zero streams. 10 over 3 -> [4, 3, 3]."""
    if concurrency <= 0 or processes <= 0:
        raise ValueError("concurrency and processes must be positive")
    n = min(concurrency, processes)
    base, extra = divmod(concurrency, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def split_budget(total: int | None, parts: list[int]) -> list[int | None]:
    """Share a request budget between processes in proportion to their streams; the
    shares add up to `total` exactly (largest remainders first)."""
    if total is None:
        return [None] * len(parts)
    whole = sum(parts)
    raw = [total * p / whole for p in parts]
    shares = [int(r) for r in raw]
    order = sorted(range(len(parts)), key=lambda i: raw[i] - shares[i], reverse=True)
    for i in order[: total - sum(shares)]:
        shares[i] += 1
    return shares


@dataclass
class Row:
    """One measured point: what the table prints and the JSON holds."""

    protocol: str
    shape: list
    dtype: str
    concurrency: int
    shm: str
    requests: int
    seconds: float
    throughput: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    errors: int
    mismatches: int
    client_cpu: float
    client_processes: int
    client_impl: str
    model: str = ""
    url: str = ""
    server: str = ""
    first_error: str = ""
    loadavg: float = math.nan  # 1-minute load average after the point: a noise hint
    steal: float = math.nan  # share of the machine's CPU time the hypervisor took


COLUMNS = [
    # header, width, row -> text
    ("server", 10, lambda r: r.server or "-"),
    ("proto", 5, lambda r: r.protocol),
    ("shape", 12, lambda r: format_shape(r.shape)),
    ("shm", 6, lambda r: r.shm),
    ("conc", 4, lambda r: str(r.concurrency)),
    ("requests", 8, lambda r: str(r.requests)),
    ("infer/s", 9, lambda r: f"{r.throughput:.1f}"),
    ("p50 ms", 8, lambda r: _ms(r.p50_ms)),
    ("p90 ms", 8, lambda r: _ms(r.p90_ms)),
    ("p99 ms", 8, lambda r: _ms(r.p99_ms)),
    ("errors", 6, lambda r: str(r.errors)),
    ("mismatch", 8, lambda r: str(r.mismatches)),
    ("cli cpu", 7, lambda r: f"{r.client_cpu:.2f}"),
    ("load", 5, lambda r: "-" if math.isnan(r.loadavg) else f"{r.loadavg:.1f}"),
    ("steal", 5, lambda r: "-" if math.isnan(r.steal) else f"{r.steal * 100:.0f}%"),
]


def _ms(v: float) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.3f}"


def format_header() -> str:
    return "  ".join(h.rjust(w) for h, w, _ in COLUMNS)


def format_row(row: Row) -> str:
    return "  ".join(f(row).rjust(w) for _, w, f in COLUMNS)


def format_table(rows) -> str:
    return "\n".join([format_header()] + [format_row(r) for r in rows])


def summarize(parts: list[dict], *, protocol, shape, dtype, concurrency, shm, impl,
              model="", url="", server="") -> Row:
    """Merge the per-process results of one point into a Row."""
    lat = [x for p in parts for x in p["latencies"]]
    n = len(lat)
    seconds = max((p["seconds"] for p in parts), default=0.0)
    cpu = sum(p["cpu_s"] for p in parts)
    first_error = next((p["first_error"] for p in parts if p["first_error"]), "")
    return Row(
        protocol=protocol, shape=list(shape), dtype=dtype, concurrency=concurrency,
        shm=shm, requests=n, seconds=round(seconds, 4),
        throughput=(n / seconds) if seconds > 0 else 0.0,
        p50_ms=percentile(lat, 50) * 1e3, p90_ms=percentile(lat, 90) * 1e3,
        p99_ms=percentile(lat, 99) * 1e3,
        mean_ms=(sum(lat) / n * 1e3) if n else math.nan,
        errors=sum(p["errors"] for p in parts),
        mismatches=sum(p["mismatches"] for p in parts),
        client_cpu=(cpu / seconds) if seconds > 0 else 0.0,
        client_processes=len(parts), client_impl=impl, model=model, url=url,
        server=server, first_error=first_error, loadavg=loadavg(),
    )


def row_to_json(row: Row) -> dict:
    d = asdict(row)
    for k, v in d.items():  # NaN is not JSON
        if isinstance(v, float):
            d[k] = None if math.isnan(v) else round(v, 4)
    return d


# ----------------------------------------------------------------------------------------
# the sweep


@dataclass
class BenchConfig:
    """Everything one sweep needs; compare.py builds these too."""

    url: str
    protocol: str
    model: str
    shapes: list
    dtype: str = "FP32"
    input_name: str = "INPUT0"
    output_name: str = "OUTPUT0"
    concurrency: list = field(default_factory=lambda: [1])
    duration: float = 5.0
    max_requests: int | None = None
    warmup: float = 1.0
    timeout: float = 30.0
    shm: str = "none"
    cuda_device: int = 0
    verify: bool = True
    client_processes: int = 1
    impl: str | None = None
    server: str = ""

    def client_impl(self) -> str:
        return self.impl or DEFAULT_IMPL[self.protocol]


def run_one(pool: ClientPool, cfg: BenchConfig, shape, concurrency: int) -> Row:
    """Measure one point (shape, concurrency) with the pool's processes."""
    impl = cfg.client_impl()
    split = split_concurrency(concurrency, cfg.client_processes)
    budgets = split_budget(cfg.max_requests, split)
    tag = f"{os.getpid()}_{int(time.time() * 1e3) % 10**8}"
    specs, offset = [], 0
    for streams, budget in zip(split, budgets):
        specs.append(PointSpec(
            url=cfg.url, protocol=cfg.protocol, impl=impl, model=cfg.model,
            timeout=cfg.timeout, shape=list(shape), dtype=cfg.dtype, input_name=cfg.input_name,
            output_name=cfg.output_name, streams=streams, shm=cfg.shm,
            cuda_device=cfg.cuda_device,
            verify=cfg.verify, warmup=cfg.warmup, duration=cfg.duration,
            max_requests=budget, tag=tag, stream_offset=offset))
        offset += streams
    ticks = cpu_times()
    parts = pool.run_point(specs)
    row = summarize(parts, protocol=cfg.protocol, shape=shape, dtype=cfg.dtype,
                    concurrency=concurrency, shm=cfg.shm, impl=impl, model=cfg.model,
                    url=cfg.url, server=cfg.server)
    row.steal = steal_share(ticks, cpu_times())
    return row


def measure_point(pool: ClientPool, cfg: BenchConfig, shape, concurrency: int) -> Row:
    """run_one, but a point that could not run becomes a row with one error."""
    try:
        return run_one(pool, cfg, shape, concurrency)
    except (SetupError, RuntimeError) as e:
        row = summarize([], protocol=cfg.protocol, shape=shape, dtype=cfg.dtype,
                        concurrency=concurrency, shm=cfg.shm, impl=cfg.client_impl(),
                        model=cfg.model, url=cfg.url, server=cfg.server)
        row.errors, row.first_error = 1, str(e)[:500]
        return row


def default_verify(model: str) -> bool:
    """Identity models echo their input, so their outputs can be checked."""
    return "identity" in model.lower()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=None,
                   help="host:port (default 127.0.0.1:8000 for http, :8001 for grpc)")
    p.add_argument("--protocol", choices=["http", "grpc"], default="grpc")
    p.add_argument("--model", default="identity_fp32")
    p.add_argument("--shape", action="append", type=parse_shape, metavar="1,16",
                   help="input shape; repeat for several (default 1,16)")
    p.add_argument("--dtype", default="FP32", type=str.upper)
    p.add_argument("--input-name", default="INPUT0")
    p.add_argument("--output-name", default="OUTPUT0")
    p.add_argument("--concurrency", type=parse_int_list, default=[1], metavar="1,4,16",
                   help="concurrent streams per point; a list is a sweep")
    p.add_argument("--duration", type=float, default=5.0, help="seconds measured per point")
    p.add_argument("--max-requests", type=int, default=None,
                   help="stop a point after this many requests (whichever comes first)")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per point")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds one request may take; a slower one is an error")
    p.add_argument("--shm", choices=["none", "system", "cuda"], default="none",
                   help="where tensors travel: in the request (none), or in POSIX (system) "
                        "or CUDA shared-memory regions registered with the server")
    p.add_argument("--cuda-device", type=int, default=0,
                   help="the GPU that holds the regions with --shm cuda")
    p.add_argument("--verify", action=argparse.BooleanOptionalAction, default=None,
                   help="check output == input (default: on when the model name "
                        "contains 'identity')")
    p.add_argument("--client-processes", type=int, default=1,
                   help="split each point's streams over this many client processes")
    p.add_argument("--client-impl", default=None,
                   choices=sorted(RUNNERS), help="client technique (default: "
                   + ", ".join(f"{k}: {v}" for k, v in DEFAULT_IMPL.items()) + ")")
    p.add_argument("--json", default=None, metavar="PATH", help="write all rows as JSON")
    p.add_argument("--server-name", default="", help="label for the rows")
    p.add_argument("--window-file", default=None, metavar="PATH",
                   help="write each point's measured window (start and end, "
                        "CLOCK_MONOTONIC seconds) here, for tools sampling CPU time")
    return p


def config_from_args(args) -> BenchConfig:
    if args.client_impl and not args.client_impl.startswith(args.protocol):
        raise SystemExit(f"bench: --client-impl {args.client_impl} does not speak "
                         f"{args.protocol}")
    if args.dtype not in NUMERIC_DTYPES:
        raise SystemExit(f"bench: --dtype {args.dtype} is not supported "
                         f"(one of {', '.join(NUMERIC_DTYPES)})")
    if args.client_processes < 1:
        raise SystemExit("bench: --client-processes must be >= 1")
    if args.max_requests is not None and args.max_requests < 1:
        raise SystemExit("bench: --max-requests must be >= 1")
    url = args.url or ("127.0.0.1:8000" if args.protocol == "http" else "127.0.0.1:8001")
    return BenchConfig(
        url=url, protocol=args.protocol, model=args.model,
        shapes=args.shape or [[1, 16]], dtype=args.dtype, input_name=args.input_name,
        output_name=args.output_name, concurrency=args.concurrency,
        duration=args.duration, max_requests=args.max_requests, warmup=args.warmup,
        timeout=args.timeout, shm=args.shm, cuda_device=args.cuda_device,
        verify=default_verify(args.model) if args.verify is None else args.verify,
        client_processes=args.client_processes, impl=args.client_impl,
        server=args.server_name)


def cpu_times() -> list[int]:
    """The machine's aggregate CPU ticks from /proc/stat (user nice system idle iowait
    irq softirq steal ...); empty where there is no /proc."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return []


def steal_share(before: list[int], after: list[int]) -> float:
    """Stolen ticks / all ticks between two cpu_times() samples (NaN if unknown)."""
    if len(before) < 8 or len(after) < 8:
        return math.nan
    total = sum(after[:8]) - sum(before[:8])
    return (after[7] - before[7]) / total if total > 0 else math.nan


def loadavg() -> float:
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return math.nan


def machine_info() -> dict:
    return {"host": platform.node(), "cpus": os.cpu_count(), "loadavg": loadavg(),
            "python": platform.python_version(), "platform": platform.platform(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def write_json(path: str, rows: list[Row], meta: dict):
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": [row_to_json(r) for r in rows]}, f, indent=1)
        f.write("\n")


def failed(rows: list[Row]) -> list[str]:
    """Why the run fails: any error or output mismatch makes the numbers suspect."""
    why = []
    for r in rows:
        if r.mismatches:
            why.append(f"{r.protocol} {format_shape(r.shape)} c={r.concurrency}: "
                       f"{r.mismatches} output mismatches")
        if r.errors:
            why.append(f"{r.protocol} {format_shape(r.shape)} c={r.concurrency}: "
                       f"{r.errors} errors (first: {r.first_error})")
        if r.requests == 0 and not r.errors:
            why.append(f"{r.protocol} {format_shape(r.shape)} c={r.concurrency}: "
                       "no request completed inside the window")
    return why


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # unwind: client processes clean up
    cfg = config_from_args(args)
    rows: list[Row] = []
    print(f"# bench {cfg.protocol} {cfg.url} model={cfg.model} impl={cfg.client_impl()} "
          f"verify={cfg.verify} client_processes={cfg.client_processes} "
          f"duration={cfg.duration}s warmup={cfg.warmup}s", flush=True)
    print(format_header(), flush=True)
    try:
        with ClientPool(cfg.client_processes, args.window_file) as pool:
            for shape, c in itertools.product(cfg.shapes, cfg.concurrency):
                row = measure_point(pool, cfg, shape, c)
                rows.append(row)
                print(format_row(row), flush=True)
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    finally:
        if args.json and rows:
            meta = {"argv": sys.argv[1:] if argv is None else list(argv),
                    "config": asdict(cfg), "machine": machine_info()}
            write_json(args.json, rows, meta)
    why = failed(rows)
    for w in why:
        print(f"bench: FAILED {w}", file=sys.stderr)
    return 1 if why else 0


if __name__ == "__main__":
    sys.exit(main())
