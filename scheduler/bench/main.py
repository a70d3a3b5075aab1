#!/usr/bin/env python3
"""Load generator for any server that speaks Triton's protocols.

Each point of the sweep runs `c` concurrent streams (closed loop: a stream sends its
next request as soon as the previous one answered), or, with --request-rate, sends on a
fixed schedule whatever the server answers (open loop, scheduler/bench/open_loop.py). Every
input of the model is read from its metadata and filled with random data, zeros or
perf_analyzer's JSON input data (scheduler/bench/inputs.py). The client is the same for
every server (tritonclient, one technique per protocol, chosen by measurement below),
so numbers from two servers measured with this script can be compared. It is a client,
not part of the server: it sits in this package only so that installing shmserve gives
it as `shmserve-bench` (`scripts/bench` runs the same main).

    shmserve-bench --url 127.0.0.1:8001 --protocol grpc --model identity_fp32 \
        --shape 1,16 --concurrency 1,4,16 --duration 5 --json /tmp/bench.json
    shmserve-bench --model add_sub --request-rate 100,200 --percentile 95 \
        --csv /tmp/bench.csv --plot /tmp/bench.png

A point's row: requests completed inside the measurement window, throughput, latency
percentiles of those requests, errors (any phase), output mismatches, and the client's
CPU share (CPU seconds of all client processes / wall seconds of the window; 1.0 is one
core busy, so on a 2-core machine the server gets what the client leaves), then the
1-minute load average and the share of CPU time the hypervisor stole during the point:
on a shared VM, stalls of 0.1-1 s hit both servers alike only over many rounds, so read
throughput with those two columns in view (p50 is far less sensitive to them). Under
the row: CPU microseconds per request of each server process by role and of the client
(the server's processes sampled from /proc inside the window: found from the local port,
or --server-pid; scheduler/bench/procs.py), the server's queue and compute split from
its statistics endpoint, and the open loop's pacing (scheduler/bench/report.py).

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
from scheduler.bench.client import (  # noqa: F401
    RUNNERS, ClientPool, PointSession, PointSpec, Recorder, SetupError, Stream,
)
# the command line (scheduler/bench/cli.py); the tests and compare.py read it here too
from scheduler.bench.cli import (  # noqa: F401
    CALL_MODES, DEFAULT_IMPL, IMPLS, NUMERIC_DTYPES, BenchConfig, build_parser,
    config_from_args, default_verify, parse_float_list, parse_int_list, sequence_plan,
)
from scheduler.bench.inputs import (
    OutputSpec, TensorSpec, Workload, fetch_model_info, load_input_data,
    load_validation_streams, model_kind, workload_from_metadata,
)
from scheduler.bench.pa_flags import check_refused
from scheduler.bench.procs import (
    PySpy, RoleSampler, busiest, cpu_seconds, find_server, format_top, group_roles,
    wait_until,
)
from scheduler.bench.report import (
    cpu_line, is_stable, over_threshold, plot_files, read_stats, server_line,
    server_split, write_csv, write_pa_csv,
)

# ----------------------------------------------------------------------------------------
# pure helpers (unit-tested)


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
    inputs: str = ""  # every input sent, NAME:[shape] ...
    batch_size: int = 1
    p95_ms: float = math.nan
    percentile: float | None = None  # --percentile P: pct_ms is that percentile
    pct_ms: float = math.nan
    request_rate: float = 0.0  # open loop: the target rate (0: closed loop)
    achieved_rate: float = math.nan  # open loop: requests sent per second of the window
    late: int = 0  # open loop: sends that left more than 1 ms after their time
    unsent: int = 0  # open loop: sends of the window that never left
    client_us: float = math.nan  # the client's CPU microseconds per request
    cpu_us: dict = field(default_factory=dict)  # role -> CPU us per request, client too
    cpu_note: str = ""  # why the server's roles are missing, when they are
    server_stats: dict = field(default_factory=dict)  # the statistics endpoint's split
    trials: int = 1  # windows measured for this point (--max-trials)
    stable: bool | None = None  # whether the last windows met the stability rule
    profile: str = ""  # --profile-role: the top functions of that role
    sequences: int = 0  # sequence models: sequences ended (END answered) in the window
    responses: int = 0  # --streaming: responses with outputs in the window
    responses_per_s: float = math.nan
    ttft_p50_ms: float = math.nan  # --streaming: send to first response
    ttft_p99_ms: float = math.nan
    ttft_mean_ms: float = math.nan


# how long --profile-role watches a role's processes to profile the busiest
PROFILE_LOOK_S = 0.25

COLUMNS = [
    # header, width, row -> text
    ("server", 10, lambda r: r.server or "-"),
    ("proto", 5, lambda r: r.protocol),
    ("shape", 12, lambda r: format_shape(r.shape)),
    ("shm", 6, lambda r: r.shm),
    ("conc", 4, lambda r: f"{r.request_rate:g}/s" if r.request_rate else str(r.concurrency)),
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
              model="", url="", server="", inputs="", batch_size=1, percentile_q=None,
              request_rate=0.0) -> Row:
    """Merge the per-process results of one point into a Row."""
    lat = [x for p in parts for x in p["latencies"]]
    n = len(lat)
    seconds = max((p["seconds"] for p in parts), default=0.0)
    cpu = sum(p["cpu_s"] for p in parts)
    first_error = next((p["first_error"] for p in parts if p["first_error"]), "")
    row = Row(
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
        inputs=inputs, batch_size=batch_size, p95_ms=percentile(lat, 95) * 1e3,
        request_rate=request_rate, client_us=(cpu / n * 1e6) if n else math.nan,
    )
    if percentile_q is not None:
        row.percentile, row.pct_ms = percentile_q, percentile(lat, percentile_q) * 1e3
    row.sequences = sum(p.get("sequences", 0) for p in parts)
    ttft = [x for p in parts for x in p.get("ttft", ())]
    row.responses = sum(p.get("responses", 0) for p in parts)
    if impl == "grpc-stream":
        row.responses_per_s = row.responses / seconds if seconds > 0 else 0.0
        row.ttft_p50_ms = percentile(ttft, 50) * 1e3
        row.ttft_p99_ms = percentile(ttft, 99) * 1e3
        row.ttft_mean_ms = sum(ttft) / len(ttft) * 1e3 if ttft else math.nan
    if request_rate:
        sent = sum(p.get("sent", 0) for p in parts)
        row.achieved_rate = sent / seconds if seconds > 0 else 0.0
        row.late = sum(p.get("late", 0) for p in parts)
        row.unsent = sum(p.get("unsent", 0) for p in parts)
    return row


def merge_trials(trials: list[Row], stable: bool | None, count: int) -> Row:
    """One row from the last windows of a point, as perf_analyzer reports a stable
    measurement: rates and latencies averaged over the windows, counts added up, CPU
    and the server's split weighted by each window's requests."""
    if len(trials) == 1:
        out = trials[0]
        out.trials, out.stable = count, stable
        return out
    k = len(trials)
    out = Row(**{**asdict(trials[-1]), "cpu_us": {}, "server_stats": {}})

    def mean(name):
        values = [getattr(r, name) for r in trials]
        if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values):
            return math.nan
        return sum(values) / k
    for name in ("throughput", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "mean_ms",
                 "pct_ms", "client_cpu", "client_us", "achieved_rate", "responses_per_s",
                 "ttft_p50_ms", "ttft_p99_ms", "ttft_mean_ms"):
        setattr(out, name, mean(name))
    for name in ("requests", "errors", "mismatches", "late", "unsent", "sequences",
                 "responses"):
        setattr(out, name, sum(getattr(r, name) for r in trials))
    out.seconds = round(sum(r.seconds for r in trials), 4)
    n = sum(r.requests for r in trials)
    if n:
        for role in trials[-1].cpu_us:
            if all(role in r.cpu_us and r.cpu_us[role] is not None for r in trials):
                out.cpu_us[role] = round(sum(r.cpu_us[role] * r.requests
                                             for r in trials) / n, 1)
    counted = [r.server_stats for r in trials if r.server_stats.get("requests")]
    if counted:
        total = sum(s["requests"] for s in counted)
        out.server_stats = {"requests": total}
        for key in counted[0]:
            if key != "requests":
                out.server_stats[key] = round(
                    sum(s[key] * s["requests"] for s in counted) / total, 2)
    out.first_error = next((r.first_error for r in trials if r.first_error), "")
    out.trials, out.stable = count, stable
    return out


def row_to_json(row: Row) -> dict:
    d = asdict(row)
    for k, v in d.items():  # NaN is not JSON
        if isinstance(v, float):
            d[k] = None if math.isnan(v) else round(v, 4)
    return d


# ----------------------------------------------------------------------------------------
# the sweep


def legacy_workload(cfg: BenchConfig, shape) -> Workload:
    """One input and one output named by the config (compare.py's points)."""
    return Workload([TensorSpec(cfg.input_name, cfg.dtype, list(shape))],
                    [OutputSpec(cfg.output_name, cfg.dtype, -1)])


class ServerProbe:
    """What the parent process samples inside each measured window: the CPU time of
    each server process by role (when the server's pid is known), the model's
    statistics (when the endpoint answers), and, with --profile-role, py-spy's
    samples of that role."""

    def __init__(self, cfg: BenchConfig, pid: int | None, note: str = ""):
        self.cfg = cfg
        self.sampler = RoleSampler(pid) if pid else None
        self.note = note
        self._control = None
        self.last: dict = {}

    def control(self):
        if self._control is None:
            if self.cfg.protocol == "grpc":
                import tritonclient.grpc as mod
            else:
                import tritonclient.http as mod
            self._control = mod.InferenceServerClient(self.cfg.url)
        return self._control

    def window(self, start: float, end: float) -> None:
        """Sample at the window's start and end (run_point calls this)."""
        wait_until(start)
        stats0 = read_stats(self.control(), self.cfg.model)
        cpu0 = self.sampler.sample() if self.sampler else None
        t0 = time.perf_counter()
        spy, spied = None, ""
        if self.cfg.profile_role and self.sampler:
            spy, spied = self._start_profile(end - start)
        wait_until(end)
        cpu1 = self.sampler.sample() if self.sampler else None
        seconds = time.perf_counter() - t0
        stats1 = read_stats(self.control(), self.cfg.model)
        self.last = {"server_stats": server_split(stats0, stats1), "seconds": seconds,
                     "cpu_s": self.sampler.per_role(cpu0, cpu1) if self.sampler else None,
                     "profile": ""}
        if spy is not None:
            own, incl, total, problem = spy.finish()
            self.last["profile"] = format_top(spied, spy.pid, own, incl, total) \
                if total else f"# profile of {spied}: {problem}"
        elif spied:
            self.last["profile"] = spied

    def _start_profile(self, seconds: float):
        role = self.cfg.profile_role
        # "worker" means this model's worker first; "frontend" the first frontend
        mine = f"worker {self.cfg.model}/"
        pids = sorted((p for p, r in self.sampler.roles.items()
                       if r == role or r.startswith(role + " ")),
                      key=lambda p: (not self.sampler.roles[p].startswith(mine), p))
        if not pids:
            return None, (f"# profile: no process has role {role!r} (roles: "
                          f"{', '.join(sorted(set(self.sampler.roles.values())))})")
        if self.sampler.roles[pids[0]].startswith(mine):
            pids = [p for p in pids if self.sampler.roles[p].startswith(mine)]
        if len(pids) > 1:  # the one serving the load: the busiest over a short look
            before = {p: cpu_seconds(p) or 0.0 for p in pids}
            time.sleep(PROFILE_LOOK_S)
            pids = [busiest(pids, before, {p: cpu_seconds(p) or 0.0 for p in pids})]
            seconds -= PROFILE_LOOK_S
        try:
            return (PySpy(pids[0], seconds, native=self.cfg.profile_native),
                    self.sampler.roles[pids[0]])
        except FileNotFoundError as e:
            return None, f"# profile: {e}"

    def fill(self, row: Row) -> None:
        """Put the last window's samples into `row`: CPU per request by role (the
        server's grouped, then its total, then the client's)."""
        last, n = self.last, row.requests
        row.server_stats = last.get("server_stats", {})
        row.profile = last.get("profile", "")
        cpu = last.get("cpu_s")
        if cpu is None or not n:
            row.cpu_us = {"client": round(row.client_us, 1)} if n else {}
            row.cpu_note = self.note if cpu is None else "no request completed"
            return
        # the server was sampled over [start, end] of the wall clock; the requests
        # are those of the window, so both cover the same interval
        grouped = group_roles(cpu, self.cfg.model)
        row.cpu_us = {k: round(v / n * 1e6, 1) for k, v in grouped.items()}
        row.cpu_us["server"] = round(sum(cpu.values()) / n * 1e6, 1)
        row.cpu_us["client"] = round(row.client_us, 1)

    def close(self):
        if self._control is not None:
            try:
                self._control.close()
            except Exception:
                pass


def run_one(pool: ClientPool, cfg: BenchConfig, shape, concurrency: int,
            rate: float = 0.0, probe: ServerProbe | None = None,
            warmup: float | None = None) -> Row:
    """Measure one point (a shape or Workload, a concurrency or an open loop rate) with
    the pool's processes, sampling the server inside the window through `probe`."""
    work = shape if isinstance(shape, Workload) else legacy_workload(cfg, shape)
    impl = cfg.client_impl()
    split = split_concurrency(concurrency, cfg.client_processes)
    budgets = split_budget(cfg.max_requests, split)
    tag = f"{os.getpid()}_{int(time.time() * 1e3) % 10**8}"
    warmup = cfg.warmup if warmup is None else warmup
    specs, offset = [], 0
    for i, (streams, budget) in enumerate(zip(split, budgets)):
        specs.append(PointSpec(
            url=cfg.url, protocol=cfg.protocol, impl=impl, model=cfg.model,
            timeout=cfg.timeout, inputs=[asdict(t) for t in work.inputs],
            outputs=[asdict(o) for o in work.outputs], streams=streams, shm=cfg.shm,
            cuda_device=cfg.cuda_device, verify=cfg.verify, warmup=warmup,
            duration=cfg.duration, max_requests=budget, tag=tag, stream_offset=offset,
            input_data=cfg.input_data, output_shm_size=cfg.output_shm_size,
            request_rate=rate / len(split), distribution=cfg.distribution,
            rate_phase=i / rate if rate else 0.0, model_version=cfg.model_version,
            headers=cfg.headers, parameters=cfg.parameters, compression=cfg.compression,
            string_length=cfg.string_length, string_data=cfg.string_data,
            sequence=cfg.sequence, total_streams=concurrency))
        offset += streams
    ticks = cpu_times()
    parts = pool.run_point(specs, probe.window if probe else None)
    first = work.inputs[0] if work.inputs else TensorSpec("", cfg.dtype, [])
    row = summarize(parts, protocol=cfg.protocol, shape=first.shape, dtype=first.datatype,
                    concurrency=concurrency, shm=cfg.shm, impl=impl, model=cfg.model,
                    url=cfg.url, server=cfg.server, inputs=work.label(),
                    batch_size=work.batch_size, percentile_q=cfg.percentile,
                    request_rate=rate)
    row.steal = steal_share(ticks, cpu_times())
    if probe is not None:
        probe.fill(row)
    return row


def measure_point(pool: ClientPool, cfg: BenchConfig, shape, concurrency: int,
                  rate: float = 0.0, probe: ServerProbe | None = None,
                  warmup: float | None = None) -> Row:
    """run_one, but a point that could not run becomes a row with one error."""
    try:
        return run_one(pool, cfg, shape, concurrency, rate, probe, warmup)
    except (SetupError, RuntimeError) as e:
        work = shape if isinstance(shape, Workload) else legacy_workload(cfg, shape)
        first = work.inputs[0] if work.inputs else TensorSpec("", cfg.dtype, [])
        row = summarize([], protocol=cfg.protocol, shape=first.shape, dtype=first.datatype,
                        concurrency=concurrency, shm=cfg.shm, impl=cfg.client_impl(),
                        model=cfg.model, url=cfg.url, server=cfg.server,
                        inputs=work.label(), batch_size=work.batch_size,
                        request_rate=rate)
        row.errors, row.first_error = 1, str(e)[:500]
        return row


def measure_stable(pool: ClientPool, cfg: BenchConfig, shape, concurrency: int,
                   rate: float = 0.0, probe: ServerProbe | None = None) -> Row:
    """Windows of `duration` until the last three are stable (perf_analyzer's rule over
    throughput and the --percentile latency, else the mean) or `max_trials` ran; the
    row averages the last three. With max_trials 1, one window as before."""
    trials: list[Row] = []
    for k in range(cfg.max_trials):
        # later windows follow at once: the connection and the server are warm
        warmup = cfg.warmup if k == 0 else min(cfg.warmup, 0.5)
        row = measure_point(pool, cfg, shape, concurrency, rate, probe, warmup)
        trials.append(row)
        if cfg.verbose:
            print(f"  window {k + 1}: {row.throughput:.1f} infer/s, avg "
                  f"{_ms(row.mean_ms)} ms, p50 {_ms(row.p50_ms)} ms, p99 "
                  f"{_ms(row.p99_ms)} ms, {row.requests} requests", flush=True)
        if row.errors or not row.requests or cfg.max_trials == 1:
            break
        if is_stable([(r.throughput, r.pct_ms if cfg.percentile is not None
                       else r.mean_ms) for r in trials], cfg.stability_percentage):
            return merge_trials(trials[-3:], True, len(trials))
    stable = None if cfg.max_trials == 1 else False
    return merge_trials(trials[-3:] if stable is False else trials[-1:], stable, len(trials))


def resolve_workloads(cfg: BenchConfig, args) -> list[Workload]:
    """The tensors of each point, from the model's metadata over the bench's protocol:
    every input (or --input-name's), every output (or --output-name's)."""
    meta, max_batch, model_cfg = fetch_model_info(cfg.url, cfg.protocol, cfg.model,
                                                  cfg.timeout, cfg.model_version, True)
    sequential, decoupled = model_kind(model_cfg)
    if decoupled and not cfg.streaming:
        raise ValueError("the model is decoupled: its responses come over the gRPC "
                         "stream; add --streaming (with -i grpc), as perf_analyzer needs")
    if sequential:
        if cfg.request_rates:
            raise ValueError("a sequence model is driven in the closed loop only (one "
                             "sequence per concurrent stream): use --concurrency-range")
        cfg.sequence = sequence_plan(cfg)
    unnamed = [dims for name, dims in (args.shape or []) if name is None]
    out = []
    for whole in unnamed or [None]:
        work = workload_from_metadata(
            meta, max_batch, cfg.batch_size, cfg.named_shapes, whole,
            [args.output_name] if args.output_name else None)
        if args.input_name:
            work.inputs = [t for t in work.inputs if t.name == args.input_name]
            if not work.inputs:
                raise ValueError(f"the model has no input {args.input_name!r}")
        if args.dtype:
            for t in work.inputs:
                t.datatype = args.dtype
        if cfg.input_data not in ("random", "zero"):
            load_input_data(cfg.input_data, work.inputs)  # its errors, said up front
            if load_validation_streams(cfg.input_data, [asdict(o) for o in work.outputs]) \
                    and cfg.shm != "none":
                raise ValueError("validation_data is checked in the responses: use "
                                 "--shared-memory none")
        out.append(work)
    return out


def find_server_pid(cfg: BenchConfig) -> tuple[int | None, str]:
    """(the server's top pid, why not known): --server-pid, else the local process
    listening on the bench's port."""
    if cfg.server_pid:
        return cfg.server_pid, ""
    host, _, port = cfg.url.rpartition(":")
    if host not in ("127.0.0.1", "localhost", "[::1]", "::1", "0.0.0.0"):
        return None, f"server {cfg.url} is not local: its CPU by role is not known"
    try:
        pid = find_server(int(port))
    except (OSError, ValueError):
        pid = None
    if pid is None:
        return None, (f"no visible process listens on port {port}: pass --server-pid "
                      "for the server's CPU by role")
    return pid, ""


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


def point_lines(row: Row) -> list[str]:
    """The lines printed under a point's row: CPU by role, the server's split, the open
    loop's pacing, the stability verdict, and a profile."""
    lines = [cpu_line(row.cpu_us, row.cpu_note), server_line(row.server_stats)]
    if row.percentile is not None:
        lines.append(f"    p{row.percentile:g} latency {_ms(row.pct_ms)} ms")
    if row.request_rate:
        lines.append(f"    open loop: target {row.request_rate:g}/s, sent "
                     f"{row.achieved_rate:.1f}/s, late {row.late}, unsent {row.unsent}")
    if row.sequences:
        lines.append(f"    sequences: {row.sequences} ended inside the window")
    if not math.isnan(row.responses_per_s):
        lines.append(f"    streaming: {row.responses_per_s:.1f} responses/s "
                     f"({row.responses} responses), time to first response p50 "
                     f"{_ms(row.ttft_p50_ms)} ms, p99 {_ms(row.ttft_p99_ms)} ms, avg "
                     f"{_ms(row.ttft_mean_ms)} ms")
    if row.stable is not None:
        lines.append(f"    {'stable' if row.stable else 'NOT stable'} after {row.trials} "
                     f"window(s) of {row.seconds / min(row.trials, 3):.1f}s")
    if row.profile:
        lines.append(row.profile)
    return lines


def plot_main(argv: list[str]) -> int:
    """`bench plot OUT.png RUN.json...`: earlier runs on one plot."""
    p = argparse.ArgumentParser(prog="bench plot",
                                description="throughput against p50/p99 latency of "
                                            "earlier runs (their --json files), one plot")
    p.add_argument("out", metavar="OUT.png")
    p.add_argument("runs", nargs="+", metavar="RUN.json")
    args = p.parse_args(argv)
    try:
        plot_files(args.out, args.runs)
    except ImportError:
        print("bench: plotting needs matplotlib (pip install matplotlib, or the `bench` "
              "extra)", file=sys.stderr)
        return 1
    print(f"bench: wrote {args.out}")
    return 0


def write_outputs(args, cfg: BenchConfig, rows: list[Row], argv) -> None:
    meta = {"argv": sys.argv[1:] if argv is None else list(argv),
            "config": asdict(cfg), "machine": machine_info(),
            "label": cfg.server or None}
    if args.json:
        write_json(args.json, rows, meta)
    if args.csv:
        write_csv(args.csv, [row_to_json(r) for r in rows])
    if args.pa_csv:
        write_pa_csv(args.pa_csv, [row_to_json(r) for r in rows], args.verbose_csv)
    measured = [r for r in rows if r.requests]  # a point with none has no numbers
    if args.plot and not measured:
        # an empty plot would pass for a result: say why there is none (exit 1 follows)
        print(f"bench: no plot written to {args.plot}: no point completed a request",
              file=sys.stderr)
    elif args.plot:
        label = cfg.server or f"{cfg.model} {cfg.protocol}"
        try:
            plot_files(args.plot, args.plot_with,
                       extra=[(label, [row_to_json(r) for r in measured])])
        except ImportError:
            print("bench: --plot needs matplotlib (pip install matplotlib, or the "
                  "`bench` extra)", file=sys.stderr)


def main(argv=None) -> int:
    argv_list = sys.argv[1:] if argv is None else list(argv)
    if argv_list[:1] == ["plot"]:
        return plot_main(argv_list[1:])
    check_refused(argv_list)
    args = build_parser().parse_args(argv_list)
    signal.signal(signal.SIGTERM, _interrupt)  # unwind: client processes clean up
    cfg = config_from_args(args)
    try:
        cfg.workloads = resolve_workloads(cfg, args)
    except Exception as e:  # the server is down, the model unknown, a --shape wrong
        print(f"bench: {cfg.model}'s inputs (from {cfg.url}): "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    pid, note = find_server_pid(cfg)
    probe = ServerProbe(cfg, pid, note)
    rows: list[Row] = []
    load = (f"request_rate={','.join(f'{r:g}' for r in cfg.request_rates)}/s "
            f"({cfg.distribution}, {cfg.max_inflight} in flight at most)"
            if cfg.request_rates else f"concurrency={','.join(map(str, cfg.concurrency))}")
    print(f"# bench {cfg.protocol} {cfg.url} model={cfg.model} impl={cfg.client_impl()} "
          f"verify={cfg.verify} client_processes={cfg.client_processes} {load} "
          f"duration={cfg.duration}s warmup={cfg.warmup}s", flush=True)
    print(f"# server pid {pid}" if pid else f"# {note}", flush=True)
    if cfg.sequence:
        length, var = cfg.sequence["length"], cfg.sequence["variation"]
        print("# sequence model: " + (f"{length} requests per sequence (+/- {var:g}%)"
                                      if length else "sequences of the data's streams")
              + f", ids from {cfg.sequence_ids[0]}"
              + (f" to {cfg.sequence_ids[1]} (excluded)" if cfg.sequence_ids[1] else ""),
              flush=True)
    for work in cfg.workloads:
        print(f"# inputs {work.label()}; outputs "
              f"{' '.join(o.name for o in work.outputs)}", flush=True)
        for n in work.notes:
            print(f"# {n}", flush=True)
    print(format_header(), flush=True)
    try:
        with ClientPool(cfg.client_processes, args.window_file) as pool:
            for work, (c, rate) in itertools.product(cfg.workloads, cfg.loads()):
                if over_threshold(rows, cfg.latency_threshold_ms):
                    break  # perf_analyzer's -l: the sweep ends past the threshold
                row = measure_stable(pool, cfg, work, c, rate, probe)
                rows.append(row)
                print(format_row(row), flush=True)
                for line in point_lines(row):
                    print(line, flush=True)
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    finally:
        probe.close()
        if rows:
            write_outputs(args, cfg, rows, argv)
    why = failed(rows)
    for w in why:
        print(f"bench: FAILED {w}", file=sys.stderr)
    return 1 if why else 0


if __name__ == "__main__":
    sys.exit(main())
