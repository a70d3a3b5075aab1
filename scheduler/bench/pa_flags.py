"""perf_analyzer's command-line flags as shmserve-bench understands them: one table (the
single source for --list-flags, the README's table and the tests), the parsers of its
range spellings, and the refusal of what the bench does not do, by name and with the
reason. Flags and meanings follow perf_analyzer's docs/cli.md (triton-inference-server/
perf_analyzer); a client module, never imported by the server's processes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

SAME = "same"  # the same meaning as perf_analyzer's
NO_EFFECT = "accepted"  # accepted so command lines run; changes nothing here (why: note)
REFUSED = "refused"


@dataclass(frozen=True)
class Flag:
    spellings: tuple  # every spelling of the flag, short first
    value: str | None  # what follows it (None: a switch)
    status: str  # SAME | NO_EFFECT | REFUSED
    note: str  # what it does here, or why it is refused
    refused_values: dict = field(default_factory=dict)  # value -> why it is refused

    @property
    def name(self) -> str:
        return self.spellings[-1]


_C_API = "needs the in-process C API (libtritonserver), which shmserve does not have"
_OTHER = ("another server's protocol: shmserve-bench speaks only Triton's (KServe v2) "
          "HTTP and gRPC protocols")

FLAGS = [
    # general
    Flag(("-m",), "NAME", SAME, "the model to drive"),
    Flag(("-x",), "VERSION", SAME,
         "the model's version (default: the server's choice, the newest)"),
    Flag(("--service-kind",), "triton", SAME, "only `triton` (the default)",
         {"triton_c_api": _C_API, "tfserving": _OTHER, "torchserve": _OTHER,
          "dynamic_grpc": _OTHER, "openai": _OTHER}),
    Flag(("--bls-composing-models",), "LIST", REFUSED,
         "the statistics of a BLS model's composing models are not reported"),
    Flag(("--model-signature-name",), "NAME", REFUSED,
         "TensorFlow Serving only; " + _OTHER),
    Flag(("-v",), None, SAME, "print every measurement window, not only the "
         "point's result"),
    # measurement
    Flag(("--measurement-mode",), "time_windows", SAME, "only `time_windows` (the default)",
         {"count_windows": "windows are timed (-p); --max-requests caps a window's "
                           "requests instead"}),
    Flag(("-p", "--measurement-interval"), "MS", SAME, "milliseconds of one measurement "
         "window (as --duration; shmserve-bench's default is 5000 as well)"),
    Flag(("--measurement-request-count",), "N", REFUSED,
         "belongs to count_windows, which is not done (see --measurement-mode)"),
    Flag(("-s", "--stability-percentage"), "PCT", SAME,
         "max/min of the last 3 windows' throughput and latency for stability"),
    Flag(("--percentile",), "P", SAME, "report the P-th percentile latency and stabilize "
         "on it"),
    Flag(("-r", "--max-trials"), "N", SAME, "windows per point at most until stable "
         "(shmserve-bench's default is 1 window, 10 with --percentile)"),
    Flag(("--concurrency-range",), "START:END:STEP", SAME,
         "closed-loop concurrency sweep (END 0, a search until -l, is refused)"),
    Flag(("--request-rate-range",), "START:END:STEP", SAME, "open-loop request rates"),
    Flag(("--request-distribution",), "constant|poisson", SAME,
         "the open loop's gaps between sends"),
    Flag(("-l", "--latency-threshold"), "MS", SAME, "end the sweep after the first point "
         "whose latency (the --percentile, else the average) exceeds this"),
    Flag(("--max-threads",), "N", NO_EFFECT, "the clients need no thread per request "
         "(callbacks, greenlets or asyncio); --client-processes spreads them over CPUs"),
    Flag(("--periodic-concurrency-range",), "START:END:STEP", REFUSED,
         "the ramp without stability checks, reported as per-request timestamps only, "
         "is not done"),
    Flag(("--request-period",), "N", REFUSED, "belongs to --periodic-concurrency-range"),
    Flag(("--request-intervals",), "PATH", REFUSED,
         "a send schedule read from a file is not done; use --request-rate-range with "
         "--request-distribution"),
    Flag(("--binary-search",), None, REFUSED,
         "the sweep is linear; give the points with --concurrency-range"),
    Flag(("--request-parameter",), "NAME:VALUE:TYPE", SAME,
         "a request parameter (bool, int or string) sent with every request"),
    # sequences
    Flag(("--sequence-length",), "N", SAME, "requests per sequence of a sequence model, "
         "varied by --sequence-length-variation (default: the steps of each JSON "
         "--input-data stream, else 20)"),
    Flag(("--sequence-length-variation",), "PCT", SAME,
         "each sequence's length within +/- PCT% of --sequence-length (default 20)"),
    Flag(("--sequence-id-range",), "START[:END]", SAME,
         "correlation ids used, END excluded (default: from 1, unbounded)"),
    Flag(("--num-of-sequences",), "N", REFUSED,
         "sequences are driven in the closed loop (one per concurrent stream); the "
         "open loop sends no sequences"),
    Flag(("--serial-sequences",), None, NO_EFFECT,
         "sequences are always serial here: one request in flight per sequence"),
    # input data
    Flag(("--input-data",), "zero|random|FILE.json", SAME,
         "what inputs hold; a JSON file in perf_analyzer's format, whose streams a "
         "sequence model's sequences step through and whose validation_data the "
         "responses must match (a directory of raw files is refused: not read)"),
    Flag(("-z",), None, SAME, "the same as --input-data zero (deprecated there)"),
    Flag(("--data-directory",), "DIR", REFUSED,
         "a directory of raw input files is not read; use a JSON --input-data file"),
    Flag(("-b",), "N", SAME, "the batch size of every request"),
    Flag(("--shape",), "NAME:D1,D2", SAME, "an input's dims after the batch dim"),
    Flag(("--string-length",), "N", SAME, "characters of a random BYTES element"),
    Flag(("--string-data",), "TEXT", SAME, "every BYTES element holds this text"),
    Flag(("--shared-memory",), "none|system|cuda", SAME,
         "tensors in the request, or in system or CUDA shared-memory regions"),
    Flag(("--output-shared-memory-size",), "BYTES", SAME,
         "an output region's size when the output's size is not known"),
    Flag(("--input-tensor-format",), "binary", SAME, "only `binary` (the default)",
         {"json": "tensors are always sent in the binary extension"}),
    Flag(("--output-tensor-format",), "binary", SAME, "only `binary` (the default)",
         {"json": "outputs are always asked for in the binary extension"}),
    # requests
    Flag(("-i",), "http|grpc", SAME,
         "the protocol (shmserve-bench's default is grpc, perf_analyzer's http)"),
    Flag(("-a", "--async"), None, SAME, "asynchronous client calls: gRPC completion "
         "callbacks, HTTP asyncio (the default for gRPC)"),
    Flag(("--sync",), None, SAME, "blocking client calls: a thread per stream (gRPC), a "
         "greenlet per stream (HTTP; the default for HTTP)"),
    Flag(("--streaming",), None, SAME, "requests over the gRPC stream; reports time to "
         "first response and responses/s (a decoupled model needs it)"),
    Flag(("-H",), "NAME:VALUE", SAME, "a header sent with every HTTP request (ignored "
         "for gRPC, as there)"),
    Flag(("--grpc-compression-algorithm",), "none|gzip|deflate", SAME,
         "compression of gRPC requests"),
    # server
    Flag(("-u",), "HOST:PORT", SAME, "the server (default 127.0.0.1:8001 for "
         "grpc, :8000 for http)"),
    *[Flag((f"--ssl-{name}",), "VALUE", REFUSED, "TLS client settings are not passed to "
           "the bench's clients") for name in (
        "grpc-use-ssl", "grpc-root-certifications-file", "grpc-private-key-file",
        "grpc-certificate-chain-file", "https-verify-peer", "https-verify-host",
        "https-ca-certificates-file", "https-client-certificate-file",
        "https-client-certificate-type", "https-private-key-file",
        "https-private-key-type")],
    Flag(("--triton-server-directory",), "DIR", REFUSED, _C_API),
    Flag(("--model-repository",), "DIR", REFUSED, _C_API),
    # metrics
    Flag(("--collect-metrics",), None, REFUSED, "the server's GPU metrics are not "
         "collected; the bench reports each server process's CPU per request instead"),
    Flag(("--metrics-url",), "URL", REFUSED, "belongs to --collect-metrics"),
    Flag(("--metrics-interval",), "MS", REFUSED, "belongs to --collect-metrics"),
    # report
    Flag(("-f",), "PATH.csv", SAME, "perf_analyzer's CSV: its columns in its order, rows "
         "by increasing throughput"),
    Flag(("--verbose-csv",), None, SAME,
         "-f adds Avg latency, request/response and response wait"),
    Flag(("--profile-export-file",), "PATH", REFUSED, "per-request timestamps are not "
         "exported; --json writes every point's figures"),
    # trace
    *[Flag((f"--{name}",), "VALUE", REFUSED, "these set the server's trace settings; use "
           "shmserve's --trace-config or the /v2/trace/setting API") for name in (
        "trace-file", "trace-level", "trace-rate", "trace-count", "log-frequency")],
    # deprecated
    Flag(("-t",), "N", SAME, "one concurrency (deprecated there: --concurrency-range)"),
    Flag(("-c",), "N", REFUSED, "the deprecated concurrency search; use "
         "--concurrency-range START:END:STEP"),
    Flag(("-d",), None, REFUSED, "the deprecated concurrency search; use "
         "--concurrency-range START:END:STEP"),
]

BY_SPELLING = {s: f for f in FLAGS for s in f.spellings}


def refusal(spelling: str, reason: str, value: str | None = None) -> str:
    shown = f"{spelling}={value}" if value is not None else spelling
    return f"bench: perf_analyzer's {shown} is not supported: {reason}"


def check_refused(argv: list[str]) -> None:
    """SystemExit naming the first refused flag (or refused value) of `argv`, with the
    reason. Before argparse, so a refused flag is never mistaken for a typo."""
    for k, token in enumerate(argv):
        if token == "--":
            return
        if not token.startswith("-"):
            continue
        spelling, eq, value = token.partition("=")
        flag = BY_SPELLING.get(spelling)
        if flag is None:
            continue
        if flag.status == REFUSED:
            raise SystemExit(refusal(spelling, flag.note))
        if flag.refused_values:
            if not eq:
                value = argv[k + 1] if k + 1 < len(argv) else ""
            if value in flag.refused_values:
                raise SystemExit(refusal(spelling, flag.refused_values[value], value))


def parse_range(text: str, kind=int) -> tuple:
    """perf_analyzer's 'start[:end[:step]]' (defaults 1; an absent end: start alone)."""
    parts = [p.strip() for p in str(text).split(":")]
    if not 1 <= len(parts) <= 3 or any(p == "" for p in parts):
        raise ValueError(f"want start[:end[:step]], got {text!r}")
    start = kind(parts[0])
    end = kind(parts[1]) if len(parts) > 1 else start
    step = kind(parts[2]) if len(parts) > 2 else kind(1)
    return start, end, step


def expand_range(text: str, kind=int) -> list:
    """The points of a range: start, start+step, ... up to end (inclusive)."""
    start, end, step = parse_range(text, kind)
    if start <= 0 or step <= 0:
        raise ValueError(f"start and step must be positive: {text!r}")
    if end == 0:
        raise ValueError(f"an end of 0 (a search until --latency-threshold) is not "
                         f"done: give the end ({text!r})")
    if end < start:
        raise ValueError(f"end below start: {text!r}")
    out, k = [], 0
    while True:
        v = start + k * step
        if v > end + (1e-9 if kind is float else 0):
            return out
        out.append(round(v, 9) if kind is float else v)
        k += 1


def parse_id_range(text: str) -> tuple[int, int | None]:
    """--sequence-id-range 'start[:end]' -> (start, end or None); end excluded."""
    parts = str(text).split(":")
    if len(parts) > 2 or not parts[0].strip():
        raise ValueError(f"want start[:end], got {text!r}")
    start = int(parts[0])
    end = int(parts[1]) if len(parts) == 2 and parts[1].strip() else None
    if start < 1 or (end is not None and end <= start):
        raise ValueError(f"want 1 <= start < end: {text!r}")
    return start, end


def parse_request_parameter(text: str) -> tuple[str, object]:
    """'max_tokens:256:int' -> ('max_tokens', 256); types bool, int, string."""
    name, sep1, rest = str(text).partition(":")
    value, sep2, kind = rest.rpartition(":")
    if not (name and sep1 and sep2):
        raise ValueError(f"want name:value:type, got {text!r}")
    if kind == "int":
        return name, int(value)
    if kind == "bool":
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"not a bool: {value!r}")
        return name, value.lower() in ("true", "1")
    if kind == "string":
        return name, value
    raise ValueError(f"type must be bool, int or string: {text!r}")


def parse_header(text: str) -> tuple[str, str]:
    name, sep, value = str(text).partition(":")
    if not sep or not name.strip():
        raise ValueError(f"want Header:Value, got {text!r}")
    return name.strip(), value.strip()


def check_input_data(value: str) -> None:
    if os.path.isdir(value):
        raise SystemExit(refusal("--input-data", "a directory of raw input files is not "
                                 "read; use a JSON file in perf_analyzer's format", value))


def table_text() -> str:
    """The table --list-flags prints: flag, status, what it does or why refused."""
    lines = []
    for f in FLAGS:
        name = ", ".join(f.spellings) + (f" {f.value}" if f.value else "")
        note = f.note
        for v, why in f.refused_values.items():
            note += f"; {v}: refused ({why})"
        lines.append(f"{name:44} {f.status:9} {note}")
    return "\n".join(lines)


def markdown_table() -> str:
    """The README's table (tests/unit/test_bench_pa.py checks the README holds it)."""
    rows = ["| flag | here | meaning, or why refused |", "|---|---|---|"]
    for f in FLAGS:
        name = ", ".join(f"`{s}`" for s in f.spellings)
        note = f.note
        for v, why in f.refused_values.items():
            note += f"; `{v}` refused: {why}"
        rows.append(f"| {name} | {f.status} | {note} |")
    return "\n".join(rows)
