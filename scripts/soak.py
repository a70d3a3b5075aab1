#!/usr/bin/env python3
"""Soak test: a steady mixed load for minutes, sampling what leaks.

Starts shmserve on the example repository (or drives one you name with --http-url /
--grpc-url, and samples its processes when you give --server-pid), runs
--concurrency closed-loop clients (half HTTP, half gRPC) on identity_fp32 with small
and 256 KiB inputs, every --shm-every'th request through a system shared-memory region
that the client creates, registers, uses for input and output, unregisters and
destroys, and every --sample-secs (60: once a minute) samples:

- RSS (and its anonymous part, where a leak shows) and open file descriptors of every
  server process, by role (scheduler, frontend[i], worker <model instance>), found as
  the children of the scheduler's pid;
- entries in /dev/shm: the server's own segments and the client's regions;
- requests done and errors so far (a wrong answer counts as an error).

Writes the samples as JSON (--out) and prints a table of the first sample against the
last. Exit status 0 only when no request failed and, for a server started here, it
stopped with code 0 and left nothing in /dev/shm.

    python scripts/soak.py --minutes 10
    python scripts/soak.py --seconds 20 --sample-secs 5 --out /tmp/soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODEL = "identity_fp32"  # examples/model_repository: FP32 [-1], dynamic batching
SMALL, LARGE = 16, 65536  # elements: inline-sized and arena-sized (256 KiB) inputs


# ------------------------------------------------------------------------- the server

def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _ready(http_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{http_url}/v2/health/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


class Server:
    """shmserve on free loopback ports, client shm allowed, its log in a file."""

    def __init__(self, repo: Path, frontends: int | None, log_path: Path):
        self.http_port, self.grpc_port, self.metrics_port = _free_ports(3)
        self.argv = [sys.executable, "-m", "scheduler.main", "--model-repository",
                     str(repo), "--allow-client-shm=true",
                     "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
                     "--metrics-address", "127.0.0.1", "--http-port", str(self.http_port),
                     "--grpc-port", str(self.grpc_port),
                     "--metrics-port", str(self.metrics_port)]
        if frontends:
            self.argv += ["--frontend-processes", str(frontends)]
        self.log_path = log_path
        self.http_url = f"127.0.0.1:{self.http_port}"
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"

    def start(self, timeout: float = 180.0) -> None:
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, stdout=self._log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not _ready(self.http_url):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"the server did not become ready; see {self.log_path}")
            time.sleep(0.2)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


# ------------------------------------------------------------------------ the sampler

def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _arg(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else None


def role_of(pid: int, root: int) -> str | None:
    """scheduler, frontend[i] or worker <instance> (without the restart generation, so
    a restarted worker keeps its row); None for a process that is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return None
    if pid == root:
        return "scheduler"
    if "frontend.main" in argv:
        return f"frontend[{_arg(argv, '--index')}]"
    if "workers.main" in argv:
        return f"worker {(_arg(argv, '--name') or str(pid)).split('#')[0]}"
    return os.path.basename(argv[0]) if argv else str(pid)


_STATUS = {"VmRSS:": "rss_kib", "RssAnon:": "anon_kib", "RssFile:": "file_kib",
           "RssShmem:": "shmem_kib"}


def process_sample(pid: int) -> dict | None:
    """RSS (KiB; also split into anonymous, file-backed and shared-memory pages) and
    open fds of one process. A leak shows in anon_kib: file pages (libraries, modules)
    come and go with the machine's memory pressure, mapped arenas in shmem_kib."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = _STATUS.get(line.split(maxsplit=1)[0] if line.strip() else "")
                if key:
                    out[key] = int(line.split()[1])
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    return out if "rss_kib" in out else None


def server_sample(root: int) -> dict[str, dict]:
    """Every process of the server's tree, by role (several with one role are summed
    under the role and listed by pid)."""
    out: dict[str, dict] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        todo.extend(_children(pid))
        role = role_of(pid, root)
        sample = process_sample(pid) if role else None
        if sample is None:
            continue
        if role in out:  # e.g. a worker and its own helper process
            for key, value in sample.items():
                out[role][key] = out[role].get(key, 0) + value
            out[role]["pids"].append(pid)
        else:
            out[role] = {**sample, "pids": [pid]}
    return out


def dev_shm(server_pid: int | None, client_prefix: str) -> dict[str, int]:
    names = os.listdir("/dev/shm")
    out = {"total": len(names),
           "client_regions": sum(n.startswith(client_prefix) for n in names)}
    if server_pid is not None:
        prefix = f"shmserve-{server_pid:x}"
        out["server_segments"] = sum(n.startswith(prefix) for n in names)
    return out


# --------------------------------------------------------------------------- the load

class Load:
    """`concurrency` closed-loop clients; counts requests and errors."""

    def __init__(self, http_url: str, grpc_url: str, concurrency: int, shm_every: int):
        self.http_url, self.grpc_url = http_url, grpc_url
        self.concurrency, self.shm_every = concurrency, shm_every
        self.stop = threading.Event()
        self.done = [0] * concurrency
        self.shm_done = [0] * concurrency
        self.failed = [0] * concurrency
        self.messages: dict[str, int] = {}
        self.prefix = f"soak{os.getpid()}_"
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(concurrency)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)

    def counts(self) -> dict[str, int]:
        return {"requests": sum(self.done), "shm_requests": sum(self.shm_done),
                "errors": sum(self.failed)}

    def _run(self, i: int) -> None:
        if i % 2 == 0:
            import tritonclient.http as mod
            client = mod.InferenceServerClient(self.http_url, network_timeout=120)
        else:
            import tritonclient.grpc as mod
            client = mod.InferenceServerClient(self.grpc_url)
        n = 0
        while not self.stop.is_set():
            n += 1
            # every 5th is large: 5 is prime to --shm-every 4, so both paths get both sizes
            size = LARGE if n % 5 == 0 else SMALL
            x = np.full((1, size), float(n % 1000), dtype=np.float32)
            try:
                if self.shm_every and n % self.shm_every == 0:
                    self._through_shm(mod, client, x, f"{self.prefix}{i}_{n}")
                    self.shm_done[i] += 1
                else:
                    inp = mod.InferInput("INPUT0", list(x.shape), "FP32")
                    inp.set_data_from_numpy(x)
                    out = client.infer(MODEL, [inp]).as_numpy("OUTPUT0")
                    if not np.array_equal(out, x):
                        raise AssertionError("wrong answer")
                self.done[i] += 1
            except Exception as e:  # counted and kept: the soak reports them all
                self.failed[i] += 1
                key = f"{type(e).__name__}: {e}"[:300]
                self.messages[key] = self.messages.get(key, 0) + 1
        client.close()

    @staticmethod
    def _through_shm(mod, client, x: np.ndarray, name: str) -> None:
        """Create, register, infer in, unregister and destroy one region."""
        import tritonclient.utils.shared_memory as shm
        nbytes = x.nbytes
        handle = shm.create_shared_memory_region(name, "/" + name, 2 * nbytes)
        registered = False
        try:
            shm.set_shared_memory_region(handle, [x])
            client.register_system_shared_memory(name, "/" + name, 2 * nbytes)
            registered = True
            inp = mod.InferInput("INPUT0", list(x.shape), "FP32")
            inp.set_shared_memory(name, nbytes)
            out = mod.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory(name, nbytes, offset=nbytes)
            client.infer(MODEL, [inp], outputs=[out])
            got = shm.get_contents_as_numpy(handle, np.float32, list(x.shape),
                                            offset=nbytes)
            if not np.array_equal(got, x):
                raise AssertionError("wrong answer in the shared-memory region")
        finally:
            if registered:
                client.unregister_system_shared_memory(name)
            shm.destroy_shared_memory_region(handle)


# ------------------------------------------------------------------------- the report

def table(report: dict) -> str:
    samples = report["samples"]
    first, last = samples[0], samples[-1]
    a, b = f"@{first['t']:.0f}s", f"@{last['t']:.0f}s"
    rows = [("process", f"RSS MiB {a}", f"RSS MiB {b}", f"anon MiB {a}", f"anon MiB {b}",
             "d anon", f"fds {a}", f"fds {b}")]

    def mib(s, key):
        return "-" if s is None or key not in s else f"{s[key] / 1024:.1f}"

    for role in sorted(set(first["processes"]) | set(last["processes"])):
        p, q = first["processes"].get(role), last["processes"].get(role)
        delta = "-" if p is None or q is None or "anon_kib" not in p else \
            f"{(q['anon_kib'] - p['anon_kib']) / 1024:+.1f}"
        rows.append((role, mib(p, "rss_kib"), mib(q, "rss_kib"), mib(p, "anon_kib"),
                     mib(q, "anon_kib"), delta, "-" if p is None else str(p["fds"]),
                     "-" if q is None else str(q["fds"])))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if c == 0 else cell.rjust(w)
                       for c, (cell, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    for what in ("server_segments", "client_regions", "total"):
        if what in first["dev_shm"]:
            lines.append(f"/dev/shm {what}: {first['dev_shm'][what]} {a} -> "
                         f"{last['dev_shm'][what]} {b}")
    span = last["t"] - first["t"]
    rate = (last["requests"] - first["requests"]) / span if span > 0 else 0.0
    lines.append(f"requests: {last['requests']} ({last['shm_requests']} through shm "
                 f"regions), errors: {last['errors']}, {rate:.0f} infer/s between "
                 f"the samples, concurrency {report['config']['concurrency']}")
    return "\n".join(lines)


def run(args) -> int:
    server = None
    if args.http_url:
        http_url, grpc_url, pid = args.http_url, args.grpc_url, args.server_pid
    else:
        server = Server(ROOT / "examples" / "model_repository", args.frontends,
                        Path(args.log))
        server.start()
        http_url, grpc_url, pid = server.http_url, server.grpc_url, server.pid
    duration = args.seconds if args.seconds is not None else args.minutes * 60
    load = Load(http_url, grpc_url, args.concurrency, args.shm_every)
    report = {"config": {"duration_s": duration, "sample_s": args.sample_secs,
                         "concurrency": args.concurrency, "shm_every": args.shm_every,
                         "http_url": http_url, "grpc_url": grpc_url, "server_pid": pid},
              "samples": []}
    start = time.monotonic()
    load.start()
    try:
        ticks = max(1, round(duration / args.sample_secs))
        for k in range(1, ticks + 1):
            # sleep to the next sample time; the load threads keep running meanwhile
            time.sleep(max(0.0, start + duration * k / ticks - time.monotonic()))
            sample = {"t": round(time.monotonic() - start, 1), **load.counts(),
                      "dev_shm": dev_shm(pid, load.prefix),
                      "processes": server_sample(pid) if pid else {}}
            report["samples"].append(sample)
            print(f"[{sample['t']:7.1f}s] requests {sample['requests']} errors "
                  f"{sample['errors']} /dev/shm {sample['dev_shm']}", flush=True)
    finally:
        load.join()
        report["final"] = {**load.counts(), "error_messages": load.messages,
                           "client_regions_left": dev_shm(None, load.prefix)
                           ["client_regions"]}
        if server is not None:
            report["final"]["server_exit_code"] = server.stop()
            prefix = f"shmserve-{server.pid:x}"
            report["final"]["server_segments_left"] = sorted(
                n for n in os.listdir("/dev/shm") if n.startswith(prefix))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(table(report))
    print(f"report: {args.out}")
    final = report["final"]
    ok = final["errors"] == 0 and final["client_regions_left"] == 0
    if server is not None:
        ok = ok and final["server_exit_code"] == 0 and not final["server_segments_left"]
    if final["error_messages"]:
        print("errors:", json.dumps(final["error_messages"], indent=1))
    return 0 if ok else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--minutes", type=float, default=10.0)
    g.add_argument("--seconds", type=float, default=None, help="instead of --minutes")
    p.add_argument("--sample-secs", type=float, default=60.0)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--shm-every", type=int, default=4,
                   help="every Nth request of a client goes through a fresh shm region "
                        "(0: never)")
    p.add_argument("--http-url", help="drive this server instead of starting one")
    p.add_argument("--grpc-url")
    p.add_argument("--server-pid", type=int,
                   help="with --http-url: the scheduler's pid, to sample its processes")
    p.add_argument("--frontends", type=int, default=None,
                   help="--frontend-processes of the server started here")
    p.add_argument("--out", default="/tmp/shmserve-soak.json")
    p.add_argument("--log", default="/tmp/shmserve-soak-server.log")
    args = p.parse_args(argv)
    if bool(args.http_url) != bool(args.grpc_url):
        p.error("--http-url and --grpc-url go together")
    sys.path.insert(0, str(ROOT))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
