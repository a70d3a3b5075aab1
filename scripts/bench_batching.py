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

import json
import urllib.request
from pathlib import Path

import benchkit
from bench_mlp import run_bench

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
    "identity_fp32": benchkit.ANCHOR_IDENTITY_CONFIG,
}

def write_repo(repo: Path) -> None:
    for name, config in CONFIGS.items():
        code = benchkit.IDENTITY_PY if name == "identity_fp32" else MODEL_PY
        benchkit.write_model(repo, name, config, code)


def model_stats(http: int, model: str) -> tuple[int, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/{model}/stats",
                                timeout=10) as r:
        (m,) = json.loads(r.read())["model_stats"]
    return int(m["inference_count"]), int(m["execution_count"])


def measure(kind: str, repo: Path, model: str, args) -> dict:
    log = Path(args.log_dir) / f"{kind}-{model}.log"
    with benchkit.Server(kind, repo, args.ports, log) as server:
        before = model_stats(server.http, model)
        concurrency = args.identity_concurrency if model == "identity_fp32" else \
            args.concurrency
        row, seconds, cpu0, cpu1 = run_bench(
            ["--url", server.grpc_url, "--protocol", "grpc", "--model", model,
             "--shape", "1,16", "--concurrency", str(concurrency), "--no-verify"],
            args.warmup, args.duration, server.bench_sampler())
        after = model_stats(server.http, model)
    items, executions = after[0] - before[0], after[1] - before[1]
    return {"server": kind, "model": model, "concurrency": concurrency,
            "infer_per_s": round(row["throughput"], 1), "p50_ms": round(row["p50_ms"], 2),
            "p99_ms": round(row.get("p99_ms", 0.0), 2),
            "avg_batch": round(items / executions, 2) if executions else 0.0,
            **benchkit.cpu_columns(cpu0, cpu1, row["throughput"] * seconds)}


def main() -> None:
    p = benchkit.parser(__doc__)
    benchkit.add_common_args(p, [28400, 28401, 28402], duration=8.0, warmup=2.0,
                             concurrency=32,
                             servers="triton,shmserve,shmserve-nometrics")
    p.add_argument("--identity-concurrency", type=int, default=16)
    p.add_argument("--models", default="fixed_cost,fixed_cost_nobatch,identity_fp32")
    args = benchkit.parse(p, "bench-batching-")
    servers = benchkit.servers(args)
    rows = []
    with benchkit.repository("batching-repo-", write_repo) as repo:
        for r, order in benchkit.alternating(args.rounds, servers):
            for model in args.models.split(","):
                for kind in order:
                    benchkit.record(rows, {**measure(kind, repo, model, args), "round": r})
    benchkit.finish(args, rows)


if __name__ == "__main__":
    main()
