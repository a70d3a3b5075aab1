#!/usr/bin/env python3
"""Ensemble overhead, measured: a two-step ensemble of identity models against the
client calling the two models one after the other, on one shmserve, alternating the
two ways every round so the machine's drift spreads over both.

The models (written into a fresh repository): `identity_a` and `identity_b`, python
identity models (max_batch_size 8, no dynamic batching, one instance each), and
`ens_identity`: IN -> identity_a -> T -> identity_b -> OUT.

Two sizes:
- small: [1,16] FP32 over gRPC, tensors in the messages;
- 1mib: [1,262144] FP32 (1 MiB) over system shared memory: the client's input and
  output live in regions it registered, so neither way sends tensor bytes over the
  socket; for the two calls, the first call's output region is the second's input.

Each point is a closed loop of `--concurrency` gRPC clients (threads of this process)
for `--duration` seconds. Beside throughput and latency it prints the CPU time of every
server process by role per request (from /proc) and the ratio ensemble / two calls.

    scripts/bench_ensemble.py --rounds 2 --duration 5
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np

import benchkit

ENSEMBLE_CONFIG = """name: "ens_identity"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "identity_a" model_version: -1
      input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "T" } },
    { model_name: "identity_b" model_version: -1
      input_map { key: "INPUT0" value: "T" } output_map { key: "OUTPUT0" value: "OUT" } }
  ]
}
"""

SIZES = {"small": 16, "1mib": 262_144}


def write_repo(repo: Path) -> None:
    for name in ("identity_a", "identity_b"):
        benchkit.write_model(repo, name, benchkit.IDENTITY_CONFIG.format(name=name),
                             benchkit.IDENTITY_PY)
    benchkit.write_model(repo, "ens_identity", ENSEMBLE_CONFIG)


class Client:
    """One closed-loop client: its own gRPC connection and, for shm, its own regions."""

    def __init__(self, url: str, size: str):
        import tritonclient.grpc as grpcclient
        import tritonclient.utils.shared_memory as shm
        self.g, self.shm = grpcclient, shm
        self.c = grpcclient.InferenceServerClient(url)
        self.n = SIZES[size]
        self.x = np.arange(self.n, dtype=np.float32).reshape(1, self.n)
        self.nbytes = self.x.nbytes
        self.use_shm = size != "small"
        self.handles = []
        if self.use_shm:
            # in, middle (the first call's output, the second's input), out
            self.regions = []
            for part in ("in", "mid", "out"):
                name = f"b{part}{uuid.uuid4().hex[:8]}"
                key = f"/{name}"
                handle = shm.create_shared_memory_region(name, key, self.nbytes)
                self.c.register_system_shared_memory(name, key, self.nbytes)
                self.handles.append(handle)
                self.regions.append(name)
            shm.set_shared_memory_region(self.handles[0], [self.x])

    def _input(self, name: str, region: str | None):
        inp = self.g.InferInput(name, [1, self.n], "FP32")
        if region is None:
            inp.set_data_from_numpy(self.x)
        else:
            inp.set_shared_memory(region, self.nbytes)
        return inp

    def _output(self, name: str, region: str | None):
        out = self.g.InferRequestedOutput(name)
        if region is not None:
            out.set_shared_memory(region, self.nbytes)
        return out

    def ensemble(self) -> None:
        r_in, _, r_out = self.regions if self.use_shm else (None, None, None)
        self.c.infer("ens_identity", [self._input("IN", r_in)],
                     outputs=[self._output("OUT", r_out)])

    def two_calls(self) -> None:
        if self.use_shm:
            r_in, r_mid, r_out = self.regions
            self.c.infer("identity_a", [self._input("INPUT0", r_in)],
                         outputs=[self._output("OUTPUT0", r_mid)])
            self.c.infer("identity_b", [self._input("INPUT0", r_mid)],
                         outputs=[self._output("OUTPUT0", r_out)])
            return
        r = self.c.infer("identity_a", [self._input("INPUT0", None)])
        mid = self.g.InferInput("INPUT0", [1, self.n], "FP32")
        mid.set_data_from_numpy(r.as_numpy("OUTPUT0"))
        self.c.infer("identity_b", [mid])

    def check(self) -> None:
        """Both ways give the input back (run once, outside the timed loop)."""
        for way in (self.ensemble, self.two_calls):
            if self.use_shm:
                self.shm.set_shared_memory_region(self.handles[2], [np.zeros_like(self.x)])
                way()
                got = self.shm.get_contents_as_numpy(self.handles[2], np.float32,
                                                     [1, self.n])
                assert np.array_equal(got, self.x), way.__name__
            else:
                way()

    def close(self) -> None:
        for name in getattr(self, "regions", []):
            self.c.unregister_system_shared_memory(name)
        for handle in self.handles:
            self.shm.destroy_shared_memory_region(handle)
        self.c.close()


def run_loop(clients: list[Client], way: str, warmup: float, duration: float,
             sample) -> dict:
    stop = threading.Event()
    measuring = threading.Event()
    lat: list[list[float]] = [[] for _ in clients]

    def loop(i: int, client: Client) -> None:
        call = getattr(client, way)
        while not stop.is_set():
            t0 = time.perf_counter()
            call()
            if measuring.is_set():
                lat[i].append(time.perf_counter() - t0)

    threads = [threading.Thread(target=loop, args=(i, c)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    time.sleep(warmup)
    t0, cpu0 = time.monotonic(), sample()
    measuring.set()
    time.sleep(duration)
    measuring.clear()
    t1, cpu1 = time.monotonic(), sample()
    stop.set()
    for t in threads:
        t.join()
    all_lat = sorted(x for part in lat for x in part)
    n = len(all_lat)
    return {"way": way, "infer_per_s": round(n / (t1 - t0), 1),
            "p50_ms": round(statistics.median(all_lat) * 1e3, 3) if n else 0.0,
            "p99_ms": round(all_lat[int(0.99 * (n - 1))] * 1e3, 3) if n else 0.0,
            **benchkit.cpu_columns(cpu0, cpu1, n)}


def main() -> None:
    p = benchkit.parser(__doc__)
    benchkit.add_common_args(p, [28500, 28501, 28502], duration=5.0, warmup=1.0,
                             concurrency=1)
    p.add_argument("--sizes", default="small,1mib")
    args = benchkit.parse(p, "bench-ensemble-")
    rows = []
    log = Path(tempfile.mkdtemp(prefix="bench-ensemble-")) / "shmserve.log"
    with benchkit.repository("ensemble-repo-", write_repo) as repo, \
            benchkit.Server("shmserve", repo, args.ports, log,
                            extra=["--allow-client-shm=true"]) as server:

        def sample():
            out = server.cpu()
            out["client"] = benchkit.own_cpu()
            return out

        for size in args.sizes.split(","):
            clients = [Client(server.grpc_url, size) for _ in range(args.concurrency)]
            try:
                clients[0].check()
                for r, order in benchkit.alternating(args.rounds,
                                                     ["ensemble", "two_calls"]):
                    for way in order:
                        row = run_loop(clients, way, args.warmup, args.duration, sample)
                        row.update(size=size, round=r, concurrency=args.concurrency)
                        benchkit.record(rows, row)
            finally:
                for c in clients:
                    c.close()
            got = benchkit.means([x for x in rows if x["size"] == size],
                                 "infer_per_s", "way")
            print(json.dumps({"size": size, "ensemble_over_two_calls":
                              round(got["ensemble",] / got["two_calls",], 2)}),
                  flush=True)
    benchkit.finish(args, rows, f"server log: {log}")


if __name__ == "__main__":
    main()
