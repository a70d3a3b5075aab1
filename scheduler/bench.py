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
import asyncio
import itertools
import json
import math
import multiprocessing
import os
import platform
import resource
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

DEFAULT_IMPL = {"grpc": "grpc-callback", "http": "http-gevent"}
IMPLS = {
    "grpc": ("grpc-callback", "grpc-aio", "grpc-threads"),
    "http": ("http-gevent", "http-aio"),
}
NUMERIC_DTYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                  "INT64", "FP16", "FP32", "FP64")
# Value written into element 0 of each request's input: a stale output region (the server
# did not write it) then shows as a mismatch. 127 is exact in every numeric dtype.
_STAMP_MODULUS = 127


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
# one point in one process


@dataclass
class PointSpec:
    """What one client process runs for one point."""

    url: str
    protocol: str
    impl: str
    model: str
    timeout: float  # seconds one request may take before it counts as an error
    shape: list
    dtype: str
    input_name: str
    output_name: str
    streams: int
    shm: str  # "none" | "system" | "cuda"
    verify: bool
    warmup: float
    duration: float
    max_requests: int | None  # this process's share
    tag: str = ""  # makes shared-memory names unique
    stream_offset: int = 0
    cuda_device: int = 0  # where --shm cuda puts the regions


class Recorder:
    """Decides when streams stop and keeps what the measurement window saw. Shared by
    the streams of one process (the GIL makes the appends and counters safe)."""

    def __init__(self, t0: float, warmup: float, duration: float, max_requests):
        self.start = t0 + warmup
        self.deadline = self.start + duration
        self.max_requests = max_requests
        self.issued = 0  # requests sent inside the window
        self.latencies: list[float] = []
        self.last_done = None
        self.errors = 0
        self.mismatches = 0
        self.first_error = ""
        self.cpu_start = None
        self.wall_start = None
        self.stopped = False
        self._lock = threading.Lock()

    def stop(self):
        """End the point early: every stream stops before its next send."""
        self.stopped = True

    def next(self) -> bool:
        """Called before each send: False when the stream should stop."""
        now = time.perf_counter()
        if self.stopped or now >= self.deadline:
            return False
        if now >= self.start:
            with self._lock:
                if self.cpu_start is None:
                    self.cpu_start = _cpu_seconds()
                    self.wall_start = now
                if self.max_requests is not None and self.issued >= self.max_requests:
                    return False
                self.issued += 1
        return True

    def done(self, t_send: float, ok: bool):
        t = time.perf_counter()
        if not ok:
            self.mismatches += 1
        if self.start <= t_send and t <= self.deadline:
            self.latencies.append(t - t_send)
            self.last_done = t

    def error(self, exc: BaseException):
        self.errors += 1
        if not self.first_error:
            self.first_error = f"{type(exc).__name__}: {exc}"[:500]

    def result(self) -> dict:
        now = time.perf_counter()
        cpu = (_cpu_seconds() - self.cpu_start) if self.cpu_start is not None else 0.0
        if self.max_requests is not None and self.issued >= self.max_requests \
                and self.last_done is not None:
            seconds = self.last_done - self.start  # budget reached before the deadline
        else:
            seconds = min(now, self.deadline) - self.start
        cpu_wall = (now - self.wall_start) if self.wall_start is not None else 0.0
        return {
            "latencies": self.latencies,
            "seconds": max(seconds, 0.0),
            "errors": self.errors,
            "mismatches": self.mismatches,
            "first_error": self.first_error,
            # CPU over the window, rescaled to the window's length (the tail while
            # in-flight requests drain is not in the window but is in the CPU sample)
            "cpu_s": cpu * (seconds / cpu_wall) if cpu_wall > 0 else 0.0,
        }


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)  # all threads of this process
    return ru.ru_utime + ru.ru_stime


def _stamp_value(seq: int, np_dtype):
    import numpy as np
    if np_dtype == np.bool_:
        return bool(seq % 2)
    return seq % _STAMP_MODULUS


class Stream:
    """One closed-loop stream's tensors: its input, its expected output and, with shared
    memory, its two regions: system (POSIX) or CUDA (device memory, shared by IPC
    handle). With CUDA regions the input lives on the device and the output stays there:
    checking it costs a device-to-host copy, stamping one a host-to-device copy, so both
    happen only with verification on."""

    def __init__(self, spec: PointSpec, index: int, mod, np_dtype):
        import numpy as np
        self.spec = spec
        self.mod = mod  # tritonclient.http or tritonclient.grpc (both have InferInput)
        rng = np.random.default_rng(index + 1)
        if np_dtype == np.bool_:
            data = rng.integers(0, 2, size=spec.shape).astype(np.bool_)
        elif np.issubdtype(np_dtype, np.integer):
            data = rng.integers(0, 100, size=spec.shape).astype(np_dtype)
        else:
            data = rng.random(size=spec.shape).astype(np_dtype)
        self.expected = data
        self.seq = 0
        self.nbytes = data.nbytes
        self.input = mod.InferInput(spec.input_name, list(spec.shape), spec.dtype)
        self.output = mod.InferRequestedOutput(spec.output_name)
        self.in_handle = self.out_handle = None
        self.in_view = self.out_view = None
        self.in_name = self.out_name = ""
        if spec.shm == "none":
            # the data never changes, so it is serialized once; an HTTP/gRPC response
            # carries its own bytes, so a stale output cannot go unnoticed
            self.input.set_data_from_numpy(data)
        else:
            base = f"bench_{spec.tag}_{spec.stream_offset + index}"
            self.in_name, self.out_name = base + "_in", base + "_out"

    # shared memory lifecycle: create_regions / register / unregister / destroy

    def create_regions(self):
        if self.spec.shm == "cuda":
            return self._create_cuda_regions()
        import tritonclient.utils.shared_memory as shm
        self.in_handle = shm.create_shared_memory_region(
            self.in_name, "/" + self.in_name, self.nbytes, create_only=True)
        self.out_handle = shm.create_shared_memory_region(
            self.out_name, "/" + self.out_name, self.nbytes, create_only=True)
        self.in_view = shm.get_contents_as_numpy(
            self.in_handle, self.expected.dtype, self.expected.shape)
        self.out_view = shm.get_contents_as_numpy(
            self.out_handle, self.expected.dtype, self.expected.shape)
        self.in_view[...] = self.expected
        self.input.set_shared_memory(self.in_name, self.nbytes)
        self.output.set_shared_memory(self.out_name, self.nbytes)

    def _create_cuda_regions(self):
        import tritonclient.utils.cuda_shared_memory as cudashm
        dev = self.spec.cuda_device
        self.in_handle = cudashm.create_shared_memory_region(self.in_name, self.nbytes, dev)
        self.out_handle = cudashm.create_shared_memory_region(self.out_name, self.nbytes, dev)
        cudashm.set_shared_memory_region(self.in_handle, [self.expected])
        self.input.set_shared_memory(self.in_name, self.nbytes)
        self.output.set_shared_memory(self.out_name, self.nbytes)

    def register(self, control, registered: list):
        """Register both regions with the server through the blocking `control` client,
        appending each name to `registered` once the server has it."""
        for name, h in ((self.in_name, self.in_handle), (self.out_name, self.out_handle)):
            if self.spec.shm == "cuda":
                import tritonclient.utils.cuda_shared_memory as cudashm
                control.register_cuda_shared_memory(name, cudashm.get_raw_handle(h),
                                                    self.spec.cuda_device, self.nbytes)
            else:
                control.register_system_shared_memory(name, "/" + name, self.nbytes)
            registered.append(name)

    def destroy_regions(self):
        if self.spec.shm == "cuda":
            import tritonclient.utils.cuda_shared_memory as shm
        else:
            import tritonclient.utils.shared_memory as shm
        self.in_view = self.out_view = None  # views pin the mapping
        for h, name in ((self.in_handle, self.in_name), (self.out_handle, self.out_name)):
            if h is not None:
                try:
                    shm.destroy_shared_memory_region(h)
                except Exception as e:  # keep going: the segment must not outlive us
                    print(f"bench: destroying shm region {name} failed: {e}",
                          file=sys.stderr)
                    if self.spec.shm == "system":
                        try:
                            os.unlink("/dev/shm/" + name)
                        except OSError:
                            pass
        self.in_handle = self.out_handle = None

    def prepare(self):
        """Before each send: with shm, stamp a fresh value into the input region."""
        if self.in_view is not None:
            self.seq += 1
            v = _stamp_value(self.seq, self.expected.dtype)
            self.expected.flat[0] = v
            self.in_view.flat[0] = v
        elif self.spec.shm == "cuda" and self.spec.verify:
            import tritonclient.utils.cuda_shared_memory as cudashm
            self.seq += 1
            self.expected.flat[0] = _stamp_value(self.seq, self.expected.dtype)
            cudashm.set_shared_memory_region(self.in_handle, [self.expected])

    def check(self, result) -> bool:
        if not self.spec.verify:
            return True
        import numpy as np
        if self.out_view is not None:
            return np.array_equal(self.out_view, self.expected)
        if self.spec.shm == "cuda":
            import tritonclient.utils.cuda_shared_memory as cudashm
            got = cudashm.get_contents_as_numpy(self.out_handle, self.expected.dtype,
                                                self.expected.shape)
            return np.array_equal(got, self.expected)
        out = result.as_numpy(self.spec.output_name)
        return out is not None and out.shape == self.expected.shape and \
            np.array_equal(out, self.expected)


def _infer_kwargs(stream: Stream) -> dict:
    kw = {"inputs": [stream.input], "outputs": [stream.output]}
    if stream.mod.__name__.startswith("tritonclient.grpc"):
        kw["client_timeout"] = stream.spec.timeout  # HTTP clients take it at creation
    return kw


def _sync_stream(stream: Stream, infer, model: str, rec: Recorder, sleep=time.sleep):
    """Closed loop over a blocking infer call (threads, greenlets)."""
    kw = _infer_kwargs(stream)
    while rec.next():
        stream.prepare()
        t = time.perf_counter()
        try:
            res = infer(model, **kw)
        except Exception as e:
            rec.error(e)
            sleep(0.01)  # a dead server must not turn the loop into a spin
            continue
        rec.done(t, stream.check(res))


async def _async_stream(stream: Stream, client, model: str, rec: Recorder):
    kw = _infer_kwargs(stream)
    while rec.next():
        stream.prepare()
        t = time.perf_counter()
        try:
            res = await client.infer(model, **kw)
        except Exception as e:
            rec.error(e)
            await asyncio.sleep(0.01)
            continue
        rec.done(t, stream.check(res))


def _run_grpc_callback(streams, spec, rec):
    """Each stream's next request is sent from the previous one's completion callback
    (run on grpc's own thread): no thread or event loop per stream."""
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(spec.url)
    finished = threading.Semaphore(0)

    def issue(stream, kw):
        # a loop, not recursion, so a run of send failures cannot grow the stack
        while rec.next():
            stream.prepare()
            t = time.perf_counter()

            def callback(result, error, stream=stream, kw=kw, t=t):
                try:
                    if error is not None:
                        rec.error(error)
                        time.sleep(0.01)
                    else:
                        rec.done(t, stream.check(result))
                except BaseException as e:  # an exception here would end the stream
                    rec.error(e)
                issue(stream, kw)

            try:
                client.async_infer(spec.model, callback=callback, **kw)
                return
            except Exception as e:
                rec.error(e)
                time.sleep(0.01)
        finished.release()

    try:
        for s in streams:
            issue(s, _infer_kwargs(s))
        for _ in streams:
            finished.acquire()
    finally:
        client.close()


def _run_grpc_threads(streams, spec, rec):
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(spec.url)
    try:
        threads = [threading.Thread(target=_sync_stream,
                                    args=(s, client.infer, spec.model, rec), daemon=True)
                   for s in streams]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        client.close()


def _run_grpc_aio(streams, spec, rec):
    import tritonclient.grpc.aio as aioclient

    async def main():
        client = aioclient.InferenceServerClient(spec.url)
        try:
            await asyncio.gather(*(_async_stream(s, client, spec.model, rec)
                                   for s in streams))
        finally:
            await client.close()
    asyncio.run(main())


def _run_http_gevent(streams, spec, rec):
    import gevent
    import tritonclient.http as httpclient
    # one keep-alive connection per stream, as a closed-loop HTTP/1.1 client needs
    client = httpclient.InferenceServerClient(
        spec.url, concurrency=len(streams), network_timeout=spec.timeout,
        connection_timeout=spec.timeout)
    try:
        gs = [gevent.spawn(_sync_stream, s, client.infer, spec.model, rec, gevent.sleep)
              for s in streams]
        gevent.joinall(gs, raise_error=True)
    finally:
        client.close()


def _run_http_aio(streams, spec, rec):
    import tritonclient.http.aio as aioclient

    async def main():
        client = aioclient.InferenceServerClient(spec.url, conn_limit=len(streams),
                                                 conn_timeout=spec.timeout)
        try:
            await asyncio.gather(*(_async_stream(s, client, spec.model, rec)
                                   for s in streams))
        finally:
            await client.close()
    asyncio.run(main())


RUNNERS = {
    "grpc-callback": _run_grpc_callback,
    "grpc-threads": _run_grpc_threads,
    "grpc-aio": _run_grpc_aio,
    "http-gevent": _run_http_gevent,
    "http-aio": _run_http_aio,
}


class PointSession:
    """Set up one point in this process (streams, shm regions registered with the
    server), run it, and undo the setup even when something failed."""

    def __init__(self, spec: PointSpec):
        from tritonclient.utils import triton_to_np_dtype
        self.spec = spec
        np_dtype = triton_to_np_dtype(spec.dtype)
        if np_dtype is None or spec.dtype == "BYTES":
            raise ValueError(f"unsupported --dtype {spec.dtype} (numeric types only)")
        if spec.protocol == "grpc":
            import tritonclient.grpc as mod
        else:
            import tritonclient.http as mod
        self.mod = mod
        self.control = None  # a blocking client for registration, off the measured path
        self.streams = [Stream(spec, i, mod, np_dtype) for i in range(spec.streams)]
        self.registered: list[str] = []

    def setup(self):
        if self.spec.shm == "none":
            return
        self.control = self.mod.InferenceServerClient(self.spec.url)
        for s in self.streams:
            s.create_regions()
            s.register(self.control, self.registered)

    def run(self, t0: float) -> dict:
        global _running
        rec = Recorder(t0, self.spec.warmup, self.spec.duration, self.spec.max_requests)
        _running = rec
        try:
            RUNNERS[self.spec.impl](self.streams, self.spec, rec)
        finally:
            _running = None
        if _signalled:  # the streams were stopped by a signal: unwind now
            raise SystemExit(128 + _signalled)
        return rec.result()

    def teardown(self):
        for name in self.registered:  # only names the control client registered
            try:
                if self.spec.shm == "cuda":
                    self.control.unregister_cuda_shared_memory(name)
                else:
                    self.control.unregister_system_shared_memory(name)
            except Exception as e:
                print(f"bench: unregistering {name} failed: {e}", file=sys.stderr)
        self.registered = []
        for s in self.streams:
            s.destroy_regions()
        if self.control is not None:
            try:
                self.control.close()
            except Exception:
                pass
            self.control = None


# ----------------------------------------------------------------------------------------
# client processes


_running: Recorder | None = None  # the point this client process is measuring
_signalled = 0


def _on_signal(signum, frame):
    """SIGINT/SIGTERM in a client process: stop the streams (they finish their in-flight
    request and return) or, outside a run, unwind at once; either way the finally
    blocks unregister and destroy the shm regions. Later signals are ignored so they
    cannot cut that cleanup short."""
    global _signalled
    _signalled = signum
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if _running is not None:
        _running.stop()  # raising here could land in any stream's greenlet or callback
        return
    raise SystemExit(128 + signum)


def _worker_main(conn):
    """A client process: for each point, set up, report ready, wait for the common start
    time, run, tear down, report. SIGTERM and Ctrl-C unwind through the teardown."""
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        while _serve_one_point(conn):
            pass
    except (KeyboardInterrupt, SystemExit):
        pass


def _serve_one_point(conn) -> bool:
    try:
        msg = conn.recv()
    except EOFError:
        return False
    if msg[0] == "exit":
        return False
    session = None
    try:
        try:
            session = PointSession(PointSpec(**msg[1]))
            session.setup()
            conn.send(("ready", None))
        except Exception as e:
            conn.send(("ready", f"setup failed: {type(e).__name__}: {e}"))
        cmd = conn.recv()
        if cmd[0] != "go" or session is None:
            conn.send(("result", None))
            return True
        try:
            result = session.run(cmd[1])
        except Exception as e:  # a client bug must not leave the parent waiting
            result = {"latencies": [], "seconds": 0.0, "errors": 1, "mismatches": 0,
                      "cpu_s": 0.0, "first_error": f"client failed: "
                                                   f"{type(e).__name__}: {e}"[:500]}
        conn.send(("result", result))
        return True
    finally:
        if session is not None:
            session.teardown()


class SetupError(Exception):
    """A point could not be set up (e.g. the server refused a shm region)."""


class ClientPool:
    """`n` spawned client processes, kept across points so each point starts at once."""

    def __init__(self, n: int, window_file: str | None = None):
        self.n = n
        self.workers = []
        # where to announce each point's measured window (CLOCK_MONOTONIC seconds), so
        # a caller sampling CPU times can sample inside it
        self.window_file = window_file
        self._start()

    def _start(self):
        ctx = multiprocessing.get_context("spawn")
        for _ in range(self.n):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=(child,), daemon=True)
            p.start()
            child.close()
            self.workers.append((p, parent))

    def run_point(self, specs: list[PointSpec]) -> list[dict]:
        try:
            return self._run_point(specs)
        except RuntimeError:
            # a worker died or hangs: it may still answer later, so start afresh
            self.close(now=True)
            self._start()
            raise

    def _run_point(self, specs: list[PointSpec]) -> list[dict]:
        used = self.workers[: len(specs)]
        for (_, conn), spec in zip(used, specs):
            conn.send(("point", asdict(spec)))
        problems = [m for m in (self._recv(w, "ready", 300) for w in used) if m]
        if problems:
            for _, conn in used:
                conn.send(("abort", None))
            for w in used:
                self._recv(w, "result", 60)
            raise SetupError("; ".join(problems))
        t0 = time.perf_counter() + 0.05  # CLOCK_MONOTONIC: the same clock in every process
        for _, conn in used:
            conn.send(("go", t0))
        if self.window_file:
            start = t0 + specs[0].warmup
            tmp = self.window_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"start": start, "end": start + specs[0].duration}, f)
            os.replace(tmp, self.window_file)  # readers never see half a file
        # streams stop issuing at the deadline; the last request may take `timeout`
        wait = specs[0].warmup + specs[0].duration + specs[0].timeout + 60
        return [self._recv(w, "result", wait) for w in used]

    @staticmethod
    def _recv(worker, kind, timeout):
        proc, conn = worker
        deadline = time.monotonic() + timeout
        while not conn.poll(0.5):
            if not proc.is_alive():
                raise RuntimeError(f"client process {proc.pid} died "
                                   f"(exit code {proc.exitcode})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"client process {proc.pid} sent no {kind!r} "
                                   f"within {timeout:.0f}s")
        tag, payload = conn.recv()
        if tag != kind:
            raise RuntimeError(f"client process {proc.pid} sent {tag!r}, not {kind!r}")
        return payload

    def close(self, now: bool = False):
        """Stop the client processes. `now` (an interrupt, a broken point): SIGTERM at
        once, which stops a running point early; otherwise ask them to exit."""
        for p, conn in self.workers:
            try:
                if now:
                    p.terminate()
                else:
                    conn.send(("exit", None))
            except Exception:
                pass
        for p, conn in self.workers:
            p.join(timeout=30)  # room for in-flight requests and the shm teardown
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
            conn.close()
        self.workers = []

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(now=exc_type is not None)


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
