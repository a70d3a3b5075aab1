#!/usr/bin/env python3
"""How many times each process of a server wakes per request: the context switches
(voluntary: it slept and was woken; involuntary: it was preempted) and the CPU time of
every role (frontend, scheduler, worker...), summed over its threads, between two
samples of /proc, around N requests sent at concurrency C over HTTP or gRPC. A
process that sleeps in epoll and is woken by a message counts one voluntary switch
per wake-up, so no counters in the server are needed and any server can be measured
(Triton's tritonserver and python_stub too).

    scripts/wake_count.py --start [--model identity_fp32] [--requests 2000] [-c 1,4]
    scripts/wake_count.py --pid SERVER_PID --http 8000 --grpc 8001
    scripts/wake_count.py --pid SERVER_PID ... --bench "--shm cuda" --duration 4

--bench sends the load with scripts/bench (these flags added to its own) instead of
this script's clients, and counts inside the bench's measured window: the CUDA-region
path (`--shm cuda`), the system-shm one, or anything else the bench can send. The
request count is then the bench's throughput over the counted seconds.
--start runs shmserve (this checkout) on examples/model_repository on free ports.
Numbers are per request; the load average is printed with them (a busy machine adds
involuntary switches, not voluntary ones).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from scheduler.bench.procs import (describe, process_tree,  # noqa: E402
                                   user_system_seconds)


def _per_thread(pid: int, name: str):
    """The text of /proc/PID/task/TID/`name` of every thread of `pid` that is still
    there when read."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/{name}") as f:
                yield f.read()
        except OSError:
            pass


def switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of every thread of `pid`."""
    vol = invol = 0
    for text in _per_thread(pid, "status"):
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                vol += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                invol += int(line.split()[1])
    return vol, invol


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of `pid` in ns (schedstat: finer than clock ticks)."""
    return sum(int(text.split()[0]) for text in _per_thread(pid, "schedstat"))


def user_sys(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of `pid`, in clock ticks' grain: the split of cpu_ns
    between the process's own code and the kernel's work for it; (0, 0) once gone."""
    return user_system_seconds(pid) or (0.0, 0.0)


def sample(roles: dict[int, str]) -> dict[int, tuple[int, int, float, float, float]]:
    return {pid: (*switches(pid), cpu_ns(pid) / 1e9, *user_sys(pid)) for pid in roles}


def per_role(roles, before, after, n: int) -> dict[str, list[float]]:
    """role -> voluntary and involuntary switches, CPU us, and the system share of
    that CPU (%), per request."""
    out: dict[str, list[float]] = {}
    for pid, role in roles.items():
        if pid in before and pid in after:
            row = out.setdefault(role, [0.0] * 5)
            for i in range(5):
                row[i] += after[pid][i] - before[pid][i]
    return {role: [v / n, i / n, cpu / n * 1e6, 100 * sy / (us + sy) if us + sy else 0.0]
            for role, (v, i, cpu, us, sy) in out.items()}


def client_factory(protocol: str, url: str, model: str, shape: list[int]):
    data = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    if protocol == "http":
        import tritonclient.http as tc
    else:
        import tritonclient.grpc as tc

    def make():
        client = tc.InferenceServerClient(url)
        inp = tc.InferInput("INPUT0", shape, "FP32")
        inp.set_data_from_numpy(data)

        def one():
            client.infer(model, [inp])
        return one
    return make


def run(make, n: int, concurrency: int) -> None:
    per = n // concurrency
    gate = threading.Barrier(concurrency + 1)

    def loop():
        call = make()  # a client per thread (the HTTP one is gevent's: one thread)
        for _ in range(20):  # connection open, first-request costs paid
            call()
        gate.wait()
        for _ in range(per):
            call()
    threads = [threading.Thread(target=loop) for _ in range(concurrency)]
    for t in threads:
        t.start()
    gate.wait()
    for t in threads:
        t.join()


def counted_by_bench(roles, url: str, protocol: str, model: str, shape, c: int,
                     bench: list[str], duration: float):
    """(req/s, before, after, requests) of scripts/bench's measured window."""
    from bench_mlp import run_bench
    row, seconds, before, after = run_bench(
        ["--url", url, "--protocol", protocol, "--model", model, "--shape",
         ",".join(map(str, shape)), "--concurrency", str(c), *bench],
        1.0, duration, lambda client: sample(roles))
    return row["throughput"], before, after, row["throughput"] * seconds


def measure(root: int, ports: dict, model: str, shape, n: int, levels, protocols,
            bench: list[str] | None = None, duration: float = 4.0) -> None:
    roles = describe(process_tree(root))
    print(f"load average {os.getloadavg()[0]:.2f}; per request: voluntary / involuntary "
          "switches, CPU us, the kernel's share of that CPU")
    for protocol in protocols:
        url = f"127.0.0.1:{ports[protocol]}"
        make = client_factory(protocol, url, model, shape)
        for c in levels:
            if bench is not None:
                rate, before, after, count = counted_by_bench(
                    roles, url, protocol, model, shape, c, bench, duration)
                rows = per_role(roles, before, after, count)
            else:
                run(make, 40 * c, c)  # warm
                before = sample(roles)
                t0 = time.perf_counter()
                run(make, n, c)
                rate = n / (time.perf_counter() - t0)
                rows = per_role(roles, before, sample(roles), n - n % c)
            print(f"{protocol} c={c}: {rate:.0f} req/s")
            for role, (v, i, cpu, system) in sorted(rows.items()):
                if v >= 0.01 or cpu >= 1:
                    print(f"  {role:40s} {v:6.2f} {i:6.2f} {cpu:8.1f} {system:5.0f}%")
            print(f"  load average {os.getloadavg()[0]:.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--start", action="store_true", help="start shmserve on free ports")
    p.add_argument("--pid", type=int, help="the server's top process")
    p.add_argument("--http", type=int, default=8000)
    p.add_argument("--grpc", type=int, default=8001)
    p.add_argument("--repo", default="examples/model_repository")
    p.add_argument("--model", default="identity_fp32")
    p.add_argument("--shape", default="1,16")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("-c", "--concurrency", default="1,4")
    p.add_argument("--protocols", default="http,grpc")
    p.add_argument("--bench", metavar="FLAGS", default=None,
                   help="load from scripts/bench with these flags added, e.g. '--shm cuda'")
    p.add_argument("--duration", type=float, default=4.0,
                   help="with --bench: its measured seconds per row")
    p.add_argument("server_args", nargs="*", help="more shmserve flags (after --)")
    a = p.parse_args()
    shape = [int(x) for x in a.shape.split(",")]
    levels = [int(x) for x in a.concurrency.split(",")]
    protocols = a.protocols.split(",")
    bench = None if a.bench is None else shlex.split(a.bench)
    if not a.start:
        measure(a.pid, {"http": a.http, "grpc": a.grpc}, a.model, shape, a.requests,
                levels, protocols, bench, a.duration)
        return
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "tests", "e2e"))
    from harness import ServerProcess
    server = ServerProcess(a.repo, "--model-control-mode", "explicit", "--load-model",
                           a.model, *a.server_args).start()
    try:
        measure(server.proc.pid, {"http": server.http_port, "grpc": server.grpc_port},
                a.model, shape, a.requests, levels, protocols, bench, a.duration)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
