"""What the side-by-side benchmark scripts (bench_batching, bench_decoupled,
bench_ensemble, bench_py, bench_sequence) share: starting a server (the real Triton or
shmserve) and waiting until it is ready, the CPU time of its processes by role, the
common flags, the rounds that alternate the servers, the per-request CPU columns of a
row, and the means behind the ratios of a summary. Each script keeps its own models,
its own client and its own columns.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import compare  # noqa: E402
from bench_mlp import wait_ready  # noqa: E402

# the CPU by role of scripts/bench, one implementation for every benchmark
from scheduler.bench.procs import cpu_by_role, process_tree, roles  # noqa: E402

# the real Triton's launcher (REPO HTTP GRPC METRICS ...): compare's, $TRITON_CMD on the
# GPU machine, else the anchor ../shared/anchor/setup.sh makes
TRITON = compare.TRITON_LAUNCHER

# a python identity model: INPUT0 -> OUTPUT0, FP32 [-1], max_batch_size 8, one instance
IDENTITY_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

IDENTITY_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
'''


# the anchor's identity_fp32 (../shared/anchor/setup.sh): dynamic batching, 2 instances
ANCHOR_IDENTITY_CONFIG = """name: "identity_fp32"
backend: "python"
max_batch_size: 64
dynamic_batching { max_queue_delay_microseconds: 100 }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

def write_model(repo: Path, name: str, config: str, code: str | None = None) -> None:
    """Model `name` in `repo`: its config.pbtxt and, for the python backend, version
    1's model.py."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    if code is not None:
        (repo / name / "1" / "model.py").write_text(code)


# --------------------------------------------------------------------- servers


def server_command(kind: str, repo: Path, ports, extra=()) -> list[str]:
    """The command line of server `kind` (triton, shmserve, shmserve-nometrics)."""
    http, grpc, metrics = ports
    if kind == "triton":
        return [TRITON, str(repo), str(http), str(grpc), str(metrics),
                "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
                "--metrics-address", "127.0.0.1", *extra]
    cmd = [sys.executable, "-m", "scheduler.main", "--model-repository", str(repo),
           "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port",
           str(metrics), "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
           "--metrics-address", "127.0.0.1"]
    if kind == "shmserve-nometrics":
        cmd += ["--allow-metrics", "false"]
    return cmd + list(extra)


class Server:
    """One server run as a context manager: started in its own session with its output
    in `log_path` (appended), ready when its HTTP health endpoint says so, stopped with
    SIGINT to its whole group (SIGKILL after 60 s) on the way out."""

    def __init__(self, kind: str, repo: Path, ports, log_path: Path, extra=(),
                 check_ports: bool = False):
        self.kind, self.repo, self.ports = kind, repo, ports
        self.log_path, self.extra, self.check_ports = Path(log_path), extra, check_ports
        self.proc: subprocess.Popen | None = None
        self._pids: list[int] = []

    def __enter__(self) -> "Server":
        if self.check_ports:
            for port in self.ports:  # another server there would answer in our place
                with socket.socket() as sock:
                    if sock.connect_ex(("127.0.0.1", port)) == 0:
                        raise SystemExit(f"port {port} is taken: pass other --ports")
        self._log = open(self.log_path, "ab")
        # not from the repository root for Triton: its python stub puts its cwd on
        # sys.path, where our packages have nothing to do
        cwd = ROOT if self.kind.startswith("shmserve") else self.repo
        extra = (*SHMSERVE_ARGS, *self.extra) if self.kind.startswith("shmserve") else \
            self.extra
        self.proc = subprocess.Popen(
            server_command(self.kind, self.repo, self.ports, extra), cwd=cwd,
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=compare.on_cpus(SERVER_CPUS))
        try:
            wait_ready(self.ports[0], self.proc, 180)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._log.close()

    @property
    def http(self) -> int:
        return self.ports[0]

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports[1]}"

    def pids(self) -> list[int]:
        """The server's process tree, read once (after its workers have started)."""
        if not self._pids:
            self._pids = process_tree(self.proc.pid)
        return self._pids

    def cpu(self) -> dict[str, float]:
        return roles(self.pids())

    def bench_sampler(self):
        """A `sample(client)` for bench_mlp.run_bench: the server's CPU by role plus
        the CPU of scripts/bench's process tree as 'client'. Both trees are read at the
        first sample, when the client has warmed up and every worker runs."""
        pids: list[int] = []
        client_pids: list[int] = []

        def sample(client) -> dict[str, float]:
            if client.poll() is not None:
                # run_bench samples inside the window scripts/bench announces, so
                # this means the client failed or the machine stalled for seconds
                print("benchkit: scripts/bench ended before this CPU sample; the CPU "
                      "columns of this row are not valid",
                      file=sys.stderr, flush=True)
            if not pids:
                pids.extend(process_tree(self.proc.pid))
                client_pids.extend(process_tree(client.pid))
            out = roles(pids)
            out["client"] = sum(cpu_by_role(client_pids).values())
            return out
        return sample


def own_cpu() -> float:
    """CPU seconds of this process, all threads: the client when it runs in here."""
    return time.process_time()


def cpu_columns(cpu0: dict, cpu1: dict, requests: float) -> dict:
    """A row's CPU columns: microseconds per request by role between two samples, and
    their sum without the client."""
    cpu_us = {role: round(1e6 * (cpu1[role] - cpu0.get(role, 0.0)) / requests, 1)
              for role in cpu1} if requests else {}
    return {"cpu_us_per_request": cpu_us,
            "server_cpu_us_per_request": round(sum(v for k, v in cpu_us.items()
                                                   if k != "client"), 1)}


# --------------------------------------------------------------------- runs


def add_common_args(p: argparse.ArgumentParser, ports: list[int], *, duration=None,
                    warmup=None, concurrency=None, servers=None, rounds: int = 2) -> None:
    """The flags every script has; a default of None leaves that flag out."""
    p.add_argument("--rounds", type=int, default=rounds)
    if duration is not None:
        p.add_argument("--duration", type=float, default=duration)
    if warmup is not None:
        p.add_argument("--warmup", type=float, default=warmup)
    if concurrency is not None:
        p.add_argument("--concurrency", type=int, default=concurrency)
    if servers is not None:
        p.add_argument("--servers", default=servers)
        p.add_argument("--skip", action="append", default=[])
        p.add_argument("--log-dir", default=None)
    p.add_argument("--ports", type=lambda t: [int(x) for x in t.split(",")],
                   default=ports)
    p.add_argument("--json", default=None)
    p.add_argument("--server-cpus", default=None, metavar="LIST",
                   help="run every server on these CPUs (e.g. 1); see scripts/compare")
    p.add_argument("--client-cpus", default=None, metavar="LIST",
                   help="run the load generator on these CPUs (e.g. 0)")
    p.add_argument("--shmserve-args", default="", metavar="ARGS",
                   help="more flags for every shmserve started, e.g. "
                        "'--frontend-processes 2'")


def parser(doc: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def parse(p: argparse.ArgumentParser, log_prefix: str) -> argparse.Namespace:
    """Parse; scripts with --servers get a log directory made when none is given."""
    args = p.parse_args()
    if hasattr(args, "log_dir"):
        args.log_dir = args.log_dir or tempfile.mkdtemp(prefix=log_prefix)
        os.makedirs(args.log_dir, exist_ok=True)  # one named that is not there yet
    place(args)
    SHMSERVE_ARGS[:] = shlex.split(getattr(args, "shmserve_args", "") or "")
    return args


# The CPUs every Server started here runs on (None: this process's own).
SERVER_CPUS: set[int] | None = None
# Flags every shmserve started here gets (--shmserve-args).
SHMSERVE_ARGS: list[str] = []


def place(args: argparse.Namespace) -> None:
    """--server-cpus / --client-cpus, as scripts/compare places them."""
    global SERVER_CPUS
    SERVER_CPUS = compare.place(getattr(args, "server_cpus", None),
                                getattr(args, "client_cpus", None))


def servers(args: argparse.Namespace) -> list[str]:
    """--servers without --skip; exits if the anchor is asked for but not there."""
    chosen = [s for s in args.servers.split(",") if s not in args.skip]
    if "triton" in chosen and not os.path.exists(TRITON):
        sys.exit(f"{TRITON} not found: run ../shared/anchor/setup.sh, or --skip triton")
    return chosen


@contextmanager
def repository(prefix: str, write, *write_args):
    """A fresh temporary model repository filled by `write(repo, *write_args)`."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        repo = Path(tmp)
        write(repo, *write_args)
        yield repo


def alternating(rounds: int, items: list):
    """(round number from 1, items in this round's order): the order flips every
    round so the machine's drift spreads over all of them."""
    for r in range(rounds):
        yield r + 1, items if r % 2 == 0 else items[::-1]


def record(rows: list[dict], row: dict) -> None:
    rows.append(row)
    print(json.dumps(row), flush=True)


def finish(args: argparse.Namespace, rows: list[dict], logs: str | None = None) -> None:
    """Where the logs are, and every row as JSON with the flags if --json asks."""
    print(logs or f"logs in {args.log_dir}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows},
                                              indent=1))


def means(rows: list[dict], value: str, *keys: str) -> dict[tuple, float]:
    """Mean of `value` over the rows of each combination of `keys` (over rounds)."""
    groups: dict[tuple, list[float]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row[value])
    return {k: statistics.mean(v) for k, v in groups.items()}
