#!/usr/bin/env python3
"""Side-by-side comparison of Triton-protocol servers with scripts/bench.py.

Starts every server (or attaches to one already running), waits for
/v2/health/ready, then measures each point on each server in turn, A B A B, for
`--rounds` rounds, so the machine's drift lands on both alike. Prints every row, then a
ratio table (each server against the first, the baseline) and writes JSON.

    scripts/compare --rounds 2 --duration 3 --json /tmp/compare.json
    scripts/compare --shm none,system --shape 1,16 --shape 1,4194304
    scripts/compare --shm cuda --protocols grpc --model M  # GPU machine: CUDA regions;
                                                          # Triton from $TRITON_CMD
    scripts/compare --triton-ports 18100,18101,18102 --shmserve-ports 28100,28101,28102
    scripts/compare --server triton 18000 18001 - --server mine 8000 8001 -  # attach

Servers are stopped by PID: SIGINT, a bounded wait, then SIGKILL to its process group
(each server is started in its own session, so its children go with it). Both servers
stay up while measuring; the idle one costs no CPU. `--one-at-a-time` instead starts
each server only for its own block of points (slower: one start per server per round).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

REPO = "/tmp/repo_anchor"
SHMS = ("none", "system", "cuda")
# the real Triton's launcher, taking REPO HTTP GRPC METRICS: $TRITON_CMD where it is set
# (the GPU machine's, from ../shared/device/on_device.sh), else the anchor's
# (../shared/anchor/setup.sh)
TRITON_LAUNCHER = os.environ.get("TRITON_CMD") or "/tmp/anchors/bin/run_triton_anchor"
TRITON_CMD = (TRITON_LAUNCHER + " {repo} {http} {grpc} {metrics} "
              "--http-address 127.0.0.1 --grpc-address 127.0.0.1 "
              "--metrics-address 127.0.0.1")


def _shmserve_exe() -> str:
    venv = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".venv", "bin",
                        "shmserve")
    return os.path.normpath(venv) if os.access(venv, os.X_OK) else "shmserve"


# client shm must be switched on in shmserve (Triton 2.51 allows it unconditionally)
SHMSERVE_CMD = (_shmserve_exe() + " --model-repository {repo} --http-port {http} "
                "--grpc-port {grpc} --metrics-port {metrics} --http-address 127.0.0.1 "
                "--grpc-address 127.0.0.1 --metrics-address 127.0.0.1 "
                "--allow-client-shm true")


def parse_ports(text: str) -> tuple[int, int, int]:
    """'18000,18001[,18002]' -> (http, grpc, metrics); metrics defaults to http + 2."""
    ports = bench.parse_int_list(text)
    if len(ports) not in (2, 3):
        raise ValueError(f"expected HTTP,GRPC[,METRICS]: {text!r}")
    return ports[0], ports[1], ports[2] if len(ports) == 3 else ports[0] + 2


@dataclass
class ServerSpec:
    """A server under test. An empty cmd (or '-') means: already running, attach."""

    name: str
    cmd: str
    http: int
    grpc: int

    def port(self, protocol: str) -> int:
        return self.http if protocol == "http" else self.grpc


class Server:
    """One server process: start, wait until ready, stop by PID."""

    def __init__(self, spec: ServerSpec, log_dir: str, ready_timeout: float,
                 stop_timeout: float, model: str | None):
        self.spec = spec
        self.cwd = log_dir
        self.log_path = os.path.join(log_dir, f"{spec.name}.log")
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.model = model
        self.proc: subprocess.Popen | None = None
        self.attached = spec.cmd.strip() in ("", "-")
        self.cpus: set[int] | None = None  # the CPUs it runs on (None: this process's)

    def start(self):
        if self.attached:
            self.wait_ready()
            return
        for port in (self.spec.http, self.spec.grpc):
            if port_busy(port):
                raise RuntimeError(f"{self.spec.name}: port {port} is already in use "
                                   "(another server still running?)")
        log = open(self.log_path, "ab")
        log.write(f"\n=== {time.ctime()} {self.spec.cmd}\n".encode())
        log.flush()
        # own session: the server and its children form a process group we can kill.
        # A neutral cwd: Triton's python stub puts cwd on sys.path, where a checkout's
        # modules have nothing to do (older checkouts had a top-level
        # triton_python_backend_utils.py that shadowed Triton's).
        self.proc = subprocess.Popen(shlex.split(self.spec.cmd), stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, cwd=self.cwd,
                                     preexec_fn=on_cpus(self.cpus))
        log.close()
        print(f"# started {self.spec.name} pid {self.proc.pid}: {self.spec.cmd}",
              flush=True)
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def wait_ready(self):
        base = f"http://127.0.0.1:{self.spec.http}"
        # model None: the server alone (one that serves what loaded, whatever failed)
        urls = [f"{base}/v2/health/ready"] + \
            ([f"{base}/v2/models/{self.model}/ready"] if self.model else [])
        deadline = time.monotonic() + self.ready_timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.spec.name} exited with {self.proc.returncode} "
                                   f"before ready; log {self.log_path}:\n{self.log_tail()}")
            try:
                if all(_http_ok(u) for u in urls):
                    return
                last = "not ready yet"
            except OSError as e:
                last = str(e)
            time.sleep(0.25)
        raise RuntimeError(f"{self.spec.name} not ready after {self.ready_timeout}s "
                           f"({last}); log {self.log_path}:\n{self.log_tail()}")

    def stop(self):
        p, self.proc = self.proc, None
        if p is None:
            return
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                print(f"# {self.spec.name} pid {p.pid} ignored SIGINT for "
                      f"{self.stop_timeout}s: SIGKILL", file=sys.stderr, flush=True)
                _kill_group(p.pid)
                p.wait()
        # children that outlived their parent (e.g. backend stubs) go with the group
        deadline = time.monotonic() + 5
        while _group_alive(p.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(p.pid):
            _kill_group(p.pid)
        print(f"# stopped {self.spec.name} pid {p.pid} (exit {p.returncode})", flush=True)

    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def log_tail(self, n: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"".join(f.readlines()[-n:]).decode(errors="replace")
        except OSError:
            return ""


# straight to 127.0.0.1, whatever http_proxy says
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http_ok(url: str) -> bool:
    try:
        with _OPENER.open(url, timeout=2) as r:
            return r.status == 200
    except urllib.error.HTTPError:
        return False


def port_busy(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _kill_group(pgid: int):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    protocol: str
    shape: tuple
    shm: str
    concurrency: int

    def key(self) -> str:
        return (f"{self.protocol} {bench.format_shape(self.shape)} shm={self.shm} "
                f"c={self.concurrency}")


def build_points(protocols, shapes, shms, concurrency) -> list[Point]:
    return [Point(p, tuple(s), m, c) for m in shms for p in protocols for s in shapes
            for c in concurrency]


def _mean(xs):
    xs = [x for x in xs if x is not None and x == x]
    return sum(xs) / len(xs) if xs else float("nan")


def summarize(rows: list[dict], servers: list[str], points: list[Point]) -> list[dict]:
    """Per point: each server's mean over rounds; ratios against the first server."""
    out = []
    base = servers[0]
    for pt in points:
        entry = {"protocol": pt.protocol, "shape": list(pt.shape), "shm": pt.shm,
                 "concurrency": pt.concurrency, "servers": {}}
        for name in servers:
            rs = [r for r in rows if r["server"] == name and r["point"] == pt.key()]
            if not rs:
                continue
            entry["servers"][name] = {
                "throughput": _mean([r["throughput"] for r in rs]),
                "by_round": {r["round"]: r["throughput"] for r in rs},
                "p50_ms": _mean([r["p50_ms"] for r in rs]),
                "p99_ms": _mean([r["p99_ms"] for r in rs]),
                "client_cpu": _mean([r["client_cpu"] for r in rs]),
                # CPU microseconds per request by role (server: all its processes)
                "cpu_us": {role: _mean([r["cpu_us"].get(role) for r in rs])
                           for role in rs[-1].get("cpu_us", {})},
                "errors": sum(r["errors"] for r in rs),
                "mismatches": sum(r["mismatches"] for r in rs),
            }
        b = entry["servers"].get(base)
        entry["ratio"], entry["ratio_range"] = {}, {}
        for name, s in entry["servers"].items():
            if name == base or not b:
                continue
            entry["ratio"][name] = (s["throughput"] / b["throughput"]) \
                if b["throughput"] else None
            # the ratio within each round (A and B measured back to back): its spread
            # says how much the machine drifted
            per_round = [s["by_round"][k] / b["by_round"][k] for k in s["by_round"]
                         if b["by_round"].get(k)]
            entry["ratio_range"][name] = [min(per_round), max(per_round)] \
                if per_round else None
        out.append(entry)
    return out


def format_summary(summary: list[dict], servers: list[str]) -> str:
    base = servers[0]
    lines = []
    if len(servers) == 1:
        lines += [f"# {base} (mean of rounds; p50 in ms)",
                  f"{'proto':>5}  {'shape':>12}  {'shm':>6}  {'conc':>4}  {'inf/s':>10}  "
                  f"{'p50':>8}"]
        for e in summary:
            b = e["servers"].get(base)
            lines.append(f"{e['protocol']:>5}  {bench.format_shape(e['shape']):>12}  "
                         f"{e['shm']:>6}  {e['concurrency']:>4}  "
                         f"{_num(b, 'throughput', 1):>10}  {_num(b, 'p50_ms', 3):>8}")
    for other in servers[1:]:
        hdr = (f"{'proto':>5}  {'shape':>12}  {'shm':>6}  {'conc':>4}  "
               f"{base + ' inf/s':>14}  {other + ' inf/s':>14}  {'ratio':>6}  "
               f"{'per round':>11}  {base + ' p50':>12}  {other + ' p50':>12}  "
               f"{'server us/req':>14}")
        lines += [f"# {other} / {base} (throughput ratio; p50 in ms; mean of rounds)", hdr]
        for e in summary:
            b, o = e["servers"].get(base), e["servers"].get(other)
            ratio = e["ratio"].get(other)
            rr = e["ratio_range"].get(other)
            spread = f"{rr[0]:.2f}-{rr[1]:.2f}" if rr else "-"
            lines.append(
                f"{e['protocol']:>5}  {bench.format_shape(e['shape']):>12}  "
                f"{e['shm']:>6}  {e['concurrency']:>4}  "
                f"{_num(b, 'throughput', 1):>14}  {_num(o, 'throughput', 1):>14}  "
                f"{(f'{ratio:.2f}' if ratio else '-'):>6}  {spread:>11}  "
                f"{_num(b, 'p50_ms', 3):>12}  {_num(o, 'p50_ms', 3):>12}  "
                f"{_cpu(b) + ' / ' + _cpu(o):>14}")
    by_role = []
    for e in summary:
        for name in servers:
            s = e["servers"].get(name)
            if s and s.get("cpu_us"):
                roles = " | ".join(f"{k} {v:.1f}" for k, v in s["cpu_us"].items()
                                   if v == v)
                by_role.append(f"{e['protocol']:>5}  {bench.format_shape(e['shape']):>12}  "
                               f"{e['shm']:>6}  {e['concurrency']:>4}  {name:>10}: {roles}")
    if by_role:
        lines += ["# CPU microseconds per request by process role (mean of rounds)",
                  *by_role]
    return "\n".join(lines)


def _cpu(d) -> str:
    us = (d or {}).get("cpu_us", {}).get("server")
    return "-" if us is None or us != us else f"{us:.0f}"


def _num(d, key, digits):
    if not d or d.get(key) is None or d[key] != d[key]:
        return "-"
    return f"{d[key]:.{digits}f}"


def measure_row(pool, server: Server, pt: Point, rnd: int, *, model: str,
                dtype: str = "FP32", duration: float, warmup: float, timeout: float = 30.0,
                max_requests: int | None = None, verify: bool, client_processes: int = 1,
                cuda_device: int = 0, input_name: str = "INPUT0",
                output_name: str = "OUTPUT0") -> dict:
    """One point on one server with the pool's clients, the server's CPU per request by
    role sampled inside the window; printed, and returned as the JSON row (with its
    round and point key). A server that has exited gives a row with one error."""
    cfg = bench.BenchConfig(
        url=f"127.0.0.1:{server.spec.port(pt.protocol)}", protocol=pt.protocol,
        model=model, shapes=[list(pt.shape)], dtype=dtype, concurrency=[pt.concurrency],
        duration=duration, max_requests=max_requests, warmup=warmup, timeout=timeout,
        shm=pt.shm, cuda_device=cuda_device, verify=verify,
        client_processes=client_processes, server=server.spec.name,
        input_name=input_name, output_name=output_name)
    if server.exited():
        row = bench.summarize([], protocol=pt.protocol, shape=pt.shape, dtype=dtype,
                              concurrency=pt.concurrency, shm=pt.shm,
                              impl=cfg.client_impl(), model=model, url=cfg.url,
                              server=server.spec.name)
        row.errors, row.first_error = 1, f"server exited ({server.log_path})"
    else:
        # the server's CPU per request by role, sampled inside the window
        pid, note = bench.find_server_pid(cfg)
        probe = bench.ServerProbe(cfg, pid, note)
        try:
            row = bench.measure_point(pool, cfg, list(pt.shape), pt.concurrency,
                                      probe=probe)
        finally:
            probe.close()
    print(bench.format_row(row) + f"  r{rnd}", flush=True)
    print(bench.cpu_line(row.cpu_us, row.cpu_note), flush=True)
    d = bench.row_to_json(row)
    d.update(round=rnd, point=pt.key())
    return d


def parse_cpus(text: str) -> set[int]:
    """'0-2,5' -> {0, 1, 2, 5}, CPUs this machine lets us use (as shmserve's --cpus)."""
    from scheduler.cli import parse_cpu_list
    try:
        return parse_cpu_list(text)
    except ValueError as exc:
        raise SystemExit(f"compare: {exc}".replace("--cpus", "cpus")) from None


def on_cpus(cpus: set[int] | None):
    """A Popen preexec_fn that puts the child on `cpus` whatever this process (the
    client) was given; None when there is nothing to place."""
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


def place(server_cpus: str | None, client_cpus: str | None) -> set[int] | None:
    """--server-cpus / --client-cpus: put this process (the load generator, and what it
    starts) on the client's CPUs; returns the CPUs every server is to run on (None:
    wherever this process could run), the same for every server compared."""
    everywhere = os.sched_getaffinity(0)
    servers = parse_cpus(server_cpus) if server_cpus else (everywhere if client_cpus
                                                           else None)
    if client_cpus:
        os.sched_setaffinity(0, parse_cpus(client_cpus))
    return servers


def fill_command(cmd: str, repo: str, http: int, grpc: int, metrics: int) -> str:
    """A server command with its {repo}, {http}, {grpc} and {metrics} filled in."""
    for key, value in (("repo", os.path.abspath(repo)), ("http", http), ("grpc", grpc),
                       ("metrics", metrics)):
        cmd = cmd.replace("{%s}" % key, str(value))
    return cmd


def parse_servers(args) -> list[ServerSpec]:
    if args.server:  # metrics on HTTP + 2, as parse_ports has it
        return [ServerSpec(n, fill_command(cmd, args.repo, int(h), int(g), int(h) + 2),
                           int(h), int(g)) for n, h, g, cmd in args.server]
    out = []
    for name, cmd, template, ports in (
            ("triton", args.triton, TRITON_CMD, args.triton_ports),
            ("shmserve", args.shmserve, SHMSERVE_CMD, args.shmserve_ports)):
        http, grpc, metrics = parse_ports(ports)
        # a given command may name the same placeholders as the defaults
        cmd = fill_command(template if cmd is None else cmd, args.repo, http, grpc, metrics)
        out.append(ServerSpec(name, cmd, http, grpc))
    return [s for s in out if s.name not in args.skip]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="compare", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", default=REPO, help="model repository for the default commands")
    p.add_argument("--triton", default=None, help="command that starts Triton (default: "
                   "the anchor launcher on --triton-ports; '-' attaches to a running one)")
    p.add_argument("--triton-ports", default="18000,18001,18002", metavar="HTTP,GRPC[,MET]")
    p.add_argument("--shmserve", default=None, help="command that starts shmserve "
                   "(default: .venv's shmserve on --shmserve-ports; '-' attaches); "
                   "{repo}, {http}, {grpc} and {metrics} in it are filled in")
    p.add_argument("--shmserve-ports", default="28000,28001,28002",
                   metavar="HTTP,GRPC[,MET]")
    p.add_argument("--server", nargs=4, action="append", metavar=("NAME", "HTTP", "GRPC", "CMD"),
                   help="a server (repeatable; replaces --triton/--shmserve; the first is "
                        "the baseline; CMD '-' attaches to a running server)")
    p.add_argument("--skip", action="append", default=[], choices=["triton", "shmserve"],
                   help="leave one of the default servers out")
    p.add_argument("--model", default="identity_fp32")
    p.add_argument("--protocols", default="http,grpc")
    p.add_argument("--shape", action="append", type=bench.parse_shape,
                   help="repeatable (default: 1,16 and 1,262144)")
    p.add_argument("--dtype", default="FP32", type=str.upper)
    p.add_argument("--concurrency", type=bench.parse_int_list, default=[1, 4, 16])
    p.add_argument("--shm", default="none", help="comma list of none,system,cuda")
    p.add_argument("--cuda-device", type=int, default=0,
                   help="the GPU that holds the clients' regions with --shm cuda")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--max-requests", type=int, default=None)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    p.add_argument("--client-processes", type=int, default=1)
    p.add_argument("--server-cpus", default=None, metavar="LIST",
                   help="run every server on these CPUs (e.g. 1 or 2-7); on a small "
                        "machine, where a hop between processes on different CPUs costs "
                        "far more than one on the same CPU, this changes the figures "
                        "of both servers (see docs/performance.md)")
    p.add_argument("--client-cpus", default=None, metavar="LIST",
                   help="run the load generator on these CPUs (e.g. 0)")
    p.add_argument("--verify", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--one-at-a-time", action="store_true",
                   help="only one server alive at a time: each server runs its own block "
                        "of points per round")
    p.add_argument("--ready-timeout", type=float, default=120.0)
    p.add_argument("--stop-timeout", type=float, default=30.0)
    p.add_argument("--log-dir", default="/tmp/compare_logs")
    p.add_argument("--json", default=None, metavar="PATH")
    return p


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    specs = parse_servers(args)
    if not specs:
        raise SystemExit("compare: no servers")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise SystemExit("compare: server names must differ")
    protocols = [x.strip() for x in args.protocols.split(",") if x.strip()]
    shms = [x.strip() for x in args.shm.split(",") if x.strip()]
    for x in protocols:
        if x not in ("http", "grpc"):
            raise SystemExit(f"compare: unknown protocol {x}")
    for x in shms:
        if x not in SHMS:
            raise SystemExit(f"compare: unknown --shm {x}")
    points = build_points(protocols, args.shape or [[1, 16], [1, 262144]], shms,
                          args.concurrency)
    verify = bench.default_verify(args.model) if args.verify is None else args.verify
    os.makedirs(args.log_dir, exist_ok=True)
    servers = [Server(s, args.log_dir, args.ready_timeout, args.stop_timeout, args.model)
               for s in specs]
    # CPU placement: the same for every server, so they compare on equal terms; the
    # client pool inherits this process's
    cpus = place(args.server_cpus, args.client_cpus)
    for s in servers:
        s.cpus = cpus

    rows: list[dict] = []

    def measure(pool, server, pt, rnd):
        rows.append(measure_row(
            pool, server, pt, rnd, model=args.model, dtype=args.dtype,
            duration=args.duration, warmup=args.warmup, timeout=args.timeout,
            max_requests=args.max_requests, verify=verify,
            client_processes=args.client_processes, cuda_device=args.cuda_device))

    print(f"# compare {' vs '.join(names)}: {len(points)} points x {args.rounds} rounds, "
          f"{args.duration}s each (+{args.warmup}s warmup), verify={verify}", flush=True)
    # SIGTERM unwinds like Ctrl-C, so the servers started here are always stopped
    signal.signal(signal.SIGTERM, _interrupt)
    status = 0
    try:
        with bench.ClientPool(args.client_processes) as pool:
            if not args.one_at_a_time:
                for s in servers:
                    s.start()
            print(bench.format_header(), flush=True)
            for rnd in range(1, args.rounds + 1):
                if args.one_at_a_time:
                    for s in servers:
                        s.start()
                        try:
                            for pt in points:
                                measure(pool, s, pt, rnd)
                        finally:
                            s.stop()
                else:
                    for pt in points:
                        for s in servers:
                            measure(pool, s, pt, rnd)
    except KeyboardInterrupt:
        print("compare: interrupted; summarizing what was measured", file=sys.stderr)
        status = 130
    except RuntimeError as e:  # a server did not start or become ready
        print(f"compare: {e}", file=sys.stderr)
        status = 2
    finally:
        for s in servers:
            s.stop()

    summary = summarize(rows, names, points)
    print()
    print(format_summary(summary, names))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": {"argv": sys.argv[1:] if argv is None else list(argv),
                                "servers": [asdict(s) for s in specs],
                                "machine": bench.machine_info()},
                       "rows": rows, "summary": summary}, f, indent=1)
            f.write("\n")
    bad = [r for r in rows if r["errors"] or r["mismatches"] or not r["requests"]]
    for r in bad:
        print(f"compare: FAILED {r['server']} {r['point']} r{r['round']}: "
              f"{r['requests']} requests, {r['errors']} errors, {r['mismatches']} "
              f"mismatches {r['first_error']}", file=sys.stderr)
    return status or (1 if bad else 0)


if __name__ == "__main__":
    sys.exit(main())
