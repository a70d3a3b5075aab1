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

from pathlib import Path

import benchkit
from bench_mlp import run_bench

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
    # bls_identity takes and gives what identity does: the same config
    for name, code in (("identity", benchkit.IDENTITY_PY), ("bls_identity", BLS_PY)):
        benchkit.write_model(repo, name, benchkit.IDENTITY_CONFIG.format(name=name), code)


def measure(kind: str, repo: Path, points, args) -> list[dict]:
    """One server start, every (model, shape) point against it."""
    rows: list[dict] = []
    with benchkit.Server(kind, repo, args.ports, Path(args.log_dir) / f"{kind}.log") \
            as server:
        for model, shape in points:
            row, seconds, cpu0, cpu1 = run_bench(
                ["--url", server.grpc_url, "--protocol", "grpc", "--model", model,
                 "--shape", shape, "--concurrency", str(args.concurrency), "--no-verify"],
                args.warmup, args.duration, server.bench_sampler())
            benchkit.record(rows, {
                "server": kind, "model": model, "shape": shape,
                "concurrency": args.concurrency,
                "infer_per_s": round(row["throughput"], 1),
                "p50_ms": round(row["p50_ms"], 2),
                **benchkit.cpu_columns(cpu0, cpu1, row["throughput"] * seconds)})
    return rows


def summary(rows: list[dict]) -> None:
    """bls_identity / identity per server and shape, averaged over rounds."""
    rate = benchkit.means(rows, "infer_per_s", "server", "model", "shape")
    cpu = benchkit.means(rows, "server_cpu_us_per_request", "server", "model", "shape")
    for server in dict.fromkeys(r["server"] for r in rows):
        for shape in dict.fromkeys(r["shape"] for r in rows):
            direct = rate.get((server, "identity", shape), 0.0)
            bls = rate.get((server, "bls_identity", shape), 0.0)
            cpu_d = cpu.get((server, "identity", shape), 0.0)
            cpu_b = cpu.get((server, "bls_identity", shape), 0.0)
            print(f"{server:9s} [{shape}]: direct {direct:8.1f}/s, BLS {bls:8.1f}/s "
                  f"(x{bls / direct if direct else 0:.2f}); server CPU/request "
                  f"{cpu_d:.0f} us direct, {cpu_b:.0f} us BLS (+{cpu_b - cpu_d:.0f} us)")


def main() -> None:
    p = benchkit.parser(__doc__)
    benchkit.add_common_args(p, [28500, 28501, 28502], duration=6.0, warmup=2.0,
                             concurrency=4, servers="triton,shmserve")
    p.add_argument("--shapes", default="1,16;1,262144")
    args = benchkit.parse(p, "bench-py-")
    servers = benchkit.servers(args)
    points = [(model, shape) for shape in args.shapes.split(";")
              for model in ("identity", "bls_identity")]
    rows = []
    with benchkit.repository("bls-repo-", write_repo) as repo:
        for r, order in benchkit.alternating(args.rounds, servers):
            for kind in order:
                for row in measure(kind, repo, points, args):
                    row["round"] = r
                    rows.append(row)
    summary(rows)
    benchkit.finish(args, rows)


if __name__ == "__main__":
    main()
