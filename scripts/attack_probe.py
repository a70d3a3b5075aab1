#!/usr/bin/env python3
"""Attack probe: issue 25's hostile clients against Triton-protocol servers, one
attack at a time, while another client (scripts/attack_victim.py, its own process)
sends a [1,16] FP32 ModelInfer every 20 ms over gRPC and over HTTP, and the server's
memory is sampled (private RSS of its process tree + its shared-memory files, each
counted once: scripts/attack_memory.py). One row per attack:

    attack | victim gRPC p99/max/errors | victim HTTP ... | memory +peak/+after | fate

    scripts/attack_probe                                  # shmserve and Triton, all
    scripts/attack_probe --cases rapid-reset,ping-flood --duration 2 --skip triton
    scripts/attack_probe --server mine 8000 8001 -        # attach (PID by its port)
    scripts/attack_probe --server mine 8000 8001 pid:1234 # attach, sample 1234's tree
    scripts/attack_probe --server old 0 0 "CMD {repo} {http} {grpc} {metrics}"  # start

Before the first case (and after a restart) each server answers one 1 MiB request
per protocol, so that what it allocates once on its first large tensor is not charged
to an attack. Each case: the attack runs for --duration seconds (probes of one kind of
request, for half of it), the memory is read --after seconds after the attacker left
("+after": what was not given back), then the probe waits (at most --settle seconds) for the
server to answer both protocols within 100 ms and its memory to stop moving. A server
that died or did not settle is restarted if the probe started it; an attached one
ends its block. Every socket operation has a deadline, so the probe cannot hang.

The servers need --model-control-mode=explicit (repository load cases) and client
shared memory allowed (shmserve: --allow-client-shm true); the default commands pass
them. A case that does not apply says so in its row.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(1, ROOT)  # attack_wire encodes with the server's HPACK integer

import attack_cases as cases  # noqa: E402
from attack_memory import Sampler, shm_mappings, tree_pids  # noqa: E402
from attack_report import side_by_side, table, victim_stats  # noqa: E402

EXAMPLES = os.path.join(ROOT, "examples", "model_repository")
TRITON_REPO = "/tmp/repo_anchor"
TRITON_CMD = ("/tmp/anchors/bin/run_triton_anchor {repo} {http} {grpc} {metrics} "
              "--http-address 127.0.0.1 --grpc-address 127.0.0.1 "
              "--metrics-address 127.0.0.1 --model-control-mode=explicit --load-model=*")
SHMSERVE_CMD = (f"env PYTHONPATH={ROOT} {sys.executable} -m scheduler.main "
                "--model-repository {repo} --http-port {http} --grpc-port {grpc} "
                "--metrics-port {metrics} --http-address 127.0.0.1 "
                "--grpc-address 127.0.0.1 "
                "--metrics-address 127.0.0.1 --model-control-mode explicit "
                "--load-model * --allow-client-shm true")
MIB = 1 << 20


# ------------------------------------------------------------------------ servers

def _http_ok(url: str, timeout: float = 2.0) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _post(url: str, body: bytes, timeout: float = 5.0) -> tuple[int, str]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with opener.open(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return 0, str(e)


def capabilities(host: str, http: int) -> dict:
    """What the server allows: explicit model control (a load of an absent model is
    refused as absent, not as 'not allowed') and client shared memory."""
    status, text = _post(f"http://{host}:{http}/v2/repository/models/"
                         "attack-probe-absent/load", b"{}")
    explicit = status != 0 and "not allowed" not in text.lower()
    shm = _http_ok(f"http://{host}:{http}/v2/systemsharedmemory/status")
    return {"explicit": explicit, "client_shm": shm}


def warm_up(host: str, http: int, grpc: int, model: str, timeout: float = 30.0) -> str:
    """One 1 MiB request over each protocol before anything is measured, so that what a
    server allocates once, on its first large tensor (shmserve's warm arena chunks,
    Triton's shared-memory pools), is not charged to the first attack that sends
    large data. '' when both were answered, else what went wrong."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    x = np.ones((1, 262144), np.float32)
    problems = []
    for mod, url in ((httpclient, f"{host}:{http}"), (grpcclient, f"{host}:{grpc}")):
        try:
            kwargs = ({"network_timeout": timeout, "connection_timeout": timeout}
                      if mod is httpclient else {})
            client = mod.InferenceServerClient(url, **kwargs)
            inp = mod.InferInput("INPUT0", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            call = {"client_timeout": timeout} if mod is grpcclient else {}
            client.infer(model, [inp], **call)
            client.close()
        except Exception as exc:  # the probe goes on: the rows say what happened
            problems.append(f"{mod.__name__.split('.')[-1]}: {exc}")
    return "; ".join(problems)


class Server:
    """A server under test: started from a command (own session, stopped by PID:
    SIGINT, a bounded wait, SIGKILL to its group), or attached to by its ports."""

    def __init__(self, name: str, cmd: str, http: int, grpc: int, log_dir: str,
                 repo: str, ready_timeout: float = 180.0):
        self.name, self.http, self.grpc = name, http, grpc
        self.attached = cmd.strip() in ("", "-") or cmd.startswith("pid:")
        self.attach_pid = int(cmd[4:]) if cmd.startswith("pid:") else None
        self.cmd = cmd
        if not self.attached:
            free = _free_ports(3)
            self.http, self.grpc = http or free[0], grpc or free[1]
            for key, value in (("repo", repo), ("http", self.http), ("grpc", self.grpc),
                               ("metrics", free[2])):
                self.cmd = self.cmd.replace("{%s}" % key, str(value))
        self.log_path = os.path.join(log_dir, f"attack-probe-{name}.log")
        self.log_dir = log_dir
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen | None = None

    @property
    def root(self) -> int | None:
        if self.proc is not None:
            return self.proc.pid
        if self.attach_pid:
            return self.attach_pid
        try:
            import bench  # scheduler.bench.main: finds the process listening on a port
            return bench.find_server(self.http)
        except Exception:  # noqa: BLE001 -- no PID: memory is not sampled
            return None

    def shm_prefixes(self) -> tuple[str, ...]:
        root = self.root
        return (f"shmserve-{root:x}",) if root else ()

    def start(self) -> None:
        if not self.attached:
            import shlex
            log = open(self.log_path, "ab")
            log.write(f"\n=== {time.ctime()} {self.cmd}\n".encode())
            log.flush()
            # own session (its children go with its group); a neutral cwd (Triton's
            # python stub puts cwd on sys.path)
            self.proc = subprocess.Popen(shlex.split(self.cmd), stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, cwd=self.log_dir)
            log.close()
            print(f"# started {self.name} pid {self.proc.pid}: {self.cmd}", flush=True)
        deadline = time.monotonic() + self.ready_timeout
        url = f"http://127.0.0.1:{self.http}/v2/health/ready"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; "
                                   f"log {self.log_path}")
            if _http_ok(url, 1.0):
                return
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"{self.name} not ready after {self.ready_timeout:g}s; "
                           f"log {self.log_path}")

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        root = self.root
        if root is None:
            return _http_ok(f"http://127.0.0.1:{self.http}/v2/health/live", 1.0)
        try:
            os.kill(root, 0)
            return True
        except ProcessLookupError:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        """SIGINT, `timeout` to exit, then SIGKILL to its group and to every process
        of its tree (a server's children may run in sessions of their own, and a hung
        one may outlive its parent and keep the ports); then its /dev/shm segments
        left behind are removed (and counted)."""
        p, self.proc = self.proc, None
        if p is None:
            return
        prefixes = (f"shmserve-{p.pid:x}",)
        tree = tree_pids(p.pid)
        # the shm files it maps (e.g. Triton's python backend regions): a server
        # killed mid-way leaves them behind
        mapped = {path.removesuffix(" (deleted)") for pid in tree
                  for path, _ in shm_mappings(pid).values()
                  if path.startswith("/dev/shm/")}
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _killpg(p.pid)
                p.wait()
        deadline = time.monotonic() + 5
        while _group_alive(p.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(p.pid):
            _killpg(p.pid)
        left = [pid for pid in tree[1:] if _alive(pid)]
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        leaked = [n for n in _listdir("/dev/shm")
                  if n.startswith(prefixes) or "/dev/shm/" + n in mapped]
        for n in leaked:
            try:
                os.unlink(os.path.join("/dev/shm", n))
            except OSError:
                pass
        print(f"# stopped {self.name} pid {p.pid} (exit {p.returncode})"
              + (f"; killed {len(left)} process(es) that outlived it" if left else "")
              + (f"; removed {len(leaked)} segment(s) it left in /dev/shm"
                 if leaked else ""), flush=True)


def _alive(pid: int) -> bool:
    """Running (a zombie, already dead, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _free_ports(n: int) -> list[int]:
    import socket
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


# ------------------------------------------------------------------------ the victim

class VictimProc:
    """scripts/attack_victim.py as a child, spoken to in JSON lines, every answer
    awaited with a deadline (a stuck victim is killed and started again)."""

    def __init__(self, server: Server, model: str, interval: float, timeout: float):
        self.argv = [sys.executable, os.path.join(HERE, "attack_victim.py"),
                     "--grpc", f"127.0.0.1:{server.grpc}",
                     "--http", f"127.0.0.1:{server.http}", "--model", model,
                     "--interval", str(interval), "--timeout", str(timeout)]
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None
        self._buf = b""

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        self._read(60.0)  # {"ready": true}

    def ask(self, cmd: str, wait: float) -> dict | None:
        try:
            self.proc.stdin.write(cmd.encode() + b"\n")
            self.proc.stdin.flush()
        except (OSError, AttributeError):
            return None
        return self._read(wait)

    def _read(self, wait: float) -> dict | None:
        deadline = time.monotonic() + wait
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
                if not chunk:
                    return None
                self._buf += chunk
        finally:
            sel.close()
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def restart(self) -> None:
        self.close()
        self._buf = b""
        self.start()

    def close(self) -> None:
        p, self.proc = self.proc, None
        if p is None:
            return
        try:
            p.stdin.write(b"quit\n")
            p.stdin.close()
            p.wait(timeout=self.timeout + 5)
        except (OSError, subprocess.TimeoutExpired):
            p.kill()
            p.wait()


# ------------------------------------------------------------------------ a case

def run_case(case, server: Server, victim: VictimProc, sampler: Sampler, target,
             args, caps: dict) -> dict:
    row = {"case": case.name, "label": case.label, "server": server.name}
    missing = [n for n in case.needs if not caps.get(n)]
    if missing:
        row["skipped"] = "needs " + " and ".join(
            {"explicit": "--model-control-mode=explicit",
             "client_shm": "client shared memory allowed"}[n] for n in missing)
        return row
    if case.name == "deep-json" and not (caps["explicit"] and caps["client_shm"]):
        row["note"] = "server lacks explicit mode or client shm: refused before parsing?"
    if case.prepare:
        case.prepare()
    window = args.duration / 2 if case.short else args.duration
    pids_before = set(_tree(server))
    m0 = sampler.sample()
    start = m0["total"] if m0 else None
    # the victim's window opens before its first call: a call that hangs from the
    # start is still in it
    tv = time.monotonic()
    if victim.ask("start", 10.0) is None:
        victim.restart()
        tv = time.monotonic()
        victim.ask("start", 10.0)
    t0 = time.monotonic()
    try:
        attack = case.run(target, t0 + window)
    except Exception as exc:  # noqa: BLE001 -- a refused connect, a reset: a result
        attack = {"fate": f"attack failed: {type(exc).__name__}: {exc}"}
    t1 = time.monotonic()
    # memory after the attacker left: sampled through the wait, read at its end
    end = t1 + args.after
    while time.monotonic() < end:
        time.sleep(min(0.1, end - time.monotonic()))
    m1 = sampler.sample()
    rec = victim.ask("stop", args.timeout + 10.0)
    if rec is None:
        rec = {}
        victim.restart()
        row["note"] = "victim stuck: restarted"
    peak = sampler.peak(t0)
    mem = {"start": start, "peak": peak, "after": m1["total"] if m1 else None,
           "t0": t0}  # replaced by the series once the server has settled
    if start is not None:
        mem["delta_peak"] = (peak - start) if peak is not None else None
        mem["delta_after"] = (mem["after"] - start) if mem["after"] is not None else None
    row.update(window_s=round(window, 2), attack_s=round(t1 - t0, 2), attack=attack,
               fate=attack.get("fate", ""), memory=mem, victim={
                   p: victim_stats(rec.get(p, []), tv) for p in ("grpc", "http")},
               victim_during_attack={p: victim_stats(rec.get(p, []), tv, t1)
                                     for p in ("grpc", "http")},
               victim_first_error=rec.get("first_error", {}))
    gone = pids_before - set(_tree(server))
    if not server.alive():
        row["fate"] += "; SERVER DIED"
        row["server_died"] = True
    elif gone:
        row["fate"] += f"; {len(gone)} server process(es) gone"
        row["pids_gone"] = sorted(gone)
    return row


def _tree(server: Server) -> list[int]:
    root = server.root
    return tree_pids(root) if root else []


def settle(server: Server, victim: VictimProc, sampler: Sampler, deadline_s: float,
           fast_ms: float = 100.0) -> float | None:
    """Seconds until both protocols answer within fast_ms three times in a row and
    the memory moves less than 2 MiB between those checks; None if not by the
    deadline."""
    t0 = time.monotonic()
    streak, prev = 0, None
    while time.monotonic() - t0 < deadline_s:
        if not server.alive():
            return None
        r = victim.ask("check 1", 10.0) or {}
        fast = bool(r) and all(v[1] == "ok" and v[0] < fast_ms for v in r.values())
        m = sampler.sample()
        now = m["total"] if m else 0
        still = prev is not None and abs(now - prev) < 2 * MIB
        prev = now
        streak = streak + 1 if fast and (still or m is None) else 0
        if streak >= 3:
            return round(time.monotonic() - t0, 2)
        time.sleep(0.2)
    return None


def run_server(server: Server, selected, args, rows: list[dict]) -> None:
    """Every selected case against one server, rows appended as they are measured
    (so an interruption keeps what was measured)."""
    server.start()
    caps = capabilities("127.0.0.1", server.http)
    warm = warm_up("127.0.0.1", server.http, server.grpc, args.model)
    if warm:
        print(f"# {server.name}: the 1 MiB warm-up failed: {warm}", flush=True)
    root = server.root
    print(f"# {server.name}: pid {root or '?'}, explicit model control "
          f"{'yes' if caps['explicit'] else 'NO'}, client shm "
          f"{'yes' if caps['client_shm'] else 'NO'}"
          + ("" if root else "; memory not sampled (no PID: pass pid:N)"), flush=True)
    sampler = Sampler(root, prefixes=server.shm_prefixes()).start()
    victim = VictimProc(server, args.model, args.interval, args.timeout)
    target = cases.Target("127.0.0.1", server.http, server.grpc, args.model,
                          caps["explicit"], caps["client_shm"], args.scale)
    try:
        victim.start()
        settle(server, victim, sampler, args.settle)  # warm: both clients connected
        for case in selected:
            print(f"# {server.name}: {case.name} ...", flush=True)
            row = run_case(case, server, victim, sampler, target, args, caps)
            rows.append(row)
            if row.get("skipped"):
                continue
            row["settle_s"] = settle(server, victim, sampler, args.settle)
            # memory over the attack, the wait after it and the settling
            row["memory"]["series_mib"] = sampler.series(row["memory"].pop("t0"))
            if row["settle_s"] is None and server.attached and server.alive():
                # cannot be restarted: give it longer, then go on (noted)
                later = settle(server, victim, sampler, max(60.0, 3 * args.settle))
                row["fate"] += (f"; settled only after {args.settle + later:.0f}s"
                                if later is not None else
                                "; did not settle: later rows may carry it")
            elif row["settle_s"] is None or row.get("server_died"):
                if server.attached:
                    row["fate"] += "; the rest skipped (an attached server is not "\
                                   "restarted)"
                    print(table([row], server.name).splitlines()[-1], flush=True)
                    break
                why = "died" if row.get("server_died") else \
                    f"not settled in {args.settle:g}s"
                row["fate"] += f"; restarted ({why})"
                row["restarted"] = True
                server.stop(timeout=5.0)
                try:
                    server.start()
                except RuntimeError as exc:
                    row["fate"] += f"; restart failed ({exc}): the rest skipped"
                    print(table([row], server.name).splitlines()[-1], flush=True)
                    break
                warm_up("127.0.0.1", server.http, server.grpc, args.model)
                sampler.root = server.root
                sampler.prefixes = server.shm_prefixes()
                settle(server, victim, sampler, max(args.settle, 30.0))
            print(table([row], server.name).splitlines()[-1], flush=True)
    finally:
        victim.close()
        sampler.close()
        server.stop()


def build_servers(args) -> list[Server]:
    os.makedirs(args.log_dir, exist_ok=True)
    if args.server:
        return [Server(n, cmd, int(h), int(g), args.log_dir, args.repo or EXAMPLES)
                for n, h, g, cmd in args.server]
    out = []
    if "shmserve" not in args.skip:
        out.append(Server("shmserve", args.shmserve or SHMSERVE_CMD, 0, 0, args.log_dir,
                          args.repo or EXAMPLES))
    if "triton" not in args.skip:
        out.append(Server("triton", args.triton or TRITON_CMD, 0, 0, args.log_dir,
                          args.triton_repo))
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attack_probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=None,
                   help="comma list (default: all): " + ", ".join(cases.BY_NAME))
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--duration", type=float, default=6.0, help="seconds per attack")
    p.add_argument("--after", type=float, default=3.0,
                   help="seconds after the attack before '+after' memory is read")
    p.add_argument("--settle", type=float, default=10.0,
                   help="at most this long for the server to settle between cases")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply the crowd attacks' connection counts (0.1: smoke)")
    p.add_argument("--interval", type=float, default=0.02, help="victim's pace (s)")
    p.add_argument("--timeout", type=float, default=5.0, help="victim's call timeout")
    p.add_argument("--model", default="identity_fp32")
    p.add_argument("--server", nargs=4, action="append",
                   metavar=("NAME", "HTTP", "GRPC", "CMD"),
                   help="a server (repeatable; replaces the defaults). CMD '-' attaches "
                        "(PID by the HTTP port), 'pid:N' attaches and samples N's tree; "
                        "else a command with {repo} {http} {grpc} {metrics} (ports 0: "
                        "free ones)")
    p.add_argument("--shmserve", default=None, help="command for the default shmserve")
    p.add_argument("--triton", default=None, help="command for the default Triton")
    p.add_argument("--repo", default=None, help=f"{{repo}} for shmserve ({EXAMPLES})")
    p.add_argument("--triton-repo", default=TRITON_REPO)
    p.add_argument("--skip", action="append", default=[], choices=["shmserve", "triton"])
    p.add_argument("--log-dir", default="/tmp/attack_probe_logs")
    p.add_argument("--json", default=None, metavar="PATH")
    return p


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.list:
        for c in cases.CASES:
            print(f"{c.name:22} {c.label}")
        return 0
    try:
        selected = cases.select(args.cases)
    except ValueError as exc:
        raise SystemExit(f"attack_probe: {exc}") from None
    servers = build_servers(args)
    if not servers:
        raise SystemExit("attack_probe: no servers")
    signal.signal(signal.SIGTERM, _interrupt)
    by_server: dict[str, list[dict]] = {}
    status = 0
    t0 = time.monotonic()
    try:
        for s in servers:
            by_server[s.name] = []
            try:
                run_server(s, selected, args, by_server[s.name])
            except RuntimeError as exc:  # did not start
                print(f"attack_probe: {exc}", file=sys.stderr, flush=True)
                status = 2
    except KeyboardInterrupt:
        print("attack_probe: interrupted", file=sys.stderr)
        status = 130
    finally:
        for s in servers:
            s.stop()
    print()
    for name, rows in by_server.items():
        print(table(rows, name))
        print()
    if len(by_server) > 1:
        print("### side by side (victim p99/max, errors of both, memory +peak / +after)")
        print()
        print(side_by_side(by_server))
    print(f"\n# {time.monotonic() - t0:.0f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": {"argv": sys.argv[1:] if argv is None else list(argv),
                                "duration": args.duration, "after": args.after,
                                "loadavg": os.getloadavg(), "cpus": os.cpu_count(),
                                "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
                       "servers": by_server}, f, indent=1)
            f.write("\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
