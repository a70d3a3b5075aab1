#!/usr/bin/env python3
"""How much of a gRPC request's cost is grpcio's own: server CPU per request of gRPC
servers that answer ModelInfer with a canned reply and do nothing else, beside
shmserve's frontend process serving the example repository's identity model, all
driven by the same scripts/bench client, alternating, in one run.

    scripts/grpc_floor.py --rounds 2 --duration 6

Servers: `aio` (grpc.aio on asyncio's loop), `aio-uvloop` (grpc.aio on uvloop, as the
frontend runs), `sync` (grpc.server on a thread pool), `h2-raw` (no grpcio: the
frontend's own HTTP/2 layer, transport/h2.py, with canned replies and no gRPC layer,
scripts/h2_floor.py), and `shmserve` (its frontend process alone; the scheduler and
worker are counted apart). A canned server's CPU per request is the floor a Python gRPC
frontend built that way cannot go under here. Measured on the 2-core VM, two rounds of
5 s at c=16: aio-uvloop 251 / 263 us per request, h2-raw 57 / 54 us (4.1k-4.3k against
7.9k-8.0k infer/s, where the Python client is the limit).

Also runs as the canned server itself: `grpc_floor.py --serve MODE PORT`.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
SERVICE = "inference.GRPCInferenceService"
MODES = ("aio", "aio-uvloop", "sync", "h2-raw", "shmserve")


def serve(mode: str, port: int) -> None:
    """A ModelInfer that answers every request with the same serialized reply."""
    import grpc
    from tritonclient.grpc import service_pb2

    reply = service_pb2.ModelInferResponse(model_name="identity_fp32", model_version="1")
    reply.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, 16])
    reply.raw_output_contents.append(bytes(64))
    wire = reply.SerializeToString()
    # the bench reads the model's inputs from its metadata before the measured window
    meta = service_pb2.ModelMetadataResponse(name="identity_fp32", versions=["1"],
                                             platform="python")
    meta.inputs.add(name="INPUT0", datatype="FP32", shape=[-1, -1])
    meta.outputs.add(name="OUTPUT0", datatype="FP32", shape=[-1, -1])
    meta_wire = meta.SerializeToString()
    from tritonclient.grpc import model_config_pb2
    config_wire = service_pb2.ModelConfigResponse(config=model_config_pb2.ModelConfig(
        name="identity_fp32", max_batch_size=64)).SerializeToString()
    address = f"127.0.0.1:{port}"

    def handlers(infer):
        return (grpc.method_handlers_generic_handler(SERVICE, {
            "ModelInfer": grpc.unary_unary_rpc_method_handler(infer),
            "ModelMetadata": grpc.unary_unary_rpc_method_handler(metadata),
            "ModelConfig": grpc.unary_unary_rpc_method_handler(config)}),)

    def metadata(data, context):
        return meta_wire

    def config(data, context):
        return config_wire

    if mode != "sync":  # grpc.aio wants coroutines
        async def metadata(data, context):  # noqa: F811
            return meta_wire

        async def config(data, context):  # noqa: F811
            return config_wire

    if mode == "h2-raw":  # no grpcio: HTTP/2 frames on an asyncio protocol
        from h2_floor import serve as serve_h2
        serve_h2(port, {"ModelInfer": wire, "ModelMetadata": meta_wire,
                        "ModelConfig": config_wire})
        return

    if mode == "sync":
        from concurrent.futures import ThreadPoolExecutor
        server = grpc.server(ThreadPoolExecutor(16))
        server.add_generic_rpc_handlers(handlers(lambda data, context: wire))
        server.add_insecure_port(address)
        server.start()
        server.wait_for_termination()
        return

    async def infer(data, context):
        return wire

    async def main():
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(handlers(infer))
        server.add_insecure_port(address)
        await server.start()
        await server.wait_for_termination()

    if mode == "aio-uvloop":
        import uvloop
        uvloop.run(main())
    else:
        import asyncio
        asyncio.run(main())


def _wait_port(port: int, proc, timeout: float = 120.0) -> None:
    from compare import port_busy
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        if port_busy(port):
            return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {port}")


def measure(mode: str, args) -> dict:
    from bench_mlp import cpu_by_role, process_tree, run_bench, wait_ready
    port = args.port
    if mode == "shmserve":
        cmd = [sys.executable, "-m", "scheduler.main", "--model-repository",
               str(ROOT / "examples" / "model_repository"), "--grpc-port", str(port),
               "--http-port", str(port + 1), "--metrics-port", str(port + 2),
               "--grpc-address", "127.0.0.1", "--http-address", "127.0.0.1",
               "--frontend-processes", "1"]
    else:
        cmd = [sys.executable, __file__, "--serve", mode, str(port)]
    server = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        if mode == "shmserve":
            wait_ready(port + 1, server)
        else:
            _wait_port(port, server)
        # CPU of the frontend process alone, or of the canned server (which runs as a
        # script, and cpu_by_role counts scripts as 'client')
        role = "frontend.main" if mode == "shmserve" else "client"
        pids = process_tree(server.pid)
        row, seconds, c0, c1 = run_bench(
            ["--url", f"127.0.0.1:{port}", "--model", "identity_fp32", "--shape", "1,16",
             "--concurrency", str(args.concurrency), "--no-verify"],
            args.warmup, args.duration, lambda client: cpu_by_role(pids)[role])
    finally:
        server.send_signal(signal.SIGINT if mode == "shmserve" else signal.SIGKILL)
        server.wait(60)
    requests = row["throughput"] * seconds
    return {"mode": mode, "throughput": row["throughput"], "p50_ms": row["p50_ms"],
            "server_cpu_ms": 1e3 * (c1 - c0) / requests if requests else float("nan")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--serve", nargs=2, metavar=("MODE", "PORT"), help=argparse.SUPPRESS)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--port", type=int, default=28450)
    args = p.parse_args()
    if args.serve:
        return serve(args.serve[0], int(args.serve[1]))
    modes = args.modes.split(",")
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"unknown mode {m!r} (one of {', '.join(MODES)})")
    print(f"{'round':>5} {'server':>11} {'infer/s':>9} {'p50 ms':>8} {'server CPU ms/req':>18}")
    for r in range(args.rounds):
        for mode in modes:
            x = measure(mode, args)
            print(f"{r + 1:>5} {mode:>11} {x['throughput']:>9.1f} {x['p50_ms']:>8.2f} "
                  f"{x['server_cpu_ms']:>18.3f}", flush=True)


if __name__ == "__main__":
    main()
