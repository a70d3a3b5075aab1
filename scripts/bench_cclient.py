#!/usr/bin/env python3
"""Throughput with C load generators, so the client is not the bottleneck: `wrk` for
HTTP and `h2load` for gRPC (Debian packages `wrk` and `nghttp2-client`), shmserve and
the real Triton side by side, A B A B, with the servers' CPU per request by role.

Both servers serve the same fresh repository: `identity_fp32`, a python identity model
(max_batch_size 64, dynamic batching with a 100 us delay, two CPU instances), the
anchor's model. Each request is [1,16] FP32 (`--elements`):

- HTTP: wrk posts one binary-extension body (a JSON header, then the input's bytes;
  the output is asked for in binary) on `--connections` keep-alive connections;
- gRPC: h2load posts one framed `ModelInferRequest` (built by tritonclient) to
  `/inference.GRPCInferenceService/ModelInfer` on `--h2-connections` HTTP/2
  connections with `--h2-streams` streams each (gRPC clients multiplex on few
  connections; connections spread over shmserve's frontend processes).

Before timing, each body is sent once and its answer checked, since h2load counts a
gRPC error (status 200, grpc-status in the trailers) as a success. A point's row:
requests/s, the client's CPU per request (the C tool's own), and the server's CPU per
request by role, read from /proc over the load tool's whole run (its warm-up excluded:
a warm-up run comes first).

    scripts/bench_cclient.py --rounds 3 --duration 10
    scripts/bench_cclient.py --servers shmserve --protocols grpc --h2-connections 4
"""

from __future__ import annotations

import json
import re
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

import benchkit


MODEL = "identity_fp32"
GRPC_PATH = "/inference.GRPCInferenceService/ModelInfer"


def http_body(elements: int) -> tuple[bytes, int]:
    """A binary-extension infer body and the length of its JSON header."""
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "shape": [1, elements], "datatype": "FP32",
                    "parameters": {"binary_data_size": 4 * elements}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }, separators=(",", ":")).encode()
    data = np.arange(elements, dtype=np.float32).tobytes()
    return header + data, len(header)


def grpc_message(elements: int) -> bytes:
    """A serialized ModelInferRequest, as tritonclient.grpc builds it."""
    from tritonclient.grpc import service_pb2
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, elements])
    del tensor  # raw contents carry the bytes, as tritonclient sends them
    request.outputs.add(name="OUTPUT0")
    request.raw_input_contents.append(np.arange(elements, dtype=np.float32).tobytes())
    return request.SerializeToString()


def check_http(port: int, body: bytes, header_len: int, elements: int) -> None:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/models/{MODEL}/infer", data=body, method="POST",
        headers={"Inference-Header-Content-Length": str(header_len),
                 "Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        answer = resp.read()
        json_len = int(resp.headers["Inference-Header-Content-Length"])
    out = np.frombuffer(answer[json_len:], dtype=np.float32)
    if not np.array_equal(out, np.arange(elements, dtype=np.float32)):
        raise SystemExit(f"HTTP check on :{port}: wrong answer {answer[:200]!r}")


def check_grpc(port: int, message: bytes, elements: int) -> None:
    import grpc
    from tritonclient.grpc import service_pb2
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(GRPC_PATH)  # raw bytes both ways
        reply = service_pb2.ModelInferResponse.FromString(call(message, timeout=30))
    out = np.frombuffer(reply.raw_output_contents[0], dtype=np.float32)
    if not np.array_equal(out, np.arange(elements, dtype=np.float32)):
        raise SystemExit(f"gRPC check on :{port}: wrong answer {reply}")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_tool(cmd: list[str], timeout: float) -> tuple[str, float]:
    """Run a load tool; its output and the CPU seconds it used."""
    cpu0 = children_cpu()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({out.returncode}): {out.stderr or out.stdout}")
    return out.stdout, children_cpu() - cpu0


def wrk_command(args, port: int, seconds: float, script: Path) -> list[str]:
    return ["wrk", "-t", str(args.wrk_threads), "-c", str(args.connections),
            "-d", f"{max(1, round(seconds))}s", "--latency", "-s", str(script),
            f"http://127.0.0.1:{port}/v2/models/{MODEL}/infer"]


def h2load_command(args, port: int, seconds: float, data: Path) -> list[str]:
    return ["h2load", "-D", str(max(1, round(seconds))), "-c", str(args.h2_connections),
            "-m", str(args.h2_streams), "-t", str(args.h2_threads), "-d", str(data),
            "-H", "content-type: application/grpc", "-H", "te: trailers",
            f"http://127.0.0.1:{port}{GRPC_PATH}"]


def parse_wrk(text: str) -> dict:
    done = re.search(r"(\d+) requests in", text)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), "
                       r"timeout (\d+)", text)
    lat = {m.group(1): m.group(2) for m in
           re.finditer(r"^\s+(50|90|99)%\s+(\S+)", text, re.M)}
    return {"requests": int(done.group(1)) if done else 0,
            "failed": (int(bad.group(1)) if bad else 0)
            + (sum(int(x) for x in errors.groups()) if errors else 0),
            "p50": lat.get("50"), "p99": lat.get("99")}


def parse_h2load(text: str) -> dict:
    done = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, "
                     r"(\d+) failed, (\d+) errored", text)
    lat = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", text)
    return {"requests": int(done.group(1)) if done else 0,
            "failed": int(done.group(2)) + int(done.group(3)) if done else 0,
            "mean": lat.group(3) if lat else None}


def measure(server: benchkit.Server, protocol: str, args, files: dict) -> dict:
    if protocol == "http":
        make = lambda s: wrk_command(args, server.ports[0], s, files["lua"])  # noqa
        parse = parse_wrk
    else:
        make = lambda s: h2load_command(args, server.ports[1], s, files["grpc"])  # noqa
        parse = parse_h2load
    run_tool(make(args.warmup), args.warmup + 60)  # unmeasured: connections, caches
    cpu0 = server.cpu()
    t0 = time.perf_counter()
    text, client_cpu = run_tool(make(args.duration), args.duration + 60)
    wall = time.perf_counter() - t0
    cpu1 = server.cpu()
    result = parse(text)
    n = result["requests"]
    row = {"server": server.kind, "protocol": protocol, "seconds": round(wall, 2),
           "infer_per_s": round(n / args.duration, 1), **result}
    row.update(benchkit.cpu_columns(cpu0, cpu1, n))
    row["client_cpu_us_per_request"] = round(1e6 * client_cpu / n, 1) if n else None
    if args.verbose:
        print(text, file=sys.stderr)
    return row


def write_inputs(tmp: Path, elements: int) -> dict:
    body, header_len = http_body(elements)
    (tmp / "body.bin").write_bytes(body)
    lua = tmp / "post.lua"
    # wrk's body is a Lua string: written as decimal escapes, every byte survives
    escaped = "".join(f"\\{b}" for b in body)
    lua.write_text('wrk.method = "POST"\n'
                   f'wrk.body = "{escaped}"\n'
                   f'wrk.headers["Inference-Header-Content-Length"] = "{header_len}"\n'
                   'wrk.headers["Content-Type"] = "application/octet-stream"\n')
    message = grpc_message(elements)
    framed = tmp / "grpc.bin"  # gRPC's length-prefixed frame: no compression flag
    framed.write_bytes(struct.pack(">BI", 0, len(message)) + message)
    return {"lua": lua, "grpc": framed, "body": body, "header_len": header_len,
            "message": message}


def main() -> None:
    p = benchkit.parser(__doc__)
    benchkit.add_common_args(p, [18420, 18421, 18422], duration=10.0, warmup=2.0,
                             servers="shmserve,triton", rounds=3)
    p.add_argument("--protocols", default="http,grpc")
    p.add_argument("--elements", type=int, default=16)
    p.add_argument("--connections", type=int, default=64, help="wrk connections")
    p.add_argument("--wrk-threads", type=int, default=2)
    p.add_argument("--h2-connections", type=int, default=16)
    p.add_argument("--h2-streams", type=int, default=4, help="streams per connection")
    p.add_argument("--h2-threads", type=int, default=1)
    p.add_argument("--verbose", action="store_true", help="print the tools' output")
    args = benchkit.parse(p, "bench-cclient-")
    protocols = args.protocols.split(",")
    for tool, proto in (("wrk", "http"), ("h2load", "grpc")):
        if proto in protocols and shutil.which(tool) is None:
            sys.exit(f"{tool} not found: apt-get install "
                     f"{'wrk' if tool == 'wrk' else 'nghttp2-client'}")
    rows: list[dict] = []
    with benchkit.repository("bench-cclient-repo-", benchkit.write_model, MODEL,
                             benchkit.ANCHOR_IDENTITY_CONFIG, benchkit.IDENTITY_PY) as repo, \
            tempfile.TemporaryDirectory(prefix="bench-cclient-") as tmp:
        files = write_inputs(Path(tmp), args.elements)
        for rnd, kinds in benchkit.alternating(args.rounds, benchkit.servers(args)):
            for kind in kinds:
                log = Path(args.log_dir) / f"{kind}.log"
                with benchkit.Server(kind, repo, args.ports, log, check_ports=True) as srv:
                    check_http(args.ports[0], files["body"], files["header_len"],
                               args.elements)
                    check_grpc(args.ports[1], files["message"], args.elements)
                    for protocol in protocols:
                        row = measure(srv, protocol, args, files)
                        row["round"] = rnd
                        benchkit.record(rows, row)
    summary(rows)
    benchkit.finish(args, rows)


def summary(rows: list[dict]) -> None:
    print(f"\n{'server':>9} {'proto':>5} {'infer/s':>9} {'server us/req':>14} "
          f"{'client us/req':>14}  server CPU by role (us/req)")
    for row in rows:
        roles = ", ".join(f"{k} {v}" for k, v in row["cpu_us_per_request"].items() if v)
        print(f"{row['server']:>9} {row['protocol']:>5} {row['infer_per_s']:>9.0f} "
              f"{row['server_cpu_us_per_request']:>14} "
              f"{row['client_cpu_us_per_request']!s:>14}  {roles}")
    kinds = sorted({r["server"] for r in rows})
    if "triton" in kinds and "shmserve" in kinds:
        tput = benchkit.means(rows, "infer_per_s", "server", "protocol")
        cpu = benchkit.means(rows, "server_cpu_us_per_request", "server", "protocol")
        for proto in sorted({r["protocol"] for r in rows}):
            a, b = ("shmserve", proto), ("triton", proto)
            if a in tput and b in tput and tput[b]:
                print(f"{proto}: shmserve / Triton throughput {tput[a] / tput[b]:.2f}x, "
                      f"server CPU per request {cpu[a]:.0f} vs {cpu[b]:.0f} us")


if __name__ == "__main__":
    main()
