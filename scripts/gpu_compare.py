#!/usr/bin/env python3
"""shmserve beside the real Triton on the GPU machine, in one run (issue 23, part 1).

Builds its model repositories (scripts/gpu_models.py), starts both servers side by
side, and measures, A B A B over rounds:
  1. check: the python torch identity answers right through CUDA regions (verified);
  2. the table: `identity_torch_gpu` (torch through DLPack on KIND_GPU, inputs and
     outputs in the clients' CUDA regions) at 16 and 64 MiB, c=1 and c=4, over gRPC;
  3. the C clients: wrk (HTTP) and h2load (gRPC) against `identity_fp32` [1,16];
  4. p50 at c=1 for [1,16] over HTTP and gRPC (tritonclient, as scripts/compare);
  5. shmserve alone (Triton travels with its python backend only): a TorchScript
     identity and MLP, and an ONNX MLP when onnxruntime has its CUDA provider, through
     CUDA regions at c=1 and c=4, then its copy counters from its exit summary.
Every row carries the server's CPU per request by role (scripts/compare's probe;
bench_cclient's for the C clients). results.json is rewritten after every row, so a
run cut off at its limit leaves what it measured; --deadline stops measuring early
enough to stop the servers and write everything (results.json, summary tables and
log.txt in --out; gpu.png where matplotlib is there, else `plot` draws it later).

    source .device/on_device.sh && python3 scripts/gpu_compare.py --out $OUT --deadline 330
    scripts/gpu_compare --device cpu --quick --out /tmp/gpu-dry  # dry run, no GPU:
        KIND_CPU models, system shm in place of CUDA regions, the local anchor Triton
    scripts/gpu_compare plot results.json gpu.png              # the PNG from a run's JSON
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

import bench  # noqa: E402  (scheduler/bench/main.py)
import bench_cclient  # noqa: E402
import benchkit  # noqa: E402
import compare  # noqa: E402
import gpu_models as models  # noqa: E402
import gpu_report as report  # noqa: E402
import gpu_setup as setup  # noqa: E402
from scheduler.bench.procs import group_roles  # noqa: E402

@dataclass
class Phase:
    """One block of measurements: one model, the servers that serve it, its points."""

    name: str
    title: str
    model: str
    servers: list[str]
    points: list = field(default_factory=list)  # compare.Point; the C clients: none
    rounds: int = 1
    verify: bool = False
    check: bool = False  # a correctness check, not a figure (left out of the PNG)
    tool: str = "bench"  # or "cclient" (wrk and h2load)
    input_name: str = "INPUT0"
    output_name: str = "OUTPUT0"
    duration: float = 4.0
    warmup: float = 1.0

    def cost(self, setup: float) -> float:
        """Seconds one measurement takes: its window, its warm-up and its setup (`setup`
        where the clients make and register regions; a second for connections alone,
        and for a C tool, which starts in well under one)."""
        regions = any(p.shm != "none" for p in self.points)
        return self.warmup + self.duration + (setup if regions else 1.0)

    def measurements(self) -> int:
        per_round = 2 if self.tool == "cclient" else len(self.points)  # two protocols
        return self.rounds * per_round * len(self.servers)


class Deadline(Exception):
    """No time left for the next measurement before the servers must stop."""


class Clock:
    """The run's budget: `fits(s)` while s seconds and the reserve for the end (stop
    the servers, write everything) are left."""

    def __init__(self, budget: float, reserve: float, now=time.monotonic):
        self.now, self.reserve = now, reserve
        self.end = now() + budget

    def left(self) -> float:
        return self.end - self.now()

    def fits(self, seconds: float) -> bool:
        return self.left() - self.reserve >= seconds


def elements(mib: float) -> int:
    """FP32 elements in `mib` MiB."""
    return int(mib * (1 << 20)) // 4


def plan(args, shm: str, servers: list[str], skipped: dict) -> list[Phase]:
    """Every phase, in the order they run (what matters most first, since a deadline
    cuts from the end). `servers`: the ones started; `skipped`: models not built."""
    both = [s for s in ("shmserve", "triton") if s in servers]
    mine = [s for s in ("shmserve",) if s in servers]
    sizes = [elements(m) for m in args.sizes_mib]
    P = compare.Point
    common = dict(duration=args.duration, warmup=args.warmup, rounds=args.rounds)
    check = dict(duration=args.check_duration, warmup=0.3, rounds=1, verify=True,
                 check=True)
    out = [
        Phase("check_torch", "check: python torch identity, verified", models.TORCH_IDENTITY,
              both, [P("grpc", (sizes[0],), shm, 1)], **check),
        Phase("table", f"python torch identity, {shm} regions, gRPC",
              models.TORCH_IDENTITY, both,
              [P("grpc", (n,), shm, c) for n in sizes for c in args.concurrency], **common),
        Phase("cclient", "C clients, identity_fp32 [1,16]", models.CPU_IDENTITY, both,
              tool="cclient", rounds=args.rounds, duration=args.cclient_duration,
              warmup=args.cclient_warmup),
        Phase("p50", "identity_fp32 [1,16], c=1 (tritonclient)", models.CPU_IDENTITY, both,
              [P(proto, (1, 16), "none", 1) for proto in ("http", "grpc")], verify=True,
              duration=args.p50_duration, warmup=min(args.warmup, 0.5),
              rounds=args.rounds),
    ]
    ts = dict(input_name="INPUT__0", output_name="OUTPUT__0")
    if models.TS_IDENTITY not in skipped:
        out += [
            Phase("check_ts", "check: TorchScript identity, verified", models.TS_IDENTITY,
                  mine, [P("grpc", (1, sizes[0]), shm, 1)], **check, **ts),
            Phase("ts_identity", f"TorchScript identity, {shm} regions (shmserve)",
                  models.TS_IDENTITY, mine,
                  [P("grpc", (1, sizes[0]), shm, c) for c in args.concurrency],
                  duration=args.duration, warmup=args.warmup, **ts),
            Phase("ts_mlp", f"TorchScript MLP 512-2048-512, {shm} regions (shmserve)",
                  models.TS_MLP, mine,
                  [P("grpc", (1, models.MLP_WIDTH), shm, c) for c in args.concurrency],
                  duration=args.duration, warmup=args.warmup, **ts)]
    if models.ONNX_MLP not in skipped:
        out.append(Phase("onnx_mlp", f"ONNX MLP 512-2048-512, {shm} regions (shmserve)",
                         models.ONNX_MLP, mine,
                         [P("grpc", (1, models.MLP_WIDTH), shm, c)
                          for c in args.concurrency],
                         duration=args.duration, warmup=args.warmup))
    chosen = set(args.phases or [p.name for p in out])
    return [p for p in out if p.name in chosen]


# --------------------------------------------------------------------- phases


def run_bench_phase(ph: Phase, servers: dict, pool, res: report.Results, clock: Clock,
                    args) -> None:
    entry = res.data["phases"][ph.name]
    cost = ph.cost(args.setup_s)
    for rnd, order in benchkit.alternating(ph.rounds, ph.servers):
        for pt in ph.points:
            for name in order:
                if not clock.fits(cost):
                    raise Deadline
                row = compare.measure_row(
                    pool, servers[name], pt, rnd, model=ph.model, duration=ph.duration,
                    warmup=ph.warmup, verify=ph.verify,
                    client_processes=args.client_processes, cuda_device=args.cuda_device,
                    input_name=ph.input_name, output_name=ph.output_name)
                row["phase"] = ph.name
                entry["summary"] = report.bench_summary(entry["rows"] + [row], ph.servers,
                                                        ph.points, ph.model)
                res.add_row(ph.name, row)


def run_cclient_phase(ph: Phase, servers: dict, res: report.Results, clock: Clock,
                      args, tmp: Path) -> None:
    entry = res.data["phases"][ph.name]
    files = bench_cclient.write_inputs(tmp, 16)
    tool_args = argparse.Namespace(
        warmup=ph.warmup, duration=ph.duration, connections=args.connections,
        wrk_threads=args.tool_threads, h2_connections=args.h2_connections,
        h2_streams=args.h2_streams, h2_threads=args.tool_threads, verbose=False)
    protocols = [p for p, tool in (("http", "wrk"), ("grpc", "h2load")) if shutil.which(tool)]
    cost = ph.cost(args.setup_s)
    checked: set[tuple[str, str]] = set()
    for rnd, order in benchkit.alternating(ph.rounds, ph.servers):
        for name in order:
            srv = setup.CServer(servers[name])
            for protocol in protocols:
                if not clock.fits(cost):
                    raise Deadline
                try:
                    if (name, protocol) not in checked:  # h2load counts gRPC errors as done
                        if protocol == "http":
                            bench_cclient.check_http(srv.ports[0], files["body"],
                                                     files["header_len"], 16)
                        else:
                            bench_cclient.check_grpc(srv.ports[1], files["message"], 16)
                        checked.add((name, protocol))
                    row = bench_cclient.measure(srv, protocol, tool_args, files)
                    row["cpu_us_per_request"] = group_roles(row["cpu_us_per_request"],
                                                            ph.model)
                except (SystemExit, Exception) as exc:  # a failed tool or check: a row
                    row = {"server": name, "protocol": protocol, "requests": 0,
                           "infer_per_s": 0.0, "error": str(exc)[:1000]}
                row.update(round=rnd, phase=ph.name)
                print(json.dumps(row), flush=True)
                entry["summary"] = report.cclient_summary(entry["rows"] + [row])
                res.add_row(ph.name, row)


def print_phase(ph: Phase, entry: dict) -> None:
    print(f"\n## {ph.title} [{entry['status']}]")
    if not entry.get("summary"):
        return
    if ph.tool == "cclient":
        print(report.format_cclient(entry["summary"]))
    else:
        names = [n for n in ("triton", "shmserve") if n in ph.servers]
        print(compare.format_summary(entry["summary"], names))


# --------------------------------------------------------------------- the run


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu_compare", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="`gpu_compare plot RESULTS.json OUT.png` draws the "
                                       "PNG of an earlier run.")
    p.add_argument("--out", required=True, type=Path,
                   help="folder for results.json, log.txt, gpu.png and the servers' logs")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                   help="cpu: a dry run without a GPU (KIND_CPU models, system shm)")
    p.add_argument("--deadline", type=float, default=330.0, metavar="SECONDS",
                   help="stop measuring in time to stop the servers and write everything "
                        "within this many seconds of the start")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: one round, short windows")
    p.add_argument("--rounds", type=int, default=None, help="default 2 (quick: 1)")
    p.add_argument("--duration", type=float, default=None,
                   help="seconds per window (default 4; quick: 1.5)")
    p.add_argument("--warmup", type=float, default=None, help="default 1 (quick: 0.5)")
    p.add_argument("--p50-duration", type=float, default=None,
                   help="windows of the [1,16] c=1 points (default 2.5; quick: 1.5)")
    p.add_argument("--cclient-duration", type=float, default=None,
                   help="seconds of each wrk/h2load run (default 5; quick: 2)")
    p.add_argument("--cclient-warmup", type=float, default=1.0)
    p.add_argument("--check-duration", type=float, default=1.0)
    p.add_argument("--sizes-mib", type=lambda t: [float(x) for x in t.split(",")],
                   default=None, help="tensor sizes of the table (default 16,64 on the "
                                      "GPU; 1,4 with --device cpu)")
    p.add_argument("--concurrency", type=bench.parse_int_list, default=[1, 4])
    p.add_argument("--client-processes", type=int, default=None,
                   help="tritonclient processes (default 4; 2 with --device cpu)")
    p.add_argument("--cuda-device", type=int, default=0)
    p.add_argument("--connections", type=int, default=64, help="wrk's connections")
    p.add_argument("--h2-connections", type=int, default=16)
    p.add_argument("--h2-streams", type=int, default=4)
    p.add_argument("--tool-threads", type=int, default=None,
                   help="wrk's and h2load's threads (default 4; 1 with --device cpu)")
    p.add_argument("--triton-cmd", default=None,
                   help="Triton's launcher taking REPO HTTP GRPC METRICS (default "
                        "$TRITON_CMD; with --device cpu, the local anchor's)")
    p.add_argument("--triton-args", default="", help="more flags for tritonserver")
    p.add_argument("--shmserve-args", default="", help="more flags for shmserve")
    p.add_argument("--skip", action="append", default=[], choices=["triton", "shmserve"])
    p.add_argument("--phases", type=lambda t: t.split(","), default=None,
                   help="only these phases (check_torch,table,cclient,p50,check_ts,"
                        "ts_identity,ts_mlp,onnx_mlp)")
    p.add_argument("--ready-timeout", type=float, default=150.0,
                   help="seconds a server may take to start (its models' loads)")
    return p


def settle(args) -> argparse.Namespace:
    """Defaults that depend on --device and --quick."""
    gpu, quick = args.device == "gpu", args.quick
    for name, full, short in (("rounds", 2, 1), ("duration", 4.0, 1.5),
                              ("warmup", 1.0, 0.5), ("p50_duration", 2.5, 1.5),
                              ("cclient_duration", 5.0, 2.0)):
        if getattr(args, name) is None:
            setattr(args, name, short if quick else full)
    if args.sizes_mib is None:
        args.sizes_mib = [16.0, 64.0] if gpu else [1.0, 4.0]
    if args.client_processes is None:
        args.client_processes = 4 if gpu else 2
    if args.tool_threads is None:
        args.tool_threads = 4 if gpu else 1
    if args.triton_cmd is None:
        args.triton_cmd = os.environ.get("TRITON_CMD") or (
            None if gpu else compare.TRITON_LAUNCHER)
    args.triton_cmd_missing = None
    if args.triton_cmd and not os.path.exists(shlex.split(args.triton_cmd)[0]):
        args.triton_cmd_missing, args.triton_cmd = args.triton_cmd, None
    # seconds a measurement spends outside its window (the clients' regions and
    # connections), and kept at the end to stop the servers and write everything
    args.setup_s = 2.0 if gpu else 1.5
    args.reserve_s = 30.0
    return args


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["plot"]:
        return plot_main(argv[1:])
    args = settle(build_parser().parse_args(argv))
    t0 = time.monotonic()
    clock = Clock(args.deadline, args.reserve_s)
    out = args.out
    (out / "logs").mkdir(parents=True, exist_ok=True)
    setup.tee_output(out / "log.txt")
    signal.signal(signal.SIGTERM, _interrupt)
    # shmserve runs as `python -m scheduler.main` from this checkout
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    shm = "cuda" if args.device == "gpu" else "system"
    res = report.Results(out / "results.json", {
        "argv": argv, "device": args.device, "shm": shm,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "deadline_s": args.deadline,
        "machine": setup.machine_facts(),
        "tools": {t: shutil.which(t) for t in ("wrk", "h2load")},
        "settings": {k: v for k, v in vars(args).items() if k != "out"}})
    print(f"# gpu_compare --device {args.device}: out {out}, deadline {args.deadline:.0f}s",
          flush=True)
    if args.device == "gpu" and not gpu_usable(args, res):
        return 2
    if not args.triton_cmd:
        why = (f"{args.triton_cmd_missing} not found" if args.triton_cmd_missing
               else "no $TRITON_CMD (source .device/on_device.sh first)")
        print(f"gpu_compare: Triton left out: {why}", file=sys.stderr, flush=True)
        res.data["servers"]["triton"] = {"started": False, "why": why}
    servers: list[compare.Server] = []
    phases: list[Phase] = []
    status = "failed"
    with tempfile.TemporaryDirectory(prefix="gpu-compare-") as tmp:
        try:
            onnx = models.onnx_cuda() if args.device == "gpu" else True
            repos = models.build(Path(tmp) / "repos", args.device, onnx)
            res.data["models_skipped"] = repos.skipped
            for name, why in repos.skipped.items():
                print(f"# {name} left out: {why}", flush=True)
                res.phase(name.replace("_gpu", ""), model=name, status=f"skipped: {why}")
            # ready: up and serving what loaded (a model that failed is reported with
            # its reason, not waited for); never past what the deadline leaves
            ready = max(10.0, min(args.ready_timeout, clock.left() - args.reserve_s))
            servers, up = setup.start_servers(
                setup.server_specs(args, repos, setup.free_ports(6)), str(out / "logs"),
                ready, res, t0)
            phases = plan(args, shm, list(up), repos.skipped)
            status = run_phases(phases, up, res, clock, args, Path(tmp))
        except KeyboardInterrupt:
            status = "interrupted"
            print("gpu_compare: interrupted; stopping the servers", file=sys.stderr)
        except Exception as exc:  # noqa: BLE001  what was measured is still written
            status = f"failed: {type(exc).__name__}: {exc}"
            traceback.print_exc()
        finally:
            setup.stop_all(servers)
            shmserve = next((s for s in servers if s.spec.name == "shmserve"), None)
            if shmserve is not None and os.path.exists(shmserve.log_path):
                res.data["copies"] = report.copies_from_log(
                    Path(shmserve.log_path).read_text(errors="replace"))
            res.data["elapsed_s"] = round(time.monotonic() - t0, 1)
            res.set("status", status)
    return finish(res, phases, out, status, t0)


def gpu_usable(args, res: report.Results) -> bool:
    """The GPU check: its facts into the JSON; False, said clearly, when it fails."""
    info, problems = setup.check_gpu(args.cuda_device)
    res.data["meta"].update(info)
    if problems:
        for p in problems:
            print(f"gpu_compare: NO GPU RUN: {p}", file=sys.stderr, flush=True)
        res.data["problems"] = problems
        res.set("status", "failed: the GPU is not usable here")
        return False
    print(f"# GPU {info.get('gpu')}, torch {info.get('torch')}, cupy {info.get('cupy')}, "
          f"CUDA regions through {info.get('cuda_regions')}", flush=True)
    return True


def finish(res: report.Results, phases: list[Phase], out: Path, status: str,
           t0: float) -> int:
    """The tables, the copy counters, the PNG, the rows that failed; the exit status:
    0 all done and clean, 3 cut by the deadline, 1 otherwise."""
    for ph in phases:
        print_phase(ph, res.data["phases"].get(ph.name, {"status": "not run"}))
    if res.data["copies"]:
        print("\n## shmserve's copies by model (bytes; from its exit summary)")
        for m, c in sorted(res.data["copies"].items()):
            print(f"  {m}: host {c['host']} h2d {c['h2d']} d2h {c['d2h']} d2d {c['d2d']}; "
                  f"{c['rows']} rows in {c['batches']} batches")
    draw(res, out / "gpu.png")
    bad = [r for ph in res.data["phases"].values() for r in ph["rows"]
           if r.get("errors") or r.get("mismatches") or r.get("error")
           or not r.get("requests")]
    for r in bad:
        print(f"gpu_compare: FAILED {r.get('phase')} {r.get('server')} "
              f"{r.get('point', r.get('protocol'))}: {r.get('first_error') or r.get('error')}"
              f" (mismatches {r.get('mismatches', 0)})", file=sys.stderr)
    failed = {n: p["status"] for n, p in res.data["phases"].items()
              if str(p.get("status")).startswith("failed")}
    for name, why in failed.items():
        print(f"gpu_compare: phase {name} {why}", file=sys.stderr)
    bad += list(failed)
    print(f"# {status} in {time.monotonic() - t0:.0f}s; results in {out}/results.json",
          flush=True)
    return 0 if status == "done" and not bad else (3 if status == "deadline" else 1)


def run_phases(phases: list[Phase], up: dict, res: report.Results, clock: Clock, args,
               tmp: Path) -> str:
    """Each phase in turn on the servers that serve its model; 'deadline' when time ran
    out (that phase partial, the rest skipped), else 'done'."""
    needed = sum(p.measurements() * p.cost(args.setup_s) for p in phases)
    print(f"# {len(phases)} phases, about {needed:.0f}s of measuring; "
          f"{clock.left() - args.reserve_s:.0f}s left for it", flush=True)
    with bench.ClientPool(args.client_processes) as pool:
        for k, ph in enumerate(phases):
            missing = {n: state_of(res, n, ph.model) for n in ph.servers
                       if state_of(res, n, ph.model) != "READY"}
            ph.servers = [n for n in ph.servers if n not in missing]
            entry = res.phase(ph.name, title=ph.title, model=ph.model, check=ph.check,
                              servers=ph.servers, tool=ph.tool,
                              left_out={n: f"model {ph.model}: {why}"
                                        for n, why in missing.items()})
            if not ph.servers:
                res.phase(ph.name, status="skipped: no server serves " + ph.model)
                continue
            if ph.tool == "cclient" and not (shutil.which("wrk") or shutil.which("h2load")):
                res.phase(ph.name, status="skipped: neither wrk nor h2load is installed")
                continue
            print(f"\n# phase {ph.name}: {ph.title} on {', '.join(ph.servers)}" + "".join(
                f"; {n} left out: {why}" for n, why in entry["left_out"].items()), flush=True)
            res.phase(ph.name, status="running")
            try:
                if ph.tool == "cclient":
                    run_cclient_phase(ph, up, res, clock, args, tmp)
                else:
                    run_bench_phase(ph, up, pool, res, clock, args)
            except Deadline:
                print(f"gpu_compare: deadline: {ph.name} cut short, "
                      f"{len(phases) - k - 1} phases left out", file=sys.stderr, flush=True)
                res.phase(ph.name, status="partial: deadline" if entry["rows"]
                          else "skipped: deadline")
                for rest in phases[k + 1:]:
                    res.phase(rest.name, title=rest.title, model=rest.model,
                              status="skipped: deadline")
                return "deadline"
            except Exception as exc:  # noqa: BLE001  one phase's failure, not the run's
                traceback.print_exc()
                res.phase(ph.name, status=f"failed: {type(exc).__name__}: {exc}")
                continue
            res.phase(ph.name, status="done")
    return "done"


def state_of(res: report.Results, server: str, model: str) -> str:
    st = res.data["servers"].get(server, {}).get("models", {}).get(model)
    if st is None:
        return "not in its repository"
    return st["state"] if st["state"] == "READY" else f"{st['state']} {st['reason']}"


def draw(res: report.Results, path: Path) -> None:
    try:
        report.plot(res.data, path)
        res.set("png", path.name)
        print(f"# wrote {path}")
    except ImportError:
        note = ("not drawn: no matplotlib here; draw it where there is: "
                "scripts/gpu_compare plot results.json gpu.png")
        res.set("png", note)
        print(f"# PNG {note}")
    except ValueError as exc:
        res.set("png", f"not drawn: {exc}")


def plot_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gpu_compare plot",
                                description="the PNG of an earlier run, from its JSON")
    p.add_argument("results", type=Path)
    p.add_argument("png", type=Path)
    a = p.parse_args(argv)
    report.plot(json.loads(a.results.read_text()), a.png)
    print(f"wrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
