#!/usr/bin/env python3
"""BLS, measured: what a python model pays to call another model, in shmserve and in
the real Triton (python backend), in one run, alternating servers every round.

The models (written into a fresh repository both servers load):
- identity: a python identity model (max_batch_size 8, one instance);
- bls_identity: a python model whose execute() sends its input to `identity` with
  `pb_utils.InferenceRequest(...).exec()` and answers with that model's output.

Each point is scripts/bench over gRPC at [1,16] FP32 and [1,262144] FP32 (1 MiB). The
BLS overhead is the ratio of bls_identity's throughput to identity's on the same
server; beside it, the CPU time of every server process by role per request (read
from /proc) and the client's.

    scripts/bench_py.py --rounds 2 --duration 6
    scripts/bench_py.py --skip triton          # without the anchor
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_batching import TRITON, roles, server_command  # noqa: E402
from bench_mlp import cpu_by_role, process_tree, run_bench, wait_ready  # noqa: E402

CONFIG = """name: "{name}"
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

BLS_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            call = pb_utils.InferenceRequest(
                model_name="identity", requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.get_input_tensor_by_name(r, "INPUT0")])
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            out = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUTPUT0", out.as_numpy())]))
        return responses
'''


def write_repo(repo: Path) -> None:
    for name, code in (("identity", IDENTITY_PY), ("bls_identity", BLS_PY)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name))
        (repo / name / "1" / "model.py").write_text(code)


def measure(kind: str, repo: Path, points, args) -> list[dict]:
    """One server start, every (model, shape) point against it."""
    ports = args.ports
    log = open(Path(args.log_dir) / f"{kind}.log", "ab")
    # not from the repository root for Triton: its python stub would import our
    # triton_python_backend_utils.py from there instead of its own
    cwd = ROOT if kind.startswith("shmserve") else repo
    proc = subprocess.Popen(server_command(kind, repo, ports), cwd=cwd, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    rows = []
    try:
        wait_ready(ports[0], proc, 180)
        for model, shape in points:
            pids: list[int] = []
            client_pids: list[int] = []

            def sample(client):
                if not pids:
                    pids.extend(process_tree(proc.pid))
                    client_pids.extend(process_tree(client.pid))
                server = roles(pids)
                server["client"] = sum(cpu_by_role(client_pids).values())
                return server

            row, seconds, cpu0, cpu1 = run_bench(
                ["--url", f"127.0.0.1:{ports[1]}", "--protocol", "grpc", "--model", model,
                 "--shape", shape, "--concurrency", str(args.concurrency), "--no-verify"],
                args.warmup, args.duration, sample)
            requests = row["throughput"] * seconds
            cpu_us = {role: round(1e6 * (cpu1[role] - cpu0.get(role, 0.0)) / requests, 1)
                      for role in cpu1} if requests else {}
            rows.append({
                "server": kind, "model": model, "shape": shape,
                "concurrency": args.concurrency,
                "infer_per_s": round(row["throughput"], 1),
                "p50_ms": round(row["p50_ms"], 2),
                "cpu_us_per_request": cpu_us,
                "server_cpu_us_per_request": round(sum(v for k, v in cpu_us.items()
                                                       if k != "client"), 1)})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    return rows


def summary(rows: list[dict]) -> None:
    """bls_identity / identity per server and shape, averaged over rounds."""
    def mean(server, model, shape, key):
        vals = [r[key] for r in rows
                if (r["server"], r["model"], r["shape"]) == (server, model, shape)]
        return sum(vals) / len(vals) if vals else 0.0

    for server in dict.fromkeys(r["server"] for r in rows):
        for shape in dict.fromkeys(r["shape"] for r in rows):
            direct = mean(server, "identity", shape, "infer_per_s")
            bls = mean(server, "bls_identity", shape, "infer_per_s")
            cpu_d = mean(server, "identity", shape, "server_cpu_us_per_request")
            cpu_b = mean(server, "bls_identity", shape, "server_cpu_us_per_request")
            print(f"{server:9s} [{shape}]: direct {direct:8.1f}/s, BLS {bls:8.1f}/s "
                  f"(x{bls / direct if direct else 0:.2f}); server CPU/request "
                  f"{cpu_d:.0f} us direct, {cpu_b:.0f} us BLS (+{cpu_b - cpu_d:.0f} us)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--shapes", default="1,16;1,262144")
    p.add_argument("--servers", default="triton,shmserve")
    p.add_argument("--skip", action="append", default=[])
    p.add_argument("--ports", type=lambda t: [int(x) for x in t.split(",")],
                   default=[28500, 28501, 28502])
    p.add_argument("--log-dir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    servers = [s for s in args.servers.split(",") if s not in args.skip]
    if "triton" in servers and not os.path.exists(TRITON):
        sys.exit(f"{TRITON} not found: run ../shared/anchor/setup.sh, or --skip triton")
    args.log_dir = args.log_dir or tempfile.mkdtemp(prefix="bench-py-")
    points = [(model, shape) for shape in args.shapes.split(";")
              for model in ("identity", "bls_identity")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bls-repo-") as tmp:
        repo = Path(tmp)
        write_repo(repo)
        for r in range(args.rounds):
            # alternate the order every round so the machine's drift spreads over all
            for kind in (servers if r % 2 == 0 else servers[::-1]):
                for row in measure(kind, repo, points, args):
                    row["round"] = r + 1
                    rows.append(row)
    summary(rows)
    print(f"logs in {args.log_dir}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
