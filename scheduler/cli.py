"""The command line, with tritonserver's flag names and value spellings."""

from __future__ import annotations

import argparse
import logging
import os
import ssl
import stat

from scheduler.cache import parse_cache_config
from scheduler.log_settings import LOG_FORMATS, from_args
from scheduler.metrics import parse_metrics_config
from scheduler.scheduling.rate_limiter import parse_resource
from scheduler.trace import parse_trace_config
from shm.cpu_quota import cgroup_cpu_quota, usable_cpus
from shm.header_pattern import compile_forward_pattern
from shm.messages.roles import GrpcKeepalive


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: a prefix such as --model-repo is refused, so a typo cannot
    # silently pick a different flag and a flag added later cannot change what an
    # old command line means.
    p = argparse.ArgumentParser(
        prog="shmserve", allow_abbrev=False,
        description="A Triton-compatible inference server built from processes that "
                    "hand tensors over in shared memory.")
    # not required=True: argparse would then answer a mistyped flag with "required"
    # instead of naming it; parse_args checks it after the unknown flags
    p.add_argument("--model-repository", "--model-store", action="append", default=[],
                   metavar="DIR", help="model repository path (repeatable, required)")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--http-address", default="0.0.0.0")
    p.add_argument("--grpc-address", default="0.0.0.0")
    p.add_argument("--metrics-address", default="0.0.0.0")
    p.add_argument("--allow-http", type=_bool, default=True)
    p.add_argument("--allow-grpc", type=_bool, default=True)
    p.add_argument("--grpc-frontend", choices=("native", "grpcio"), default="native",
                   help="the gRPC transport: this server's own HTTP/2 (native, the "
                        "default: ~100 us of frontend CPU per unary RPC where grpc.aio "
                        "costs ~350) or grpc.aio (grpcio)")
    p.add_argument("--http-frontend", choices=("native", "uvicorn"), default="native",
                   help="the HTTP/1.1 transport: this server's own on httptools (native, "
                        "the default: serves infer without ASGI, ~45 instead of ~65-80 "
                        "us of frontend CPU per request under wrk) or uvicorn")
    p.add_argument("--allow-metrics", type=_bool, default=True)
    p.add_argument("--allow-cpu-metrics", type=_bool, default=True)
    p.add_argument("--allow-gpu-metrics", type=_bool, default=True)
    p.add_argument("--metrics-interval-ms", type=int, default=2000)
    p.add_argument("--metrics-config", action="append", default=[], metavar="NAME=VALUE",
                   help="counter_latencies, histogram_latencies (default true here)")
    p.add_argument("--model-control-mode", choices=("none", "poll", "explicit"),
                   default="none")
    p.add_argument("--load-model", action="append", default=[], metavar="NAME")
    p.add_argument("--repository-poll-secs", type=float, default=None,
                   help="only used by --model-control-mode=poll (default 15)")
    p.add_argument("--model-load-thread-count", type=int, default=4,
                   help="models loaded in parallel (Triton's default 4)")
    p.add_argument("--strict-model-config", type=_bool, default=False)
    p.add_argument("--disable-auto-complete-config", dest="strict_model_config",
                   action="store_true", help="the same as --strict-model-config=true")
    p.add_argument("--strict-readiness", type=_bool, default=True,
                   help="true: /v2/health/ready answers ready only while every model "
                        "that was asked to load is ready; false: once the server is up")
    p.add_argument("--exit-on-error", type=_bool, default=True)
    p.add_argument("--exit-timeout-secs", type=float, default=30.0)
    p.add_argument("--log-verbose", type=int, default=0,
                   help="verbose logging level; > 0 enables verbose (debug) lines")
    p.add_argument("--log-info", type=_bool, default=True)
    p.add_argument("--log-warning", type=_bool, default=True)
    p.add_argument("--log-error", type=_bool, default=True)
    p.add_argument("--log-format", choices=LOG_FORMATS, default="default")
    p.add_argument("--log-file", default="",
                   help="every process appends its log here instead of stderr")
    p.add_argument("--trace-config", action="append", default=[],
                   metavar="[MODE,]SETTING=VALUE",
                   help="trace settings, as tritonserver's: rate=N, level=TIMESTAMPS, "
                        "count=N, triton,file=PATH, triton,log-frequency=N (repeatable)")
    p.add_argument("--id", dest="server_id", default="shmserve",
                   help="the server's name in the server metadata")
    p.add_argument("--backend-config", action="append", default=[],
                   metavar="BACKEND,SETTING=VALUE",
                   help="a backend setting, e.g. onnxruntime,default-max-batch-size=8 "
                        "(repeatable)")
    p.add_argument("--allow-client-shm", type=_bool, default=False,
                   help="accept client shared-memory registrations")
    p.add_argument("--rate-limit", choices=("off", "execution_count"), default="off",
                   help="execution_count: instances run only when the rate-limiter "
                        "resources their instance group names are free")
    p.add_argument("--rate-limit-resource", action="append", default=[],
                   metavar="NAME:COUNT[:DEVICE]",
                   help="how many of a rate-limiter resource there are (repeatable)")
    p.add_argument("--cache-config", action="append", default=[],
                   metavar="CACHE,SETTING=VALUE",
                   help="the response cache, e.g. local,size=1048576 (repeatable); "
                        "models opt in with response_cache { enable: true }")
    p.add_argument("--response-cache-byte-size", type=int, default=None, metavar="BYTES",
                   help="deprecated: the same as --cache-config local,size=BYTES")
    # shmserve's own knobs
    # Half the cores (capped by a cgroup CPU quota: a 2-CPU pod on a 64-core node gets
    # one frontend, not 32): the other half runs the scheduler, the workers and, on a
    # benchmark box, the client. With one frontend per core on 2 cores, HTTP
    # throughput at concurrency 16 fell 3-5x (136-238 against 604-701 infer/s).
    p.add_argument("--frontend-processes", type=int, default=None,
                   help="frontend processes sharing the HTTP and gRPC ports "
                        "(default: half the cores it may run on, within its cgroup's "
                        "CPU quota, at least 1)")
    p.add_argument("--cpus", default=None, metavar="LIST",
                   help="run every process of the server on these CPUs only, e.g. 2-7 or "
                        "1,3 (default: the CPUs it was started with)")
    p.add_argument("--process-policy", choices=("batch", "inherit"), default="batch",
                   help="the Linux scheduling policy of every process of the server: "
                        "batch (SCHED_BATCH, the default: a process another one wakes "
                        "waits for the running one to block instead of preempting it, "
                        "so each runs its burst to the end) or inherit (as started)")
    # shm.cuda.CUDA_SYNC's names (that module is the workers': not imported here)
    p.add_argument("--cuda-sync", choices=("auto", "spin", "yield", "block"),
                   default="auto",
                   help="how a worker's thread waits for its GPU (the primary context's "
                        "scheduling flag, for the copies into clients' CUDA regions and "
                        "the models' own synchronizations): auto (CUDA's choice, which "
                        "spins on a machine with more cores than contexts), spin, yield, "
                        "or block (the thread sleeps until the GPU is done: no CPU spent "
                        "waiting on a long copy, a wake-up's latency added)")
    p.add_argument("--arena-mib", type=int, default=64,
                   help="size of each shared-memory arena chunk, MiB")
    p.add_argument("--arena-high-water-mib", type=int, default=None,
                   help="shared memory each process's arena keeps for reuse once freed, "
                        "MiB (default: 4 chunks); past it, a segment that becomes free "
                        "goes back to the system (the first chunk always stays)")
    p.add_argument("--startup-timeout-secs", type=float, default=120.0)
    for proto in ("http", "grpc"):
        p.add_argument(f"--{proto}-header-forward-pattern", default="", metavar="REGEX",
                       help=f"{proto.upper()} request headers whose name this regular "
                            "expression matches (case-insensitively, as Triton's RE2; "
                            "'(?-i)' first makes case matter) become request parameters")
    _add_limits(p)
    _add_grpc_transport(p)
    _add_triton_only(p)
    return p


# Triton's restricted API groups (RESTRICTED_CATEGORY_NAMES, in its order); the
# frontends' route table (frontend/restricted.py) files every route under one of them.
RESTRICTED_GROUPS = ("health", "metadata", "inference", "shared-memory", "model-config",
                     "model-repository", "statistics", "trace", "logging")
GRPC_KEY_PREFIX = "triton-grpc-protocol-"  # Triton's kRestrictedProtocolHeaderTemplate
HTTP_DEFAULT_MAX_INPUT_SIZE = 1 << 26  # 64 MiB, as tritonserver's default


def parse_restrictions(items: list[str], flag: str, kind: str,
                       key_prefix: str = "") -> dict[str, tuple[str, str]]:
    """`API[,API]:KEY=VALUE` items of one flag -> {group: (header, value)}, with
    tritonserver's errors (ValueError) for a malformed item, an unknown group, or a
    group named in two items. `kind` is "api" (HTTP) or "protocol" (gRPC)."""
    out: dict[str, tuple[str, str]] = {}
    for item in items:
        # Triton splits at the first ':' and the first '=' after it, and wants all
        # three parts non-empty; the value may itself contain '=' or ':'.
        groups, colon, setting = item.partition(":")
        key, eq, value = setting.partition("=")
        if not colon or not eq or not groups or not key or not value:
            raise ValueError(f"--{flag} option format is '<config name>:<setting>=<value>'. "
                             f"Got {item}")
        for group in groups.split(","):
            if group not in RESTRICTED_GROUPS:
                raise ValueError(f"unknown restricted {kind} '{group}'")
            if group in out:
                raise ValueError(f"restricted {kind} '{group}' can not be specified in "
                                 "multiple config groups")
            out[group] = (key_prefix + key, value)
    return out


def _add_limits(p: argparse.ArgumentParser) -> None:
    """Restricted API groups and the HTTP input size limit (frontend.restricted)."""
    groups = ", ".join(RESTRICTED_GROUPS)
    p.add_argument("--http-restricted-api", action="append", default=[],
                   metavar="API[,API]:KEY=VALUE",
                   help="HTTP requests to these API groups must carry header KEY with "
                        f"VALUE, else 403 (repeatable; groups: {groups})")
    # tritonserver's name is --grpc-restricted-protocol; --grpc-restricted-api is
    # accepted too, spelled like the HTTP flag
    p.add_argument("--grpc-restricted-protocol", "--grpc-restricted-api",
                   dest="grpc_restricted_protocol", action="append", default=[],
                   metavar="API[,API]:KEY=VALUE",
                   help="gRPC calls to these API groups must carry metadata "
                        "triton-grpc-protocol-KEY with VALUE, else UNAVAILABLE "
                        "(repeatable)")
    p.add_argument("--http-max-input-size", type=int,
                   default=HTTP_DEFAULT_MAX_INPUT_SIZE, metavar="BYTES",
                   help="largest HTTP request body (and decompressed body) accepted; "
                        "default 64 MiB as tritonserver's")


def _parse_limits(args: argparse.Namespace) -> None:
    """Raises ValueError with tritonserver's words."""
    if args.http_max_input_size <= 0:
        raise ValueError("Error: --http-max-input-size must be greater than 0.")
    args.http_restricted_api = parse_restrictions(
        args.http_restricted_api, "http-restricted-api", "api")
    args.grpc_restricted_protocol = {
        group: (header.lower(), value) for group, (header, value) in parse_restrictions(
            args.grpc_restricted_protocol, "grpc-restricted-protocol", "protocol",
            GRPC_KEY_PREFIX).items()}


def _add_grpc_transport(p: argparse.ArgumentParser) -> None:
    """Triton's gRPC keepalive, PING abuse, connection age and TLS flags, with its
    defaults (grpc-core's server defaults, declared once in GrpcKeepalive);
    frontend.transport.h2_keepalive and frontend.grpc_tls say what each does."""
    ka = GrpcKeepalive()
    p.add_argument("--grpc-keepalive-time", type=int,
                   default=ka.keepalive_time_ms, metavar="MS",
                   help="after this long without a byte from the client, a PING is sent "
                        "on a connection with calls running (default 2 hours)")
    p.add_argument("--grpc-keepalive-timeout", type=int,
                   default=ka.keepalive_timeout_ms, metavar="MS",
                   help="a connection that answers no keepalive PING within this is "
                        "closed (default 20 s)")
    p.add_argument("--grpc-keepalive-permit-without-calls", type=_bool,
                   default=ka.keepalive_permit_without_calls,
                   help="keepalive PINGs both ways also while no call runs")
    p.add_argument("--grpc-http2-max-pings-without-data", type=int,
                   default=ka.http2_max_pings_without_data, metavar="N",
                   help="keepalive PINGs sent until HEADERS or DATA are sent again "
                        "(0: no limit; default 2)")
    p.add_argument("--grpc-http2-min-recv-ping-interval-without-data", type=int,
                   default=ka.http2_min_recv_ping_interval_without_data_ms, metavar="MS",
                   help="a client PING sooner than this after the last, while the "
                        "server sends nothing, is a strike (default 5 minutes)")
    p.add_argument("--grpc-http2-max-ping-strikes", type=int,
                   default=ka.http2_max_ping_strikes, metavar="N",
                   help="one strike more and the connection gets GOAWAY "
                        "ENHANCE_YOUR_CALM too_many_pings (0: no limit; default 2)")
    p.add_argument("--grpc-max-connection-age", type=int,
                   default=ka.max_connection_age_ms, metavar="MS",
                   help="a connection this old (+-10%%) gets GOAWAY and takes no more "
                        "calls (0, the default: no limit)")
    p.add_argument("--grpc-max-connection-age-grace", type=int,
                   default=ka.max_connection_age_grace_ms, metavar="MS",
                   help="then its calls get this long before it is closed (0, the "
                        "default: as long as they take)")
    p.add_argument("--grpc-use-ssl", type=_bool, default=False,
                   help="serve gRPC over TLS (--grpc-server-cert, --grpc-server-key)")
    p.add_argument("--grpc-use-ssl-mutual", type=_bool, default=False,
                   help="mutual TLS: clients need a certificate that --grpc-root-cert "
                        "signed (implies --grpc-use-ssl)")
    p.add_argument("--grpc-server-cert", default="", metavar="PEM")
    p.add_argument("--grpc-server-key", default="", metavar="PEM")
    p.add_argument("--grpc-root-cert", default="", metavar="PEM")


# flags that mean something only with another one, warned about when given alone
TLS_FILE_FLAGS = ("--grpc-server-cert", "--grpc-server-key", "--grpc-root-cert")


def _parse_grpc_transport(args: argparse.Namespace) -> None:
    """Refuse values grpc-core would clamp or misread, and TLS files that do not load,
    before any process starts (ValueError, the flag named)."""
    if args.grpc_keepalive_time < 1:
        raise ValueError("--grpc-keepalive-time must be at least 1 (ms)")
    for flag in ("grpc_keepalive_timeout", "grpc_http2_max_pings_without_data",
                 "grpc_http2_min_recv_ping_interval_without_data",
                 "grpc_http2_max_ping_strikes", "grpc_max_connection_age",
                 "grpc_max_connection_age_grace"):
        if getattr(args, flag) < 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be 0 or more")
    if args.grpc_use_ssl_mutual:
        args.grpc_use_ssl = True  # as in tritonserver
    if not args.grpc_use_ssl:
        args.ignored_flags += [f for f in TLS_FILE_FLAGS
                               if getattr(args, f[2:].replace("-", "_"))]
        return
    if not args.grpc_server_cert or not args.grpc_server_key:
        raise ValueError("--grpc-use-ssl=true needs --grpc-server-cert and "
                         "--grpc-server-key")
    if args.grpc_use_ssl_mutual and not args.grpc_root_cert:
        raise ValueError("--grpc-use-ssl-mutual=true needs --grpc-root-cert")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(args.grpc_server_cert, args.grpc_server_key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"--grpc-server-cert {args.grpc_server_cert} / --grpc-server-key "
                         f"{args.grpc_server_key}: cannot load them: {exc}") from None
    if args.grpc_root_cert:
        try:
            ctx.load_verify_locations(cafile=args.grpc_root_cert)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"--grpc-root-cert {args.grpc_root_cert}: cannot load it: "
                             f"{exc}") from None


# tritonserver flags that configure parts this server does not have (GPU memory pools,
# backend shared libraries, gRPC transport tuning...). They are accepted so that a
# Triton command line carries over, and each one given is named in a warning.
# (flag, repeatable)
IGNORED_FLAGS = (
    ("--backend-directory", False), ("--repoagent-directory", False),
    ("--cache-directory", False), ("--pinned-memory-pool-byte-size", False),
    ("--cuda-memory-pool-byte-size", True), ("--cuda-virtual-address-size", True),
    ("--min-supported-compute-capability", False),
    ("--buffer-manager-thread-count", False), ("--host-policy", True),
    ("--model-load-gpu-limit", True), ("--enable-peer-access", False),
    ("--model-load-retry-count", False),
    ("--http-thread-count", False), ("--grpc-infer-allocation-pool-size", False),
    ("--grpc-infer-response-compression-level", False),
    ("--sagemaker-port", False),
    ("--sagemaker-safe-port-range", False), ("--sagemaker-thread-count", False),
    ("--vertex-ai-port", False), ("--vertex-ai-thread-count", False),
    ("--vertex-ai-default-model", False),
)

# tritonserver flags whose `true` would change what a client sees (other protocols,
# other model names): false is accepted, true refused.
REFUSED_WHEN_TRUE = {
    "--allow-sagemaker": "the SageMaker endpoint is not supported",
    "--allow-vertex-ai": "the Vertex AI endpoint is not supported",
    "--model-namespacing": "model namespacing is not supported",
    # another server sharing our ports is exactly what the port check prevents
    "--reuse-http-port": "port sharing with another server is not supported",
    "--reuse-grpc-port": "port sharing with another server is not supported",
}

# tritonserver's older single-setting trace flags, as --trace-config items
TRACE_FLAGS = {"--trace-file": "triton,file", "--trace-level": "level",
               "--trace-rate": "rate", "--trace-count": "count",
               "--trace-log-frequency": "triton,log-frequency"}


def _dest(flag: str) -> str:
    return "triton_only_" + flag.lstrip("-").replace("-", "_")


def _add_triton_only(p: argparse.ArgumentParser) -> None:
    g = p  # hidden from --help: the README names them
    for flag, repeatable in IGNORED_FLAGS:
        g.add_argument(flag, dest=_dest(flag), action="append" if repeatable else "store",
                       default=None, help=argparse.SUPPRESS)
    for flag in REFUSED_WHEN_TRUE:
        g.add_argument(flag, dest=_dest(flag), type=_bool, default=None,
                       help=argparse.SUPPRESS)
    for flag in TRACE_FLAGS:
        g.add_argument(flag, dest=_dest(flag), default=None, help=argparse.SUPPRESS)


def _apply_triton_only(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Warn about ignored flags, refuse harmful ones, fold trace flags in; sets
    args.ignored_flags (the flags warned about) for the tests and the log."""
    args.ignored_flags = []
    for flag, _ in IGNORED_FLAGS:
        if getattr(args, _dest(flag)) is not None:
            args.ignored_flags.append(flag)
    for flag, why in REFUSED_WHEN_TRUE.items():
        if getattr(args, _dest(flag)):
            parser.error(f"{flag}=true: {why}")
    for flag, item in TRACE_FLAGS.items():
        value = getattr(args, _dest(flag))
        if value is not None:
            args.trace_config.append(f"{item}={value}")
    if args.model_load_thread_count < 1:
        parser.error("--model-load-thread-count must be at least 1")
    if args.model_control_mode == "poll":
        if args.repository_poll_secs is None:
            args.repository_poll_secs = 15.0  # Triton's default
        elif args.repository_poll_secs <= 0:
            parser.error("--repository-poll-secs must be greater than 0")
    elif args.repository_poll_secs is not None:
        # Triton itself reads it only in poll mode
        args.ignored_flags.append("--repository-poll-secs")
    for name in vars(args).copy():
        if name.startswith("triton_only_"):
            delattr(args, name)


def warn_ignored(args: argparse.Namespace) -> None:
    """One warning line per ignored flag; called once logging is configured."""
    log = logging.getLogger("shmserve.scheduler")
    for flag in args.ignored_flags:
        if flag == "--repository-poll-secs":
            log.warning("--repository-poll-secs is ignored: it is only used with "
                        "--model-control-mode=poll")
        elif flag in TLS_FILE_FLAGS:
            log.warning("%s is ignored: it is only used with --grpc-use-ssl=true", flag)
        else:
            log.warning("%s is ignored: it configures a part of tritonserver that "
                        "shmserve does not have", flag)


def parse_backend_config(items: list[str]) -> dict[str, dict[str, str]]:
    """`backend,setting=value` items -> {backend: {setting: value}}, as tritonserver
    reads --backend-config."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        backend, sep, setting = item.partition(",")
        name, eq, value = setting.partition("=")
        if not sep or not eq or not backend or not name:
            raise ValueError(f"--backend-config option format is "
                             f"'<backend name>,<setting>=<value>'. Got {item}")
        out.setdefault(backend, {})[name] = value
    return out


def _check_regex(flag: str, pattern: str) -> None:
    """Refuse at start a forward pattern the frontends could not compile."""
    compile_forward_pattern(pattern, f"--{flag.replace('_', '-')}")


def repository_problem(paths: list[str]) -> str | None:
    """Why the server cannot start on these --model-repository paths, in Triton's
    words with the path added (Triton 2.51: "failed to stat file P" for a missing one,
    "repository path is not a valid directory" for a file), or None. Without it a
    missing path served nothing and ended with "some models failed to load"."""
    for path in paths:
        try:
            st = os.stat(path)
        except OSError as exc:
            return (f"creating server: Internal - failed to stat file {path} "
                    f"(--model-repository: {exc.strerror or exc})")
        if not stat.S_ISDIR(st.st_mode):
            return ("creating server: Invalid argument - repository path is not a "
                    f"valid directory: {path}")
    return None


def apply_process_policy(policy: str) -> str | None:
    """Put this process (and so every child it starts) under SCHED_BATCH when asked
    and it runs under the normal policy; a real-time or idle policy someone chose is
    kept. A request crosses three processes here (frontend, scheduler, worker), each
    waking the next: under the normal policy the woken one preempts the waker in the
    middle of its burst, so bursts split, batches shrink and every process wakes more
    often. SCHED_BATCH needs no privilege. What went wrong, if anything, is returned."""
    if policy != "batch":
        return None
    try:
        if os.sched_getscheduler(0) == os.SCHED_OTHER:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError) as exc:
        return f"--process-policy batch: {exc}; the server runs under its own policy"
    return None


def available_cpus() -> set[int]:
    """The CPUs this process may run on (taskset, cgroups), or all of them."""
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def parse_cpu_list(text: str) -> set[int]:
    """'0-3,8' -> {0, 1, 2, 3, 8}, each a CPU this process may run on."""
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        try:
            first, last = int(low), int(high if dash else low)
        except ValueError:
            raise ValueError(f"--cpus: '{part}' is not a CPU number or a range "
                             "like 2-5") from None
        if first < 0 or last < first:
            raise ValueError(f"--cpus: '{part}' is not a range of CPUs")
        cpus.update(range(first, last + 1))
    missing = sorted(cpus - available_cpus())
    if missing:
        raise ValueError(f"--cpus: CPU {', '.join(map(str, missing))} is not available "
                         f"here (available: {_cpu_list_text(available_cpus())})")
    return cpus


def _cpu_list_text(cpus) -> str:
    """{0, 1, 2, 5} -> '0-2,5'"""
    out, run = [], []
    for cpu in sorted(cpus):
        if run and cpu != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(cpu)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (flags are spelled out "
                     "in full; see --help)")
    if not args.model_repository:
        parser.error("--model-repository must be specified")
    _apply_triton_only(parser, args)
    if args.cpus is not None:
        try:
            args.cpus = parse_cpu_list(args.cpus)
        except ValueError as exc:
            parser.error(str(exc))
    if args.frontend_processes is None:
        args.frontend_processes = max(1, usable_cpus(len(args.cpus or available_cpus()),
                                                     cgroup_cpu_quota()) // 2)
    if args.frontend_processes < 1:
        raise SystemExit("--frontend-processes must be at least 1")
    try:
        args.backend_config = parse_backend_config(args.backend_config)
        args.rate_limit_resource = [parse_resource(r) for r in args.rate_limit_resource]
        args.metrics_config = parse_metrics_config(args.metrics_config)
        args.cache_bytes = parse_cache_config(args.cache_config,
                                              args.response_cache_byte_size)
        args.trace_config = parse_trace_config(args.trace_config)
        for flag in ("http_header_forward_pattern", "grpc_header_forward_pattern"):
            _check_regex(flag, getattr(args, flag))
        _parse_limits(args)
        _parse_grpc_transport(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.log_verbose < 0:
        parser.error("--log-verbose must be >= 0")
    # The log settings in force; the scheduler replaces them when a client changes
    # them, and the process pools hand the current ones to every child they start.
    args.log_settings = from_args(args)
    return args
