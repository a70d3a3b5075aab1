"""shmserve-bench's command line and what it makes of it: the options (shmserve's own
spellings and perf_analyzer's, scheduler/bench/pa_flags.py), and the BenchConfig of one
sweep that scheduler/bench/main.py runs (compare.py builds BenchConfigs too). A client
module, never imported by the server's processes.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from scheduler.bench.client import RUNNERS
from scheduler.bench.inputs import DEFAULT_VARIABLE_DIM, parse_named_shape
from scheduler.bench.pa_flags import (
    check_input_data, expand_range, parse_header, parse_id_range,
    parse_request_parameter, table_text,
)

DESCRIPTION = "Load generator for any server that speaks Triton's protocols."

DEFAULT_IMPL = {"grpc": "grpc-callback", "http": "http-gevent"}
IMPLS = {
    "grpc": ("grpc-callback", "grpc-aio", "grpc-threads"),
    "http": ("http-gevent", "http-aio"),
}
NUMERIC_DTYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                  "INT64", "FP16", "FP32", "FP64")


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


@dataclass
class BenchConfig:
    """Everything one sweep needs; compare.py builds these too. Without `workloads`
    each of `shapes` is sent as one input (`input_name`, `dtype`) and one output, as
    compare.py does; main() reads every input from the model's metadata instead."""

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
    named_shapes: dict = field(default_factory=dict)  # NAME -> dims after the batch dim
    batch_size: int = 1
    input_data: str = "random"
    output_shm_size: int = 102400
    request_rates: list = field(default_factory=list)  # open loop points (requests/s)
    distribution: str = "constant"
    max_inflight: int = 64  # open loop: requests in flight at most (all processes)
    percentile: float | None = None
    stability_percentage: float = 10.0
    max_trials: int = 1
    server_pid: int | None = None
    profile_role: str | None = None
    profile_native: bool = False
    workloads: list | None = None  # one Workload per point of the shape sweep
    model_version: str = ""
    streaming: bool = False  # requests over the gRPC stream (grpc-stream)
    headers: dict = field(default_factory=dict)  # HTTP only, as perf_analyzer's -H
    parameters: dict = field(default_factory=dict)  # request parameters
    compression: str | None = None  # gRPC request compression
    string_length: int | None = None
    string_data: str | None = None
    # a sequence model's: {"length", "variation", "id_start", "id_end"}, set once the
    # model's config says it has a sequence batcher
    sequence: dict | None = None
    sequence_length: int | None = None  # None: each data stream's steps, else 20
    sequence_variation: float = 20.0
    sequence_ids: tuple = (1, None)
    latency_threshold_ms: float | None = None
    verbose: int = 0

    def client_impl(self) -> str:
        if self.streaming:
            return "grpc-stream"
        if self.request_rates:
            return f"{self.protocol}-aio"  # the open loop runs on asyncio clients
        return self.impl or DEFAULT_IMPL[self.protocol]

    def loads(self) -> list[tuple[int, float]]:
        """(concurrency, request rate) of each load point: a concurrency sweep, or the
        open loop's rates at `max_inflight` slots."""
        if self.request_rates:
            return [(self.max_inflight, r) for r in self.request_rates]
        return [(c, 0.0) for c in self.concurrency]


def default_verify(model: str) -> bool:
    """Identity models echo their input, so their outputs can be checked."""
    return "identity" in model.lower()


def parse_float_list(text: str) -> list[float]:
    """'100,200.5' -> [100.0, 200.5]; every item must be positive."""
    out = [float(t) for t in str(text).split(",") if t.strip()]
    if not out or any(v <= 0 for v in out):
        raise ValueError(f"need positive numbers: {text!r}")
    return out


def _arg(parse, *extra):
    """`parse` for argparse: its ValueError's text becomes the error argparse prints."""
    def wrapped(text):
        try:
            return parse(text, *extra)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    wrapped.__name__ = parse.__name__
    return wrapped


class _ListFlags(argparse.Action):
    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        print(table_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="`shmserve-bench plot OUT.png RUN.json [RUN.json ...]` draws earlier runs "
               "on one plot. perf_analyzer's flags are taken with the same meaning; "
               "--list-flags shows which, and why the others are refused.")
    p.add_argument("--list-flags", action=_ListFlags,
                   help="print perf_analyzer's flags: which are taken, which refused, why")
    p.add_argument("-u", "--url", default=None,
                   help="host:port (default 127.0.0.1:8000 for http, :8001 for grpc)")
    p.add_argument("-i", "--protocol", choices=["http", "grpc"], default="grpc",
                   type=str.lower)
    p.add_argument("-m", "--model", default="identity_fp32")
    p.add_argument("-x", "--model-version", default="",
                   help="the model's version (default: the newest)")
    p.add_argument("--service-kind", choices=["triton"], default="triton",
                   help=argparse.SUPPRESS)  # perf_analyzer's; other kinds are refused
    p.add_argument("-v", dest="verbose", action="count", default=0,
                   help="print every measurement window")
    g = p.add_argument_group("inputs (read from the model's metadata)")
    g.add_argument("--shape", action="append", type=parse_named_shape,
                   metavar="[NAME:]1,16",
                   help="NAME:16 gives input NAME's dims after the batch dim, as "
                        "perf_analyzer's --shape (variable dims otherwise default to "
                        f"{DEFAULT_VARIABLE_DIM}); an unnamed 1,16 is the whole request "
                        "shape of every input; repeat unnamed ones for a sweep")
    g.add_argument("-b", "--batch-size", type=int, default=1,
                   help="the batch dim of a batching model's inputs (default 1)")
    g.add_argument("-z", dest="input_data", action="store_const", const="zero",
                   default="random",
                   help="--input-data zero")
    g.add_argument("--string-length", type=int, default=None,
                   help="characters of a random BYTES element (default 16)")
    g.add_argument("--string-data", default=None,
                   help="every BYTES element holds this text")
    g.add_argument("--input-tensor-format", "--output-tensor-format", choices=["binary"],
                   default="binary", help=argparse.SUPPRESS)  # json is refused
    g.add_argument("--input-data", default="random", metavar="random|zero|FILE.json",
                   help="what inputs hold: random values, zeros, or perf_analyzer's JSON "
                        'input data ({"data": [{"INPUT0": [...], ...}, ...]}; each '
                        "stream takes one entry in turn)")
    g.add_argument("--dtype", default=None, type=str.upper,
                   help="send the inputs as this datatype instead of the model's")
    g.add_argument("--input-name", default=None, help="send only this input")
    g.add_argument("--output-name", default=None, help="ask only for this output")
    g.add_argument("--output-shm-size", "--output-shared-memory-size", type=int,
                   default=102400,
                   help="bytes of an output's shm region when its size is not known")
    g = p.add_argument_group("load")
    g.add_argument("--concurrency", type=parse_int_list, default=[1], metavar="1,4,16",
                   help="closed loop: concurrent streams per point; a list is a sweep")
    g.add_argument("--concurrency-range", dest="concurrency", metavar="START:END:STEP",
                   type=_arg(expand_range, int), help="the same as a list")
    g.add_argument("-t", dest="concurrency", type=lambda t: parse_int_list(t)[:1],
                   help=argparse.SUPPRESS)  # perf_analyzer's deprecated spelling
    g.add_argument("--request-rate", type=parse_float_list, default=None,
                   metavar="100,200",
                   help="open loop instead: requests/s sent on a fixed schedule whatever "
                        "the server answers; latency counts from the scheduled time")
    g.add_argument("--request-rate-range", dest="request_rate", metavar="START:END:STEP",
                   type=_arg(expand_range, float), help="the same as a list")
    g.add_argument("-l", "--latency-threshold", type=float, default=None, metavar="MS",
                   help="end the sweep after a point whose latency (--percentile, else "
                        "the average) exceeds this")
    g.add_argument("--max-threads", type=int, default=None, help=argparse.SUPPRESS)
    g.add_argument("--measurement-mode", choices=["time_windows"], default="time_windows",
                   help=argparse.SUPPRESS)
    g.add_argument("--request-distribution", choices=["constant", "poisson"],
                   default="constant", help="the open loop's gaps between sends")
    g.add_argument("--max-inflight", type=int, default=64,
                   help="open loop: requests in flight at most; a send that finds none "
                        "free waits and counts as late")
    g.add_argument("--duration", type=float, default=5.0,
                   help="seconds measured per window")
    g.add_argument("-p", "--measurement-interval", dest="duration", metavar="MS",
                   type=lambda t: float(t) / 1e3, help="the same in milliseconds")
    g.add_argument("--max-requests", type=int, default=None,
                   help="stop a window after this many requests (whichever comes first)")
    g.add_argument("--warmup", type=float, default=1.0,
                   help="unmeasured seconds before a point")
    g.add_argument("--timeout", type=float, default=30.0,
                   help="seconds one request may take; a slower one is an error")
    g.add_argument("--percentile", type=float, default=None, metavar="P",
                   help="report the P-th percentile latency and use it for stability "
                        "(as perf_analyzer); implies --max-trials 10")
    g.add_argument("-s", "--stability-percentage", type=float, default=10.0,
                   help="windows are stable when throughput and latency of the last 3 "
                        "are within this percent (max/min)")
    g.add_argument("-r", "--max-trials", type=int, default=None,
                   help="windows per point at most until stable (default 1: one window; "
                        "10 with --percentile)")
    p.add_argument("--shm", "--shared-memory", choices=["none", "system", "cuda"],
                   default="none",
                   help="where tensors travel: in the request (none), or in POSIX (system) "
                        "or CUDA shared-memory regions registered with the server")
    p.add_argument("--cuda-device", type=int, default=0,
                   help="the GPU that holds the regions with --shm cuda")
    p.add_argument("--verify", action=argparse.BooleanOptionalAction, default=None,
                   help="check output k == input k (default: on when the model name "
                        "contains 'identity')")
    p.add_argument("--client-processes", type=int, default=1,
                   help="split each point's streams over this many client processes")
    p.add_argument("-a", "--async", dest="call_mode", action="store_const",
                   const="async", default=None,
                   help="asynchronous calls: grpc-callback or http-aio")
    p.add_argument("--sync", dest="call_mode", action="store_const", const="sync",
                   help="blocking calls: grpc-threads or http-gevent")
    p.add_argument("--client-impl", default=None,
                   choices=sorted(RUNNERS), help="client technique (default: "
                   + ", ".join(f"{k}: {v}" for k, v in DEFAULT_IMPL.items()) + ")")
    g = p.add_argument_group("requests")
    g.add_argument("--streaming", action="store_true",
                   help="send over the gRPC stream (a decoupled model needs it); reports "
                        "time to first response and responses/s")
    g.add_argument("-H", dest="headers", action="append", type=_arg(parse_header),
                   default=[],
                   metavar="NAME:VALUE", help="a header on every HTTP request")
    g.add_argument("--grpc-compression-algorithm", choices=["none", "gzip", "deflate"],
                   default="none")
    g.add_argument("--request-parameter", dest="parameters", action="append", default=[],
                   type=_arg(parse_request_parameter), metavar="NAME:VALUE:TYPE",
                   help="a request parameter (bool, int, string) on every request")
    g = p.add_argument_group("sequence models (found from the model's config)")
    g.add_argument("--sequence-length", type=int, default=None, metavar="N",
                   help="requests per sequence (default: the steps of each JSON "
                        "--input-data stream, else 20)")
    g.add_argument("--sequence-length-variation", type=float, default=20.0, metavar="PCT",
                   help="each length within +/- PCT%% of --sequence-length (default 20)")
    g.add_argument("--sequence-id-range", type=_arg(parse_id_range), default=(1, None),
                   metavar="START[:END]", help="correlation ids, END excluded")
    g.add_argument("--serial-sequences", action="store_true", help=argparse.SUPPRESS)
    g = p.add_argument_group("the server's side")
    g.add_argument("--server-pid", type=int, default=None,
                   help="the server's top process, for CPU per request by role (default: "
                        "found from the local port the bench talks to)")
    g.add_argument("--profile-role", default=None, metavar="ROLE",
                   help="run py-spy on the first process of ROLE (frontend, frontend 1, "
                        "scheduler, worker MODEL/..., tritonserver) for each window and "
                        "print its top functions")
    g.add_argument("--profile-native", action="store_true",
                   help="--profile-role samples native frames too (C extensions, the "
                        "CUDA libraries): where a role's time goes below Python")
    g = p.add_argument_group("output")
    g.add_argument("--json", default=None, metavar="PATH", help="write all rows as JSON")
    g.add_argument("--csv", default=None, metavar="PATH",
                   help="write all rows as CSV (perf_analyzer's column names, us, and "
                        "the bench's own columns)")
    g.add_argument("-f", dest="pa_csv", default=None, metavar="PATH",
                   help="write perf_analyzer's CSV: its columns in its order")
    g.add_argument("--verbose-csv", action="store_true",
                   help="-f adds Avg latency, request/response, response wait")
    g.add_argument("--plot", default=None, metavar="PATH.png",
                   help="plot throughput against p50/p99 latency (needs matplotlib)")
    g.add_argument("--plot-with", action="append", default=[], metavar="RUN.json",
                   help="draw an earlier run's JSON on the same plot; repeatable")
    g.add_argument("--server-name", default="", help="label for the rows and the plot")
    g.add_argument("--window-file", default=None, metavar="PATH",
                   help="write each point's measured window (start and end, "
                        "CLOCK_MONOTONIC seconds) here, for tools sampling CPU time")
    return p


CALL_MODES = {("grpc", "async"): "grpc-callback", ("grpc", "sync"): "grpc-threads",
              ("http", "async"): "http-aio", ("http", "sync"): "http-gevent"}


def config_from_args(args) -> BenchConfig:
    check_input_data(args.input_data)
    if args.streaming and args.protocol != "grpc":
        raise SystemExit("bench: --streaming needs -i grpc: the stream is gRPC's")
    if args.streaming and (args.request_rate or args.shm != "none"):
        raise SystemExit("bench: --streaming runs the closed loop without shared memory: "
                         "drop --request-rate(-range) and --shared-memory")
    if args.call_mode and args.client_impl:
        raise SystemExit("bench: give --async/--sync or --client-impl, not both")
    if args.call_mode:
        args.client_impl = CALL_MODES[(args.protocol, args.call_mode)]
    if (args.sequence_length is not None and args.sequence_length < 1) \
            or not 0 <= args.sequence_length_variation < 100:
        raise SystemExit("bench: --sequence-length must be >= 1 and "
                         "--sequence-length-variation within [0, 100)")
    if args.client_impl and not args.client_impl.startswith(args.protocol):
        raise SystemExit(f"bench: --client-impl {args.client_impl} does not speak "
                         f"{args.protocol}")
    if args.dtype is not None and args.dtype not in NUMERIC_DTYPES + ("BYTES",):
        raise SystemExit(f"bench: --dtype {args.dtype} is not supported "
                         f"(one of {', '.join(NUMERIC_DTYPES)}, BYTES)")
    if args.client_processes < 1:
        raise SystemExit("bench: --client-processes must be >= 1")
    if args.max_requests is not None and args.max_requests < 1:
        raise SystemExit("bench: --max-requests must be >= 1")
    if args.batch_size < 1 or args.max_inflight < 1:
        raise SystemExit("bench: --batch-size and --max-inflight must be >= 1")
    if args.percentile is not None and not 0 < args.percentile < 100:
        raise SystemExit("bench: --percentile must be between 0 and 100")
    max_trials = args.max_trials if args.max_trials is not None else \
        (10 if args.percentile is not None else 1)
    if max_trials < 1:
        raise SystemExit("bench: --max-trials must be >= 1")
    if args.input_data not in ("random", "zero") and not os.path.isfile(args.input_data):
        raise SystemExit(f"bench: --input-data {args.input_data}: no such file")
    unnamed = [dims for name, dims in (args.shape or []) if name is None]
    named = {name: dims for name, dims in (args.shape or []) if name is not None}
    url = args.url or ("127.0.0.1:8000" if args.protocol == "http" else "127.0.0.1:8001")
    return BenchConfig(
        url=url, protocol=args.protocol, model=args.model,
        shapes=unnamed or ([] if named else [[1, 16]]), dtype=args.dtype or "FP32",
        input_name=args.input_name or "INPUT0",
        output_name=args.output_name or "OUTPUT0", concurrency=args.concurrency,
        duration=args.duration, max_requests=args.max_requests, warmup=args.warmup,
        timeout=args.timeout, shm=args.shm, cuda_device=args.cuda_device,
        verify=default_verify(args.model) if args.verify is None else args.verify,
        client_processes=args.client_processes, impl=args.client_impl,
        server=args.server_name, named_shapes=named, batch_size=args.batch_size,
        input_data=args.input_data, output_shm_size=args.output_shm_size,
        request_rates=args.request_rate or [], distribution=args.request_distribution,
        max_inflight=args.max_inflight, percentile=args.percentile,
        stability_percentage=args.stability_percentage, max_trials=max_trials,
        server_pid=args.server_pid, profile_role=args.profile_role,
        profile_native=args.profile_native,
        model_version=args.model_version, streaming=args.streaming,
        headers=dict(args.headers), parameters=dict(args.parameters),
        compression=(None if args.grpc_compression_algorithm == "none"
                     else args.grpc_compression_algorithm),
        string_length=args.string_length, string_data=args.string_data,
        sequence_length=args.sequence_length,
        sequence_variation=args.sequence_length_variation,
        sequence_ids=args.sequence_id_range, latency_threshold_ms=args.latency_threshold,
        verbose=args.verbose)


def sequence_plan(cfg: BenchConfig) -> dict:
    """What every client process needs to drive sequences (scheduler/bench/sequences.py);
    refuses an id range too small for the concurrency, as perf_analyzer does."""
    start, end = cfg.sequence_ids
    if end is not None and end - start < max(cfg.concurrency):
        raise ValueError(f"--sequence-id-range {start}:{end} holds {end - start} ids, "
                         f"fewer than the {max(cfg.concurrency)} sequences in flight at "
                         "concurrency " + str(max(cfg.concurrency)))
    from_data = cfg.input_data not in ("random", "zero")
    if from_data and cfg.shm != "none":
        raise ValueError("a sequence model's JSON input data is sent step by step in the "
                         "requests: use --shared-memory none")
    length = cfg.sequence_length
    if length is None and not from_data:
        length = 20  # perf_analyzer's default
    return {"length": length,
            # a length taken from the data is not varied (perf_analyzer's rule)
            "variation": cfg.sequence_variation if length is not None else 0.0,
            "id_start": start, "id_end": end}
