#!/usr/bin/env python3
"""Reload under load, measured: requests/s, p50 and p99 latency and failed requests
before, during and after a reload of the model being served.

One python model `scaled` (OUTPUT0 = INPUT0 * the config's `scale`, two CPU instances,
[1,16] FP32) in a fresh repository, served in explicit mode. `--concurrency` gRPC
clients (threads of this process) send requests in a closed loop; after `--phase`
seconds the config's scale is edited and the repository load API is called (a reload
of a changed config); "during" lasts from that call until it returns; then `--phase`
seconds more. Every request is counted in the phase it started in; a failed request
is any error answer. The answer's value says which config served it, so the switch
shows too. `--init-delay-ms` makes the new instances slow to start (a large model).

    scripts/bench_reload.py --servers shmserve,triton --phase 5 --concurrency 8
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

import benchkit

CONFIG = """name: "scaled"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, -1 ] }} ]
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
parameters {{ key: "scale" value: {{ string_value: "{scale}" }} }}
parameters {{ key: "init_delay_ms" value: {{ string_value: "{delay}" }} }}
"""

MODEL_PY = '''
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.scale = float(params["scale"]["string_value"])
        time.sleep(float(params["init_delay_ms"]["string_value"]) / 1000)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", (pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                        * self.scale).astype(np.float32))]) for r in requests]
'''


def write_repo(repo: Path, delay: int) -> None:
    benchkit.write_model(repo, "scaled", CONFIG.format(scale=1, delay=delay), MODEL_PY)


def load(http_port: int) -> tuple[int, str]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{http_port}/v2/repository/models/scaled/load", data=b"{}",
        method="POST")
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, ""
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def run_one(kind: str, args) -> dict:
    import tritonclient.grpc as grpcclient

    with benchkit.repository("bench-reload-", write_repo, args.init_delay_ms) as repo:
        extra = ["--model-control-mode", "explicit", "--load-model", "scaled"]
        log = Path(args.log_dir) / f"{kind}.log"
        with benchkit.Server(kind, repo, args.ports, log, extra, check_ports=True) as srv:
            samples: list[tuple[float, float, bool, float]] = []  # start, s, ok, value
            stop = threading.Event()

            def client() -> None:
                c = grpcclient.InferenceServerClient(srv.grpc_url)
                x = np.ones((1, 16), dtype=np.float32)
                inp = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
                inp.set_data_from_numpy(x)
                mine = []
                while not stop.is_set():
                    t0 = time.monotonic()
                    try:
                        r = c.infer("scaled", [inp])
                        ok, value = True, float(r.as_numpy("OUTPUT0")[0, 0])
                    except Exception:  # noqa: BLE001 - counted as a failure
                        ok, value = False, 0.0
                    mine.append((t0, time.monotonic() - t0, ok, value))
                samples.extend(mine)

            threads = [threading.Thread(target=client) for _ in range(args.concurrency)]
            for t in threads:
                t.start()
            time.sleep(args.warmup)
            t_begin = time.monotonic()
            time.sleep(args.phase)
            (repo / "scaled" / "config.pbtxt").write_text(
                CONFIG.format(scale=2, delay=args.init_delay_ms))
            t_load = time.monotonic()
            status, error = load(srv.http)
            t_loaded = time.monotonic()
            time.sleep(args.phase)
            t_end = time.monotonic()
            stop.set()
            for t in threads:
                t.join(60)
    phases = {"before": (t_begin, t_load), "during": (t_load, t_loaded),
              "after": (t_loaded, t_end)}
    row = {"server": kind, "concurrency": args.concurrency,
           "init_delay_ms": args.init_delay_ms, "load_status": status,
           "load_error": error[:200], "reload_s": round(t_loaded - t_load, 3)}
    for name, (a, b) in phases.items():
        inside = [s for s in samples if a <= s[0] < b]
        lat = sorted(s[1] for s in inside if s[2])
        row[name] = {
            "seconds": round(b - a, 3),
            "requests": len(inside),
            "failed": sum(1 for s in inside if not s[2]),
            "infer_per_s": round(len(inside) / (b - a), 1) if b > a else 0.0,
            "p50_ms": round(statistics.median(lat) * 1000, 2) if lat else None,
            "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 2)
            if lat else None,
            "served_by_scale": {str(v): sum(1 for s in inside if s[2] and s[3] == v)
                                for v in sorted({s[3] for s in inside if s[2]})},
        }
    row["failed_total"] = sum(1 for s in samples if not s[2])
    return row


def main() -> None:
    p = benchkit.parser(__doc__)
    benchkit.add_common_args(p, [18310, 18311, 18312], concurrency=8, warmup=2.0,
                             servers="shmserve", rounds=1)
    p.add_argument("--phase", type=float, default=5.0)
    p.add_argument("--init-delay-ms", type=int, default=1000)
    args = benchkit.parse(p, "bench-reload-")
    rows: list[dict] = []
    for rnd, kinds in benchkit.alternating(args.rounds, benchkit.servers(args)):
        for kind in kinds:
            row = run_one(kind, args)
            row["round"] = rnd
            benchkit.record(rows, row)
    for row in rows:
        print(f"{row['server']:>9} reload {row['reload_s']:.2f}s (load HTTP "
              f"{row['load_status']})  failed {row['failed_total']}")
        for name in ("before", "during", "after"):
            ph = row[name]
            print(f"    {name:>6}: {ph['infer_per_s']:8.1f} infer/s  p50 "
                  f"{ph['p50_ms']} ms  p99 {ph['p99_ms']} ms  failed {ph['failed']}  "
                  f"served by scale {json.dumps(ph['served_by_scale'])}")
    benchkit.finish(args, rows)


if __name__ == "__main__":
    main()
