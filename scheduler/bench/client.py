"""The client processes of scripts/bench (scheduler/bench/main.py): what one process runs
for one point of the sweep (its streams, their tensors and shared-memory regions, the
client technique, closed or open loop), and the pool of spawned processes that run a
point together. A client module, never imported by the server's processes.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import resource
import signal
import sys
import threading
import time
import zlib
from dataclasses import asdict, dataclass

# Value written into element 0 of each request's input: a stale output region (the server
# did not write it) then shows as a mismatch. 127 is exact in every numeric dtype.
_STAMP_MODULUS = 127

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
    inputs: list  # [{"name", "datatype", "shape"}]: every input of a request
    outputs: list  # [{"name", "datatype", "nbytes"}]: the outputs asked for (-1: unknown)
    streams: int  # closed loop: concurrent streams; open loop: requests in flight at most
    shm: str  # "none" | "system" | "cuda"
    verify: bool
    warmup: float
    duration: float
    max_requests: int | None  # this process's share
    tag: str = ""  # makes shared-memory names unique
    stream_offset: int = 0
    cuda_device: int = 0  # where --shm cuda puts the regions
    input_data: str = "random"  # "random" | "zero" | a perf_analyzer JSON data file
    output_shm_size: int = 102400  # bytes of an output region whose size is unknown
    request_rate: float = 0.0  # > 0: open loop at this many requests/s (this process)
    distribution: str = "constant"  # of the open loop's send times: or "poisson"
    rate_phase: float = 0.0  # seconds this process's constant schedule is shifted by
    model_version: str = ""
    headers: dict | None = None  # HTTP headers on every request (perf_analyzer's -H)
    parameters: dict | None = None  # request parameters on every request
    compression: str | None = None  # gRPC request compression
    string_length: int | None = None
    string_data: str | None = None
    sequence: dict | None = None  # a sequence model's plan (scheduler/bench/sequences.py)
    total_streams: int = 1  # streams of the point over every process (sequence ids)


class Recorder:
    """Decides when streams stop and keeps what the measurement window saw. Shared by
    the streams of one process (the GIL makes the appends and counters safe). In the
    open loop (`drain`) a request sent inside the window counts however late it
    answers, and its latency runs from its scheduled send time."""

    def __init__(self, t0: float, warmup: float, duration: float, max_requests,
                 drain: bool = False):
        self.start = t0 + warmup
        self.deadline = self.start + duration
        self.max_requests = max_requests
        self.drain = drain
        self.issued = 0  # requests sent inside the window
        self.latencies: list[float] = []
        self.last_done = None
        self.errors = 0
        self.mismatches = 0
        self.late = 0  # open loop: in-window sends that left after their time
        self.unsent = 0  # open loop: in-window sends that never left
        self.first_error = ""
        self.sequences = 0  # sequences whose END was answered inside the window
        self.ttft: list[float] = []  # --streaming: send to first response, per request
        self.responses = 0  # --streaming: responses with outputs inside the window
        self.cpu_start = None
        self.wall_start = None
        self.stopped = False
        self._lock = threading.Lock()

    def stop(self):
        """End the point early: every stream stops before its next send."""
        self.stopped = True

    def next(self, at: float | None = None) -> bool:
        """Called before each send: False when the stream should stop. `at`: the
        send's scheduled time (open loop), which decides whether it is in the window."""
        now = time.perf_counter()
        if self.stopped or now >= self.deadline:
            return False
        if (now if at is None else at) >= self.start:
            with self._lock:
                if self.cpu_start is None:
                    self.cpu_start = _cpu_seconds()
                    self.wall_start = now
                if self.max_requests is not None and self.issued >= self.max_requests:
                    return False
                self.issued += 1
        return True

    def done(self, t_send: float, ok: bool, ended: bool = False) -> bool:
        """A request answered; `ended`: it carried sequence_end. True when it counts
        (sent inside the window and answered in time)."""
        t = time.perf_counter()
        if not ok:
            self.mismatches += 1
        if self.start <= t_send and (self.drain or t <= self.deadline):
            self.latencies.append(t - t_send)
            self.last_done = t
            self.sequences += ended
            return True
        return False

    def done_stream(self, t_send: float, t_first: float | None, responses: int, ok: bool,
                    ended: bool = False) -> None:
        """--streaming: a request's final flag came; `t_first` its first response with
        outputs (None: it had none), `responses` how many had outputs."""
        if self.done(t_send, ok, ended):
            self.responses += responses
            if t_first is not None:
                self.ttft.append(t_first - t_send)

    def error(self, exc: BaseException):
        self.errors += 1
        if not self.first_error:
            self.first_error = f"{type(exc).__name__}: {exc}"[:500]

    def result(self) -> dict:
        now = time.perf_counter()
        cpu = (_cpu_seconds() - self.cpu_start) if self.cpu_start is not None else 0.0
        if self.max_requests is not None and self.issued >= self.max_requests \
                and self.last_done is not None and not self.drain:
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
            "sent": self.issued,
            "late": self.late,
            "unsent": self.unsent,
            "sequences": self.sequences,
            "ttft": self.ttft,
            "responses": self.responses,
        }


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)  # all threads of this process
    return ru.ru_utime + ru.ru_stime


def _stamp_value(seq: int, np_dtype):
    import numpy as np
    if np_dtype == np.bool_:
        return bool(seq % 2)
    return seq % _STAMP_MODULUS


class _Tensor:
    """One input or output of a stream: its InferInput / InferRequestedOutput and, with
    shared memory, its region (handle, name, size, and a numpy view of a system one)."""

    def __init__(self, name: str, datatype: str, nbytes: int, request):
        self.name, self.datatype, self.nbytes = name, datatype, nbytes
        self.request = request
        self.region = ""
        self.handle = None
        self.view = None
        self.data = None  # an input's values; an output's expected values (or None)


def _region_value(arr):
    """What goes into a shm region: the array, or for BYTES its serialized form (each
    element length-prefixed), which tritonclient's region setters expect as given."""
    if arr.dtype != object:
        return arr
    from tritonclient.utils import serialize_byte_tensor
    return serialize_byte_tensor(arr)


def _cuda_regions():
    """CUDA regions through cupy, or tritonclient's utilities (scheduler/bench/cuda.py)."""
    from scheduler.bench.cuda import regions
    return regions()


def _byte_size(arr) -> int:
    """Bytes of a tensor on the wire: raw for numbers, length-prefixed for BYTES."""
    if arr.dtype != object:
        return arr.nbytes
    ser = _region_value(arr)
    return len(ser.item()) if ser.size == 1 and ser.dtype == object else ser.nbytes


class Stream:
    """One stream's tensors: every input of a request, its requested outputs, the
    outputs it expects back (an identity model's output k is its input k) and, with
    shared memory, a region per tensor: system (POSIX) or CUDA (device memory, shared
    by IPC handle). With CUDA regions the inputs live on the device and the outputs
    stay there: checking them costs a device-to-host copy, stamping one a host-to-device
    copy, so both happen only with verification on."""

    def __init__(self, spec: PointSpec, index: int, mod, entries=None,
                 data_streams=None, expected_streams=None):
        from scheduler.bench.inputs import TensorSpec, make_arrays
        self.spec = spec
        self.mod = mod  # tritonclient.http or tritonclient.grpc (both have InferInput)
        specs = [TensorSpec(**t) for t in spec.inputs]
        arrays = make_arrays(specs, spec.input_data, spec.stream_offset + index, entries,
                             spec.string_length, spec.string_data)
        self.sequence = None
        # a sequence model's JSON data streams: each request sends its step's tensors
        self.data_streams = data_streams if spec.sequence else None
        # the data file's validation_data, laid out as its streams; `expected_now`:
        # {output: flat values} the current request's response must hold
        self.expected_streams = expected_streams
        self.expected_now = None
        if expected_streams and not self.data_streams:
            flat = [e for s in expected_streams for e in s]
            self.expected_now = flat[(spec.stream_offset + index) % len(flat)]
        if spec.sequence:
            from scheduler.bench.sequences import SequenceDriver
            g = spec.stream_offset + index
            self.sequence = SequenceDriver(
                spec.sequence, g, spec.total_streams,
                seed=zlib.crc32(spec.tag.encode()) + g,
                lengths=[len(s) for s in data_streams] if self.data_streams else None)
        self.seq = 0
        self.inputs, self.outputs = [], []
        for t in specs:
            data = arrays[t.name]
            x = _Tensor(t.name, t.datatype, _byte_size(data),
                        mod.InferInput(t.name, list(data.shape), t.datatype))
            x.data = data
            self.inputs.append(x)
        for k, o in enumerate(spec.outputs):
            pair = self.inputs[k] if k < len(self.inputs) else None
            nbytes = o["nbytes"] if o.get("nbytes", -1) > 0 else \
                max(pair.nbytes if pair else 0, spec.output_shm_size)
            y = _Tensor(o["name"], o.get("datatype") or (pair.datatype if pair else ""),
                        nbytes, mod.InferRequestedOutput(o["name"]))
            if spec.verify and pair is not None and pair.datatype == y.datatype:
                y.data = pair.data  # an identity model echoes the same array
                if o.get("nbytes", -1) <= 0:
                    y.nbytes = max(pair.nbytes, 1)
            self.outputs.append(y)
        if spec.shm == "none":
            # the data never changes, so it is serialized once; an HTTP/gRPC response
            # carries its own bytes, so a stale output cannot go unnoticed
            for x in self.inputs:
                x.request.set_data_from_numpy(x.data)
        else:
            base = f"bench_{spec.tag}_{spec.stream_offset + index}"
            for k, x in enumerate(self.inputs):
                x.region = f"{base}_in{k}"
            for k, y in enumerate(self.outputs):
                y.region = f"{base}_out{k}"

    def base_kwargs(self) -> dict:
        """The infer call's keywords every request of this stream shares."""
        return _infer_kwargs(self)

    def request(self, kw: dict) -> tuple[dict, bool]:
        """The next request's keywords (a sequence's id and flags added) and whether it
        ends a sequence."""
        if self.sequence is None:
            return kw, False
        flags = self.sequence.next()
        if self.data_streams:
            self._set_step(self.sequence.data_index, self.sequence.step)
        return {**kw, **flags}, flags["sequence_end"]

    def _set_step(self, stream: int, step: int) -> None:
        """Put a data stream's step into the request (no shared memory: cli.py refuses
        data streams with it); an identity model's expected output follows."""
        steps = self.data_streams[stream]
        entry = steps[step % len(steps)]
        if self.expected_streams:
            want = self.expected_streams[stream]
            self.expected_now = want[step % len(want)]
        for k, x in enumerate(self.inputs):
            data = entry[x.name]
            x.request.set_shape(list(data.shape))
            x.request.set_data_from_numpy(data)
            if k < len(self.outputs) and self.outputs[k].data is x.data:
                self.outputs[k].data = data
            x.data = data

    def closing(self, kw: dict) -> dict | None:
        """Keywords of an unmeasured request ending this stream's open sequence, if one
        is open when the stream stops (see SequenceDriver.close)."""
        flags = self.sequence.close() if self.sequence is not None else None
        return None if flags is None else {**kw, **flags}

    def failed(self) -> None:
        if self.sequence is not None:
            self.sequence.failed()

    @property
    def expected(self):
        """The first input (what an identity model's first output must equal)."""
        return self.inputs[0].data

    def _tensors(self):
        return self.inputs + self.outputs

    # shared memory lifecycle: create_regions / register / unregister / destroy

    def create_regions(self):
        if self.spec.shm == "cuda":
            cudashm = _cuda_regions()
            dev = self.spec.cuda_device
            for t in self._tensors():
                t.handle = cudashm.create_shared_memory_region(t.region, t.nbytes, dev)
            for x in self.inputs:
                cudashm.set_shared_memory_region(x.handle, [_region_value(x.data)])
        else:
            import tritonclient.utils.shared_memory as shm
            for t in self._tensors():
                t.handle = shm.create_shared_memory_region(t.region, "/" + t.region,
                                                           t.nbytes, create_only=True)
            for x in self.inputs:
                if x.data.dtype == object:
                    shm.set_shared_memory_region(x.handle, [_region_value(x.data)])
                else:
                    x.view = shm.get_contents_as_numpy(x.handle, x.data.dtype,
                                                       x.data.shape)
                    x.view[...] = x.data
            for y in self.outputs:
                if y.data is not None and y.data.dtype != object:
                    y.view = shm.get_contents_as_numpy(y.handle, y.data.dtype,
                                                       y.data.shape)
        for t in self._tensors():
            t.request.set_shared_memory(t.region, t.nbytes)

    def register(self, control, registered: list):
        """Register every region with the server through the blocking `control` client,
        appending each name to `registered` once the server has it."""
        for t in self._tensors():
            if self.spec.shm == "cuda":
                cudashm = _cuda_regions()
                control.register_cuda_shared_memory(t.region, cudashm.get_raw_handle(t.handle),
                                                    self.spec.cuda_device, t.nbytes)
            else:
                control.register_system_shared_memory(t.region, "/" + t.region, t.nbytes)
            registered.append(t.region)

    def destroy_regions(self):
        if self.spec.shm == "cuda":
            shm = _cuda_regions()
        else:
            import tritonclient.utils.shared_memory as shm
        for t in self._tensors():
            t.view = None  # views pin the mapping
        for t in self._tensors():
            if t.handle is None:
                continue
            try:
                shm.destroy_shared_memory_region(t.handle)
            except Exception as e:  # keep going: the segment must not outlive us
                print(f"bench: destroying shm region {t.region} failed: {e}",
                      file=sys.stderr)
                if self.spec.shm == "system":
                    try:
                        os.unlink("/dev/shm/" + t.region)
                    except OSError:
                        pass
            t.handle = None

    def prepare(self):
        """Before each send: with shm, stamp a fresh value into each numeric input's
        region, so a stale output (the server did not write it) shows."""
        if self.spec.shm == "none" or (self.spec.shm == "cuda" and not self.spec.verify):
            return
        self.seq += 1
        for x in self.inputs:
            if x.data.dtype == object or x.data.size == 0:
                continue
            v = _stamp_value(self.seq, x.data.dtype)
            x.data.flat[0] = v
            if x.view is not None:
                x.view.flat[0] = v
            elif self.spec.shm == "cuda":
                _cuda_regions().set_shared_memory_region(x.handle, [x.data])

    def check(self, result) -> bool:
        import numpy as np
        if self.expected_now is not None:  # validation_data (responses carry outputs)
            for name, want in self.expected_now.items():
                got = result.as_numpy(name)
                if got is None or not np.array_equal(got.ravel(), want):
                    return False
        if not self.spec.verify:
            return True
        for y in self.outputs:
            if y.data is None:
                continue
            if self.spec.shm == "system":
                if y.view is None:
                    continue  # BYTES in a region: not read back
                got = y.view
            elif self.spec.shm == "cuda":
                if y.data.dtype == object:
                    continue
                got = _cuda_regions().get_contents_as_numpy(y.handle, y.data.dtype,
                                                            y.data.shape)
            else:
                got = result.as_numpy(y.name)
            if got is None or got.shape != y.data.shape or not np.array_equal(got, y.data):
                return False
        return True


def _infer_kwargs(stream: Stream) -> dict:
    spec = stream.spec
    kw = {"inputs": [x.request for x in stream.inputs],
          "outputs": [y.request for y in stream.outputs]}
    if spec.model_version:
        kw["model_version"] = spec.model_version
    if spec.parameters:
        kw["parameters"] = dict(spec.parameters)
    if stream.mod.__name__.startswith("tritonclient.grpc"):
        kw["client_timeout"] = spec.timeout  # HTTP clients take it at creation
        if spec.compression:
            kw["compression_algorithm"] = spec.compression
    elif spec.headers:
        kw["headers"] = dict(spec.headers)  # as perf_analyzer: HTTP only
    return kw


def _sync_stream(stream: Stream, infer, model: str, rec: Recorder, sleep=time.sleep):
    """Closed loop over a blocking infer call (threads, greenlets)."""
    base = stream.base_kwargs()
    while rec.next():
        stream.prepare()
        kw, ended = stream.request(base)
        t = time.perf_counter()
        try:
            res = infer(model, **kw)
        except Exception as e:
            rec.error(e)
            stream.failed()
            sleep(0.01)  # a dead server must not turn the loop into a spin
            continue
        rec.done(t, stream.check(res), ended)
    closing = stream.closing(base)
    if closing is not None:
        try:
            infer(model, **closing)
        except Exception:
            pass  # the server ends it at its idle timeout


async def _async_stream(stream: Stream, client, model: str, rec: Recorder):
    base = stream.base_kwargs()
    while rec.next():
        stream.prepare()
        kw, ended = stream.request(base)
        t = time.perf_counter()
        try:
            res = await client.infer(model, **kw)
        except Exception as e:
            rec.error(e)
            stream.failed()
            await asyncio.sleep(0.01)
            continue
        rec.done(t, stream.check(res), ended)
    closing = stream.closing(base)
    if closing is not None:
        try:
            await client.infer(model, **closing)
        except Exception:
            pass  # the server ends it at its idle timeout


def _run_grpc_callback(streams, spec, rec):
    """Each stream's next request is sent from the previous one's completion callback
    (run on grpc's own thread): no thread or event loop per stream."""
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(spec.url)
    finished = threading.Semaphore(0)

    def issue(stream, base):
        # a loop, not recursion, so a run of send failures cannot grow the stack
        while rec.next():
            stream.prepare()
            kw, ended = stream.request(base)
            t = time.perf_counter()

            def callback(result, error, stream=stream, base=base, t=t, ended=ended):
                try:
                    if error is not None:
                        rec.error(error)
                        stream.failed()
                        time.sleep(0.01)
                    else:
                        rec.done(t, stream.check(result), ended)
                except BaseException as e:  # an exception here would end the stream
                    rec.error(e)
                issue(stream, base)

            try:
                client.async_infer(spec.model, callback=callback, **kw)
                return
            except Exception as e:
                rec.error(e)
                stream.failed()
                time.sleep(0.01)
        closing = stream.closing(base)
        if closing is not None:
            try:  # its answer only releases the stream; a failure changes nothing
                client.async_infer(spec.model, callback=lambda result, error:
                                   finished.release(), **closing)
                return
            except Exception:
                pass
        finished.release()

    try:
        for s in streams:
            issue(s, s.base_kwargs())
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


def _run_open(streams, spec, rec, t0):
    """The open loop (--request-rate): asyncio clients of either protocol, requests sent
    on this process's schedule from t0 (warmup included) to the window's end."""
    from scheduler.bench.open_loop import run_open_loop, send_times
    seed = zlib.crc32(spec.tag.encode()) + spec.stream_offset  # reproducible
    times = send_times(spec.request_rate, spec.distribution, t0, rec.deadline, seed,
                       spec.rate_phase)
    kws = {id(s): s.base_kwargs() for s in streams}
    if spec.protocol == "grpc":
        import tritonclient.grpc.aio as aioclient
        make = lambda: aioclient.InferenceServerClient(spec.url)  # noqa: E731
    else:
        import tritonclient.http.aio as aioclient
        make = lambda: aioclient.InferenceServerClient(  # noqa: E731
            spec.url, conn_limit=len(streams), conn_timeout=spec.timeout)

    async def main():
        client = make()
        try:
            await run_open_loop(streams, lambda s: client.infer(spec.model, **kws[id(s)]),
                                rec, times)
        finally:
            await client.close()
    asyncio.run(main())


def _run_grpc_stream(streams, spec, rec):
    from scheduler.bench.streaming import run_stream
    run_stream(streams, spec, rec)


RUNNERS = {
    "grpc-callback": _run_grpc_callback,
    "grpc-stream": _run_grpc_stream,
    "grpc-threads": _run_grpc_threads,
    "grpc-aio": _run_grpc_aio,
    "http-gevent": _run_http_gevent,
    "http-aio": _run_http_aio,
}


class PointSession:
    """Set up one point in this process (streams, shm regions registered with the
    server), run it, and undo the setup even when something failed."""

    def __init__(self, spec: PointSpec):
        self.spec = spec
        if spec.protocol == "grpc":
            import tritonclient.grpc as mod
        else:
            import tritonclient.http as mod
        self.mod = mod
        self.control = None  # a blocking client for registration, off the measured path
        entries = streams = expected = None
        if spec.input_data not in ("random", "zero"):
            from scheduler.bench.inputs import (
                TensorSpec, load_input_streams, load_validation_streams,
            )
            streams = load_input_streams(spec.input_data,
                                         [TensorSpec(**t) for t in spec.inputs])
            entries = [e for s in streams for e in s]
            expected = load_validation_streams(spec.input_data, spec.outputs)
        self.streams = [Stream(spec, i, mod, entries, streams, expected)
                        for i in range(spec.streams)]
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
        rec = Recorder(t0, self.spec.warmup, self.spec.duration, self.spec.max_requests,
                       drain=self.spec.request_rate > 0)
        _running = rec
        try:
            if self.spec.request_rate > 0:
                _run_open(self.streams, self.spec, rec, t0)
            else:
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

    def run_point(self, specs: list[PointSpec], on_window=None) -> list[dict]:
        """Run one point; `on_window(start, end)` (perf_counter seconds of the measured
        window) is called once the clients have started, to sample inside the window."""
        try:
            return self._run_point(specs, on_window)
        except RuntimeError:
            # a worker died or hangs: it may still answer later, so start afresh
            self.close(now=True)
            self._start()
            raise

    def _run_point(self, specs: list[PointSpec], on_window=None) -> list[dict]:
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
        if on_window is not None:
            start = t0 + specs[0].warmup
            on_window(start, start + specs[0].duration)
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


