#!/usr/bin/env python3
"""Kill -9 of each child kind under load, measured.

For each kind (worker, scheduler, frontend) and round: a fresh shmserve on
tests/models_faults (one frontend process; `faulty` has two python instances), a load
of `--threads` client threads (half HTTP, half gRPC) sending 20 ms requests, and one
held 15 s request (HTTP and gRPC in turn, round by round). Then the child is killed with SIGKILL and these are
taken (seconds after the kill):

- held_fail: until the held request (on the killed child's path) failed;
- inflight_end: until every load request in flight at the kill had ended;
- unready: how long /v2/health/ready said no (polled every 20 ms; 0 for a worker: the
  other instance serves, the server stays ready);
- serving: until a request succeeded again through both protocols, and, for a worker,
  until the restarted instance answered one.

The load and readiness helpers are the fault tests' own (tests/e2e/test_faults.py).

    scripts/bench_faults.py --rounds 3
    scripts/bench_faults.py --kinds scheduler --rounds 5 --json /tmp/faults.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e import clients  # noqa: E402
from tests.e2e.harness import ServerProcess, wait_until  # noqa: E402
from tests.e2e.test_faults import REPO, SERVE, Load, ReadinessPoll, _client, _infer  # noqa: E402

KINDS = ("worker", "scheduler", "frontend")


def _held(srv, markers, protocol):
    import concurrent.futures as cf
    pool = cf.ThreadPoolExecutor(1)
    before = set(os.listdir(markers))
    fut = pool.submit(lambda: _infer(_client(srv, protocol), protocol, SERVE, 15000))
    pool.shutdown(wait=False)
    name = wait_until(lambda: next((n for n in os.listdir(markers)
                                    if n.startswith("running-") and n not in before), None),
                      20, what="a held request running")
    return fut, int(name.split("-")[1])


def _ended(fut) -> float | None:
    """When a held request ended (its done callback time), waiting up to 20 s."""
    try:
        fut.result(timeout=20)
    except Exception:  # noqa: BLE001 -- a failure is what is measured
        pass
    return getattr(fut, "ended_at", None)


def one_round(kind: str, threads: int, held_protocol: str) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-faults-"))
    markers = tmp / "markers"
    markers.mkdir()
    srv = ServerProcess(REPO, frontends=1, log_dir=tmp,
                        env={"SHMSERVE_TEST_MARKER_DIR": str(markers)}).start()
    try:
        with Load(srv, threads=threads, delay_ms=20) as load, ReadinessPoll(srv) as poll:
            wait_until(lambda: len(load.served_since(0)) >= 20, 30, what="load")
            # one held request (the other instance serves the load): a killed
            # frontend's or scheduler's request still runs in its worker until it ends
            # (or `faulty`'s 3 s execute timeout), and two would hold both instances
            held = []
            for p in [held_protocol]:
                fut, pid = _held(srv, markers, p)
                fut.add_done_callback(lambda f: setattr(f, "ended_at", time.monotonic()))
                held.append((fut, pid))
            if kind == "worker":
                victim = held[0][1]
            elif kind == "scheduler":
                victim = srv.scheduler_pid()
            else:
                victim = next(p for p in srv.children()
                              if b"frontend.main" in open(f"/proc/{p}/cmdline", "rb").read())
            before = {c[3] for c in load.snapshot()}
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            held_end = max(_ended(f) or float("inf") for f, _ in held) - killed
            deadline = killed + 60

            def served_both():
                return all(load.served_since(killed + 0.001, p) for p in clients.PROTOCOLS)

            wait_until(served_both, 60, what="served again")
            if kind == "worker":
                wait_until(lambda: {c[3] for c in load.served_since(killed)} - before,
                           60, what="restarted instance")
            serving = max(min(c[2] for c in load.served_since(killed + 0.001, p))
                          for p in clients.PROTOCOLS) - killed
            fresh = [c for c in load.served_since(killed) if c[3] not in before]
            restarted = min(c[2] for c in fresh) - killed if fresh else None
            in_flight = [c for c in load.snapshot() if c[1] < killed < c[2]]
            inflight_end = max((c[2] for c in in_flight), default=killed) - killed
            down = [t for t, ready in poll.seen if t > killed and not ready]
            back = next((t for t, ready in poll.seen if down and t > down[0] and ready),
                        None)
            unready = (back - killed) if down and back else 0.0
            errors = sum(1 for c in load.snapshot() if c[4] is not None)
            assert time.monotonic() < deadline
        row = {"kind": kind, "held_over": held_protocol, "held_fail_s": held_end, "inflight_end_s": inflight_end,
               "unready_s": unready, "serving_s": serving,
               "instance_back_s": restarted if kind == "worker" else None,
               "load_errors": errors, "load_requests": len(load.snapshot())}
    finally:
        code = srv.stop()
        left = srv.segments()
    row.update(exit_code=code, shm_left=len(left))
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--json", default="")
    args = p.parse_args()
    rows = []
    for n in range(args.rounds):
        for kind in args.kinds.split(","):
            row = one_round(kind, args.threads, clients.PROTOCOLS[n % 2])
            rows.append(row)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                              for k, v in row.items()}), flush=True)
    cols = ("held_fail_s", "inflight_end_s", "unready_s", "serving_s", "instance_back_s")
    print(f"\n{'kind':<10}" + "".join(f"{c:>17}" for c in cols) + "   (median [max])")
    for kind in args.kinds.split(","):
        mine = [r for r in rows if r["kind"] == kind]
        cells = []
        for c in cols:
            vals = [r[c] for r in mine if r[c] is not None]
            cells.append(f"{statistics.median(vals):.2f} [{max(vals):.2f}]" if vals else "-")
        print(f"{kind:<10}" + "".join(f"{x:>17}" for x in cells))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
