#!/usr/bin/env python3
"""What one hop between two processes costs on this machine: two Python processes
ping-pong a small message over a Unix socket pair, each waiting in epoll as the
server's processes do, first on two different CPUs, then both on one. Prints the
round trip and the CPU each side spends per round trip.

A request to shmserve hops frontend -> scheduler -> worker -> frontend; where a hop to
a process on another CPU costs several times one on the same CPU (virtual machines
often), `shmserve --cpus` that keeps the server's processes together pays
(docs/performance.md).

    scripts/wake_cost.py [--round-trips 20000]
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import time


def ping_pong(n: int, cpus: tuple[int, int] | None) -> tuple[float, float, float]:
    """(wall us, parent CPU us, child CPU us) per round trip."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        try:
            a.close()
            if cpus:
                os.sched_setaffinity(0, {cpus[1]})
            poller = select.epoll()
            poller.register(b.fileno(), select.EPOLLIN)
            for _ in range(n):
                poller.poll()
                b.recv(64)
                b.sendall(b"y" * 32)
        finally:
            os._exit(0)
    b.close()
    before = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, {cpus[0]})
    try:
        poller = select.epoll()
        poller.register(a.fileno(), select.EPOLLIN)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            a.sendall(b"x" * 32)
            poller.poll()
            a.recv(64)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        os.sched_setaffinity(0, before)
        a.close()
    _, _, usage = os.wait4(pid, 0)
    child = usage.ru_utime + usage.ru_stime
    return 1e6 * wall / n, 1e6 * cpu / n, 1e6 * child / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--round-trips", type=int, default=20000)
    args = p.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    cases = [("same CPU", (cpus[0], cpus[0]))]
    if len(cpus) > 1:
        cases.insert(0, ("two CPUs", (cpus[0], cpus[1])))
    for name, pair in cases:
        wall, parent, child = ping_pong(args.round_trips, pair)
        print(f"{name:>9} (CPU {pair[0]} and {pair[1]}): round trip {wall:6.1f} us; "
              f"CPU per round trip {parent:5.1f} us + {child:5.1f} us")


if __name__ == "__main__":
    main()
