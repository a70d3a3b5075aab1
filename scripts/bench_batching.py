#!/usr/bin/env python3
"""Dynamic batching, measured: shmserve against the real Triton on the same models, and
shmserve with its metrics on and off, in one run, alternating servers every round.

The models (written into a fresh repository both servers load):
- fixed_cost: a python model whose execute() costs 2 ms + 20 us per batch item (a
  sleep, standing for time on an accelerator), max_batch_size 32, dynamic batching;
- fixed_cost_nobatch: the same model without dynamic_batching, so every request runs
  alone;
- identity_fp32: Triton's anchor identity (max_batch_size 64, 100 us delay, two
  instances), for the scheduler's CPU per request on the served path.

Each point is scripts/bench over gRPC ([1,16] FP32) at the given concurrency. Beside
throughput and latency it prints the CPU time of every server process by role (and
the client's) per request over the measured window, and the average batch size from
the server's own statistics extension.

    scripts/bench_batching.py --rounds 2 --duration 8
    scripts/bench_batching.py --skip triton          # without the anchor
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_mlp import cpu_by_role, process_tree, run_bench, wait_ready  # noqa: E402

TRITON = "/tmp/anchors/bin/run_triton_anchor"  # ../shared/anchor/setup.sh makes it

MODEL_PY = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """2 ms per execute() call and 20 us per batch item, then the input back."""

    def execute(self, requests):
        items = sum(pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy().shape[0]
                    for r in requests)
        time.sleep(0.002 + 20e-6 * items)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
'''

CONFIGS = {
    "fixed_cost": """name: "fixed_cost"
backend: "python"
max_batch_size: 32
dynamic_batching { }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
""",
    "fixed_cost_nobatch": """name: "fixed_cost_nobatch"
backend: "python"
max_batch_size: 32
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
""",
    "identity_fp32": """name: "identity_fp32"
backend: "python"
max_batch_size: 64
dynamic_batching { max_queue_delay_microseconds: 100 }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
""",
}

IDENTITY_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
'''


def write_repo(repo: Path) -> None:
    for name, config in CONFIGS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        code = IDENTITY_PY if name == "identity_fp32" else MODEL_PY
        (repo / name / "1" / "model.py").write_text(code)


def server_command(kind: str, repo: Path, ports) -> list[str]:
    http, grpc, metrics = ports
    if kind == "triton":
        return [TRITON, str(repo), str(http), str(grpc), str(metrics),
                "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
                "--metrics-address", "127.0.0.1"]
    cmd = [sys.executable, "-m", "scheduler.main", "--model-repository", str(repo),
           "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port",
           str(metrics), "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
           "--metrics-address", "127.0.0.1"]
    if kind == "shmserve-nometrics":
        cmd += ["--allow-metrics", "false"]
    return cmd


def roles(pids: list[int]) -> dict[str, float]:
    """CPU seconds by role; Triton's processes are named by their executable."""
    out: dict[str, float] = {}
    for pid in pids:
        for role, seconds in cpu_by_role([pid]).items():
            if role == "client":
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        exe = os.path.basename(f.read().split(b"\0")[0].decode())
                except OSError:
                    continue
                if "tritonserver" in exe:
                    role = "tritonserver"
                elif "stub" in exe:
                    role = "python_stub"
                elif exe in ("bash", "sh"):
                    continue  # the anchor's launcher
            out[role] = out.get(role, 0.0) + seconds
    return out


def model_stats(http: int, model: str) -> tuple[int, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/{model}/stats",
                                timeout=10) as r:
        (m,) = json.loads(r.read())["model_stats"]
    return int(m["inference_count"]), int(m["execution_count"])


def measure(kind: str, repo: Path, model: str, args) -> dict:
    ports = args.ports
    log = open(Path(args.log_dir) / f"{kind}-{model}.log", "ab")
    # not from the repository root for Triton: its python stub would import our
    # triton_python_backend_utils.py from there instead of its own
    cwd = ROOT if kind.startswith("shmserve") else repo
    proc = subprocess.Popen(server_command(kind, repo, ports), cwd=cwd, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(ports[0], proc, 180)
        pids: list[int] = []
        client_pids: list[int] = []

        def sample(client):
            if not pids:
                pids.extend(process_tree(proc.pid))
                client_pids.extend(process_tree(client.pid))
            server = roles(pids)
            server["client"] = sum(cpu_by_role(client_pids).values())
            return server

        before = model_stats(ports[0], model)
        concurrency = args.identity_concurrency if model == "identity_fp32" else \
            args.concurrency
        row, seconds, cpu0, cpu1 = run_bench(
            ["--url", f"127.0.0.1:{ports[1]}", "--protocol", "grpc", "--model", model,
             "--shape", "1,16", "--concurrency", str(concurrency), "--no-verify"],
            args.warmup, args.duration, sample)
        after = model_stats(ports[0], model)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    requests = row["throughput"] * seconds
    cpu_us = {role: round(1e6 * (cpu1[role] - cpu0.get(role, 0.0)) / requests, 1)
              for role in cpu1} if requests else {}
    items, executions = after[0] - before[0], after[1] - before[1]
    return {"server": kind, "model": model, "concurrency": concurrency,
            "infer_per_s": round(row["throughput"], 1), "p50_ms": round(row["p50_ms"], 2),
            "p99_ms": round(row.get("p99_ms", 0.0), 2),
            "avg_batch": round(items / executions, 2) if executions else 0.0,
            "cpu_us_per_request": cpu_us,
            "server_cpu_us_per_request": round(sum(v for k, v in cpu_us.items()
                                                   if k != "client"), 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--identity-concurrency", type=int, default=16)
    p.add_argument("--models", default="fixed_cost,fixed_cost_nobatch,identity_fp32")
    p.add_argument("--servers", default="triton,shmserve,shmserve-nometrics")
    p.add_argument("--skip", action="append", default=[])
    p.add_argument("--ports", type=lambda t: [int(x) for x in t.split(",")],
                   default=[28400, 28401, 28402])
    p.add_argument("--log-dir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    servers = [s for s in args.servers.split(",") if s not in args.skip]
    if "triton" in servers and not os.path.exists(TRITON):
        sys.exit(f"{TRITON} not found: run ../shared/anchor/setup.sh, or --skip triton")
    args.log_dir = args.log_dir or tempfile.mkdtemp(prefix="bench-batching-")
    rows = []
    with tempfile.TemporaryDirectory(prefix="batching-repo-") as tmp:
        repo = Path(tmp)
        write_repo(repo)
        for r in range(args.rounds):
            # alternate the order every round so the machine's drift spreads over all
            order = servers if r % 2 == 0 else servers[::-1]
            for model in args.models.split(","):
                for kind in order:
                    row = measure(kind, repo, model, args)
                    row["round"] = r + 1
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    print(f"logs in {args.log_dir}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
