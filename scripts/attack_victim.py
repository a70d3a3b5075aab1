#!/usr/bin/env python3
"""The other client of scripts/attack_probe.py, in its own process so that the
attacker's Python loops cannot slow it: a [1,16] FP32 ModelInfer every `--interval`
seconds over gRPC and over HTTP at the same time (tritonclient, each call with a
timeout). Driven by lines on stdin, answering JSON lines on stdout:

    start            begin sending (a reply: {"started": true})
    stop             stop; reply with every call since start: {"grpc": [[t, ms, kind], ...],
                     "http": [...], "first_error": {...}} (t: CLOCK_MONOTONIC seconds;
                     ms null unless kind is "ok"; kind ok | timeout | error)
    check TIMEOUT    one call per protocol: {"grpc": [ms, kind], "http": [ms, kind]}
    quit
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import numpy as np

KINDS = ("ok", "timeout", "error")


def classify(exc: BaseException) -> str:
    text = f"{type(exc).__name__} {exc}".lower()
    return "timeout" if ("timeout" in text or "deadline" in text or "timed out" in text) \
        else "error"


class Caller:
    """One protocol's client, made again after any failure (a broken connection must
    not turn every later call into an error)."""

    def __init__(self, protocol: str, url: str, model: str, timeout: float):
        self.protocol, self.url, self.model, self.timeout = protocol, url, model, timeout
        self.x = np.arange(16, dtype=np.float32).reshape(1, 16)
        self.client = None

    def _make(self):
        if self.protocol == "grpc":
            import tritonclient.grpc as g
            self.mod = g
            self.client = g.InferenceServerClient(self.url)
        else:
            import tritonclient.http as h
            self.mod = h
            self.client = h.InferenceServerClient(self.url, connection_timeout=self.timeout,
                                                  network_timeout=self.timeout)

    def call(self) -> tuple[float | None, str, str]:
        """(ms, kind, error text)."""
        timeout = self.timeout
        t = time.perf_counter()
        try:
            if self.client is None:
                self._make()
            inp = self.mod.InferInput("INPUT0", [1, 16], "FP32")
            inp.set_data_from_numpy(self.x)
            if self.protocol == "grpc":
                r = self.client.infer(self.model, [inp], client_timeout=timeout)
            else:  # the client's own network timeout
                r = self.client.infer(self.model, [inp])
            out = r.as_numpy("OUTPUT0")
            if out is None or not np.array_equal(out, self.x):
                return None, "error", "wrong output"
            return (time.perf_counter() - t) * 1e3, "ok", ""
        except Exception as exc:  # noqa: BLE001 -- every failure is a measured outcome
            kind = classify(exc)
            self._drop()
            return None, kind, f"{type(exc).__name__}: {str(exc)[:200]}"

    def _drop(self):
        c, self.client = self.client, None
        if c is not None:
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass


class Victim:
    """One thread per protocol for the process's whole life (tritonclient.http's
    gevent hub belongs to the thread that made the client), sending while `running`
    is set; start() and stop() open and close a window of records."""

    def __init__(self, args):
        self.callers = {k: Caller(k, getattr(args, k), args.model, args.timeout)
                        for k in ("grpc", "http") if k in args.protocols}
        self.interval = args.interval
        self.running = threading.Event()
        self.lock = threading.Lock()
        self.idle = {k: threading.Event() for k in self.callers}
        self.records: dict[str, list] = {k: [] for k in self.callers}
        self.first_error: dict[str, str] = {}
        self.checkers: dict[tuple, Caller] = {}
        for k in self.callers:
            self.idle[k].set()
            threading.Thread(target=self._loop, args=(k,), daemon=True).start()

    def start(self):
        with self.lock:
            self.records = {k: [] for k in self.callers}
            self.first_error = {}
        self.running.set()

    def _loop(self, protocol: str):
        caller, idle = self.callers[protocol], self.idle[protocol]
        while True:
            self.running.wait()
            idle.clear()
            next_at = time.monotonic()
            while self.running.is_set():
                t = time.monotonic()
                ms, kind, err = caller.call()
                with self.lock:
                    self.records[protocol].append([t, None if ms is None else round(ms, 3),
                                                   kind])
                    if err and protocol not in self.first_error:
                        self.first_error[protocol] = err
                # paced, not bunched: ticks missed while a call hung are skipped
                next_at += self.interval
                now = time.monotonic()
                if next_at < now:
                    next_at = now
                time.sleep(next_at - now)
            idle.set()

    def stop(self) -> dict:
        """Stop sending; every call under way ends (each has its timeout) first."""
        self.running.clear()
        for e in self.idle.values():
            e.wait()
        with self.lock:
            return {**self.records, "first_error": self.first_error}

    def check(self, timeout: float) -> dict:
        """One call per protocol, on clients of their own (with this timeout), made
        and used on this (the main) thread."""
        out = {}
        for k, c in self.callers.items():
            if (k, timeout) not in self.checkers:
                self.checkers[(k, timeout)] = Caller(k, c.url, c.model, timeout)
            ms, kind, err = self.checkers[(k, timeout)].call()
            out[k] = [ms, kind, err]
        return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grpc", required=True, help="host:port")
    p.add_argument("--http", required=True, help="host:port")
    p.add_argument("--model", default="identity_fp32")
    p.add_argument("--interval", type=float, default=0.02)
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--protocols", default="grpc,http")
    args = p.parse_args(argv)
    args.protocols = [x.strip() for x in args.protocols.split(",") if x.strip()]
    v = Victim(args)

    def say(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    say({"ready": True})
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "start":
            v.start()
            say({"started": True})
        elif cmd[0] == "stop":
            say(v.stop())
        elif cmd[0] == "check":
            say(v.check(float(cmd[1]) if len(cmd) > 1 else 1.0))
        elif cmd[0] == "quit":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
