"""Prometheus metrics on `--metrics-port`, served by the scheduler process.

The scheduler holds every model's statistics (fed by the workers' BatchDone and its
own queue), so one process answers for all of them, whichever frontend took the
requests. A scrape renders the counters there and then; nothing is kept per request
beyond what statistics keep anyway.

Names, help texts and labels (`model`, `version`, and `reason` on failures) are
Triton's. Counters carry no `_total` suffix, as in Triton; prometheus_client's writer
always adds one, so the text format (version 0.0.4) is written here, and the tests read
it back with prometheus_client's parser and a real Prometheus.

Beyond Triton, latency histograms are on by default (Triton's
`nv_inference_first_response_histogram_ms`, and request, queue and compute ones), so a
fleet can aggregate p95 and p99; `--metrics-config histogram_latencies=false` turns
them off, `counter_latencies=false` the cumulative duration counters.
"""

from __future__ import annotations

import asyncio
import logging
import math

from scheduler.stats import FAILURE_REASONS

log = logging.getLogger("shmserve.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# name -> (type, help): Triton's help texts
_FAMILIES = {
    "nv_inference_request_success": (
        "counter", "Number of successful inference requests, all batch sizes"),
    "nv_inference_request_failure": (
        "counter", "Number of failed inference requests, all batch sizes"),
    "nv_inference_count": (
        "counter", "Number of inferences performed (does not include cached requests)"),
    "nv_inference_exec_count": (
        "counter", "Number of model executions performed (does not include cached "
        "requests)"),
    "nv_inference_request_duration_us": (
        "counter", "Cumulative inference request duration in microseconds (includes "
        "cached requests)"),
    "nv_inference_queue_duration_us": (
        "counter", "Cumulative inference queuing duration in microseconds (includes "
        "cached requests)"),
    "nv_inference_compute_input_duration_us": (
        "counter", "Cumulative compute input duration in microseconds (does not include "
        "cached requests)"),
    "nv_inference_compute_infer_duration_us": (
        "counter", "Cumulative compute inference duration in microseconds (does not "
        "include cached requests)"),
    "nv_inference_compute_output_duration_us": (
        "counter", "Cumulative inference compute output duration in microseconds (does "
        "not include cached requests)"),
    "nv_inference_pending_request_count": (
        "gauge", "Instantaneous number of pending requests awaiting execution per-model."),
    "nv_model_load_duration_secs": ("gauge", "Model load time in seconds"),
    "nv_cache_num_hits_per_model": ("counter", "Number of cache hits per model"),
    "nv_cache_hit_duration_per_model": (
        "counter", "Total cache hit duration per model, in microseconds"),
    "nv_cache_num_misses_per_model": ("counter", "Number of cache misses per model"),
    "nv_cache_miss_duration_per_model": (
        "counter", "Total cache miss (insert+lookup) duration per model, in microseconds"),
    "nv_inference_first_response_histogram_ms": (
        "histogram", "Duration from request to first response in milliseconds"),
    "nv_inference_request_histogram_ms": (
        "histogram", "Duration from request start to end in milliseconds"),
    "nv_inference_queue_histogram_ms": (
        "histogram", "Duration a request waited in the queue in milliseconds"),
    "nv_inference_compute_histogram_ms": (
        "histogram", "Duration of each model execution (compute input, infer and output) "
        "in milliseconds"),
    "nv_gpu_utilization": ("gauge", "GPU utilization rate [0.0 - 1.0)"),
    "nv_gpu_memory_total_bytes": ("gauge", "GPU total memory, in bytes"),
    "nv_gpu_memory_used_bytes": ("gauge", "GPU used memory, in bytes"),
    "nv_gpu_power_usage": ("gauge", "GPU power usage in watts"),
    "nv_gpu_power_limit": ("gauge", "GPU power management limit in watts"),
    "nv_energy_consumption": (
        "counter", "GPU energy consumption in joules since the Triton Server started"),
    "nv_cpu_utilization": ("gauge", "CPU utilization rate [0.0 - 1.0]"),
    "nv_cpu_memory_total_bytes": ("gauge", "CPU total memory (RAM), in bytes"),
    "nv_cpu_memory_used_bytes": ("gauge", "CPU used memory (RAM), in bytes"),
}


def parse_metrics_config(items: list[str]) -> dict[str, str]:
    """`--metrics-config NAME=VALUE` items (Triton's spelling)."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise ValueError(f"--metrics-config option format is '<setting>=<value>'. "
                             f"Got {item}")
        out[name.strip()] = value.strip()
    return out


def option_on(config: dict[str, str], name: str) -> bool:
    """A --metrics-config switch (counter_latencies, histogram_latencies): on unless
    set to something other than 1/true/yes/on."""
    value = config.get(name)
    return value is None or value.lower() in ("1", "true", "yes", "on")


def _number(value) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _labels(labels: dict) -> str:
    if not labels:
        return ""
    parts = []
    for k, v in labels.items():
        v = str(v).replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')
        parts.append(f'{k}="{v}"')
    return "{" + ",".join(parts) + "}"


class _Writer:
    def __init__(self):
        self.families: dict[str, list[str]] = {}

    def sample(self, family: str, labels: dict, value, suffix: str = "") -> None:
        self.families.setdefault(family, []).append(
            f"{family}{suffix}{_labels(labels)} {_number(value)}\n")

    def histogram(self, family: str, labels: dict, hist) -> None:
        for bound, count in hist.cumulative():
            self.sample(family, {**labels, "le": bound}, count, "_bucket")
        total = hist.cumulative()[-1][1]
        self.sample(family, labels, hist.sum, "_sum")
        self.sample(family, labels, total, "_count")

    def text(self) -> bytes:
        out = []
        for family, lines in self.families.items():
            kind, help_text = _FAMILIES[family]
            help_text = help_text.replace("\\", r"\\").replace("\n", r"\n")
            out.append(f"# HELP {family} {help_text}\n# TYPE {family} {kind}\n")
            out.extend(lines)
        return "".join(out).encode()


class CpuSampler:
    """nv_cpu_utilization over the last interval, and memory, from /proc."""

    def __init__(self):
        self.utilization = 0.0
        self.total_bytes = 0
        self.used_bytes = 0
        self._last: tuple[int, int] | None = None
        self.sample()

    def sample(self) -> None:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
            idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
            total = sum(fields[:8])
            if self._last is not None:
                d_total = total - self._last[0]
                d_idle = idle - self._last[1]
                self.utilization = (d_total - d_idle) / d_total if d_total > 0 else 0.0
            self._last = (total, idle)
            mem = {}
            with open("/proc/meminfo") as f:
                for line in f:
                    key, _, rest = line.partition(":")
                    mem[key] = int(rest.split()[0]) * 1024
            self.total_bytes = mem.get("MemTotal", 0)
            self.used_bytes = self.total_bytes - mem.get("MemAvailable", mem.get("MemFree", 0))
        except (OSError, ValueError, IndexError):
            pass


class GpuSampler:
    """The nv_gpu_* families from NVML (the `nvidia-ml-py` package of the gpu extra),
    one series per GPU labelled with its UUID, as Triton labels them. Without NVML or
    a GPU there are none, as on a CPU-only Triton."""

    def __init__(self):
        self.devices: list[tuple[str, object, int]] = []  # uuid, handle, energy at start
        self.values: dict[str, dict[str, float]] = {}
        try:
            import pynvml
            pynvml.nvmlInit()
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
                self.devices.append((uuid, handle, self._energy_mj(pynvml, handle)))
        except Exception as exc:  # no NVML library, no driver, no GPU
            log.debug("no GPU metrics: %s", exc)
            self.devices = []
            return
        self._nvml = pynvml
        self.sample()

    @staticmethod
    def _energy_mj(nvml, handle) -> int:
        try:
            return nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except Exception:  # older GPUs do not count energy
            return 0

    def sample(self) -> None:
        nvml = self._nvml if self.devices else None
        for uuid, handle, energy0 in self.devices:
            v = self.values.setdefault(uuid, {})
            for family, read in (
                    ("nv_gpu_utilization",
                     lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0),
                    ("nv_gpu_memory_total_bytes",
                     lambda: nvml.nvmlDeviceGetMemoryInfo(handle).total),
                    ("nv_gpu_memory_used_bytes",
                     lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used),
                    ("nv_gpu_power_usage",
                     lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),
                    ("nv_gpu_power_limit",
                     lambda: nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0),
                    ("nv_energy_consumption",
                     lambda: (self._energy_mj(nvml, handle) - energy0) / 1000.0)):
                try:
                    v[family] = read()
                except Exception:  # a reading this GPU does not support: left out
                    v.pop(family, None)

    def write(self, w: "_Writer") -> None:
        for uuid, values in self.values.items():
            for family, value in values.items():
                w.sample(family, {"gpu_uuid": uuid}, value)


class Metrics:
    """What a scrape shows: every ready model's counters, and the host's."""

    def __init__(self, manager, config: dict[str, str], cpu: bool = True,
                 gpu: bool = False):
        self.manager = manager
        self.counters = option_on(config, "counter_latencies")
        self.histograms = option_on(config, "histogram_latencies")
        self.cpu = CpuSampler() if cpu else None
        self.gpu = GpuSampler() if gpu else None

    def sample(self) -> None:
        """The per-interval families (--metrics-interval-ms)."""
        if self.cpu is not None:
            self.cpu.sample()
        if self.gpu is not None:
            self.gpu.sample()

    settle = None  # reads the statistics still on their way in first (the server's)

    def render(self) -> bytes:
        if self.settle is not None:
            self.settle()
        w = _Writer()
        for mv in self.manager.ready_versions():
            sched = mv.scheduler
            st = sched.stats
            labels = {"model": mv.name, "version": str(mv.version)}
            w.sample("nv_inference_request_success", labels, st.success_count)
            for reason in FAILURE_REASONS:
                w.sample("nv_inference_request_failure",
                         {"model": mv.name, "reason": reason, "version": str(mv.version)},
                         st.failures.get(reason, 0))
            w.sample("nv_inference_count", labels, st.inference_count)
            w.sample("nv_inference_exec_count", labels, st.execution_count)
            if self.counters:
                w.sample("nv_inference_request_duration_us", labels, st.success_ns // 1000)
                w.sample("nv_inference_queue_duration_us", labels, st.queue_ns // 1000)
                w.sample("nv_inference_compute_input_duration_us", labels,
                         st.compute_input_ns // 1000)
                w.sample("nv_inference_compute_infer_duration_us", labels,
                         st.compute_infer_ns // 1000)
                w.sample("nv_inference_compute_output_duration_us", labels,
                         st.compute_output_ns // 1000)
            if st.cache_enabled:
                # only for models that cache, as Triton shows them
                w.sample("nv_cache_num_hits_per_model", labels, st.cache_hit_count)
                w.sample("nv_cache_num_misses_per_model", labels, st.cache_miss_count)
                if self.counters:
                    w.sample("nv_cache_hit_duration_per_model", labels,
                             st.cache_hit_ns // 1000)
                    w.sample("nv_cache_miss_duration_per_model", labels,
                             st.cache_miss_ns // 1000)
            w.sample("nv_inference_pending_request_count", labels,
                     sched.pending + sched.waiting_at_instances)
            seconds = self.manager.load_seconds.get((mv.name, mv.version))
            if seconds is not None:
                w.sample("nv_model_load_duration_secs", labels, float(seconds))
            if self.histograms and st.histograms:
                w.histogram("nv_inference_first_response_histogram_ms", labels,
                            st.first_response_ms)
                w.histogram("nv_inference_request_histogram_ms", labels, st.request_ms)
                w.histogram("nv_inference_queue_histogram_ms", labels, st.queue_ms)
                w.histogram("nv_inference_compute_histogram_ms", labels, st.compute_ms)
        if self.gpu is not None:
            self.gpu.write(w)
        if self.cpu is not None:
            w.sample("nv_cpu_utilization", {}, float(self.cpu.utilization))
            w.sample("nv_cpu_memory_total_bytes", {}, self.cpu.total_bytes)
            w.sample("nv_cpu_memory_used_bytes", {}, self.cpu.used_bytes)
        return w.text()


class MetricsServer:
    """A small HTTP/1.1 server for GET /metrics on the scheduler's loop (scrapes are
    rare; the loop's own state is read with no locks)."""

    def __init__(self, metrics: Metrics, address: str, port: int, interval_ms: int):
        self.metrics = metrics
        self.address = address
        self.port = port
        self.interval_s = max(interval_ms, 1) / 1000
        self._server: asyncio.base_events.Server | None = None
        self._sampler: asyncio.Task | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.address, self.port,
                                                  reuse_address=True)
        if self.metrics.cpu is not None or self.metrics.gpu is not None:
            self._sampler = asyncio.get_running_loop().create_task(self._sample())

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.metrics.sample()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        try:
            while True:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
                line = head.split(b"\r\n", 1)[0].decode("latin-1").split()
                method, path = (line + ["", ""])[:2]
                close = b"connection: close" in head.lower()
                if method not in ("GET", "HEAD"):
                    status, body, ctype = "405 Method Not Allowed", b"", "text/plain"
                elif path.split("?")[0] == "/metrics":
                    status, body, ctype = "200 OK", self.metrics.render(), CONTENT_TYPE
                else:
                    status, body, ctype = "404 Not Found", b"", "text/plain"
                writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                             f"Content-Length: {len(body)}\r\n\r\n".encode()
                             + (body if method == "GET" else b""))
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError,
                asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()



async def start_metrics(args, manager, gpus: int, settle) -> MetricsServer | None:
    """The metrics endpoint the flags ask for (--allow-metrics and the rest), started;
    `settle` reads what is still on its way in before each scrape."""
    if not args.allow_metrics:
        return None
    metrics = Metrics(manager, args.metrics_config, cpu=args.allow_cpu_metrics,
                      gpu=args.allow_gpu_metrics and gpus > 0)
    metrics.settle = settle
    server = MetricsServer(metrics, args.metrics_address, args.metrics_port,
                           args.metrics_interval_ms)
    await server.start()
    log.info("Started Metrics Service at %s:%d", args.metrics_address, args.metrics_port)
    return server
