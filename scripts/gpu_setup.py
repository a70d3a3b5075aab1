"""What scripts/gpu_compare.py does before and after it measures: the GPU check, the
machine's facts, the log, and both servers (their commands, started side by side,
their models' states, stopped), plus the view of a server that bench_cclient takes."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import bench  # scheduler/bench/main.py, through scripts/bench.py
import compare
import gpu_models as models
from scheduler.bench.procs import cpu_seconds, describe, process_tree

SERVER_FLAGS = ("--http-address 127.0.0.1 --grpc-address 127.0.0.1 "
                "--metrics-address 127.0.0.1 --exit-on-error false --strict-readiness false")
# a model that fails to load takes only its own rows with it, not the run:
# --exit-on-error false and readiness that does not wait for every model, both servers


def check_gpu(device: int) -> tuple[dict, list[str]]:
    """What the run needs of the GPU machine: (facts for the JSON, problems)."""
    info, problems = {}, []
    try:
        import torch
        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(device)
        else:
            problems.append("torch sees no CUDA device (torch.cuda.is_available() is "
                            "False): is this the GPU machine?")
    except ImportError as exc:
        problems.append(f"no torch: {exc}")
    try:
        import cupy
        info["cupy"] = cupy.__version__
        if cupy.cuda.runtime.getDeviceCount() < 1:
            problems.append("cupy sees no CUDA device")
    except Exception as exc:  # ImportError, or CUDARuntimeError without a driver
        problems.append(f"cupy: {type(exc).__name__}: {exc}")
    from shm import cuda
    if cuda.device_count() < 1:
        problems.append("the CUDA driver (libcuda.so.1) shows shmserve no device")
    try:
        from scheduler.bench import cuda as bench_cuda
        info["cuda_regions"] = bench_cuda.name()
    except RuntimeError as exc:
        problems.append(str(exc))
    return info, problems


def machine_facts() -> dict:
    facts = bench.machine_info()
    try:
        facts["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    from importlib import metadata
    for package in ("tritonclient", "numpy", "torch", "cupy", "onnxruntime",
                    "onnxruntime-gpu"):
        try:
            facts[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return facts


def tee_output(path: Path) -> None:
    """This process's stdout and stderr, and so its children's (the client processes),
    go to `path` too, line by line: the log is on disk whenever the run is cut off."""
    sys.stdout.flush()
    sys.stderr.flush()
    if shutil.which("tee") is None:
        return
    tee = subprocess.Popen(["tee", "-a", str(path)], stdin=subprocess.PIPE,
                           start_new_session=True)  # Ctrl-C must not stop the log first
    os.dup2(tee.stdin.fileno(), 1)
    os.dup2(tee.stdin.fileno(), 2)
    tee.stdin.close()
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


# --------------------------------------------------------------------- servers


def server_specs(args, repos: models.Repos, ports: list[int]) -> list[compare.ServerSpec]:
    specs = []
    if "shmserve" not in args.skip:
        h, g, m = ports[0:3]
        cmd = (f"{shlex.quote(sys.executable)} -m scheduler.main --model-repository "
               f"{repos.paths['shmserve']} --http-port {h} --grpc-port {g} --metrics-port {m} "
               f"{SERVER_FLAGS} --allow-client-shm true {args.shmserve_args}")
        specs.append(compare.ServerSpec("shmserve", cmd, h, g))
    if "triton" not in args.skip and args.triton_cmd:
        h, g, m = ports[3:6]
        cmd = (f"{args.triton_cmd} {repos.paths['triton']} {h} {g} {m} {SERVER_FLAGS} "
               f"{args.triton_args}")
        specs.append(compare.ServerSpec("triton", cmd, h, g))
    return specs


def start_all(servers: list[compare.Server]) -> dict[str, str]:
    """Start every server at once (their models load side by side); name -> why one
    did not come up."""
    failed: dict[str, str] = {}

    def start(s):
        try:
            s.start()
        except BaseException as exc:  # noqa: BLE001  reported, the others go on
            failed[s.spec.name] = str(exc)[-2000:]
    threads = [threading.Thread(target=start, args=(s,), daemon=True) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failed


def stop_all(servers: list[compare.Server]) -> None:
    threads = [threading.Thread(target=s.stop, daemon=True) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


def model_states(http_port: int, wait: float = 60.0) -> dict[str, dict]:
    """name -> {state, reason} from the repository index, once no model is loading."""
    deadline = time.monotonic() + wait
    while True:
        req = urllib.request.Request(f"http://127.0.0.1:{http_port}/v2/repository/index",
                                     data=b"{}", method="POST")
        with compare._OPENER.open(req, timeout=10) as r:
            items = json.loads(r.read())
        states = {i["name"]: {"state": i.get("state", ""), "reason": i.get("reason", "")}
                  for i in items}
        if time.monotonic() > deadline or all(
                s["state"] not in ("LOADING", "") for s in states.values()):
            return states
        time.sleep(0.5)


class CServer:
    """A compare.Server as bench_cclient.measure sees one: its ports, and its CPU
    seconds so far by role (the roles of scripts/bench: frontend N, scheduler, worker
    MODEL/..., tritonserver, python_stub)."""

    def __init__(self, server: compare.Server):
        self.kind = server.spec.name
        self.ports = (server.spec.http, server.spec.grpc)
        self.pid = server.proc.pid
        self.roles: dict[int, str] = {}

    def cpu(self) -> dict[str, float]:
        if not self.roles:
            self.roles = describe(process_tree(self.pid))
        out: dict[str, float] = {}
        for pid, role in self.roles.items():
            s = cpu_seconds(pid)
            if s is not None:
                out[role] = out.get(role, 0.0) + s
        return out


def start_servers(specs: list[compare.ServerSpec], log_dir: str, ready_timeout: float,
                  res, t0: float) -> tuple[list[compare.Server], dict]:
    """Start every server side by side: (every Server, to stop them all later; name ->
    Server of those up). Each one's models and their states, or why it is not up, go
    into results.json (res: gpu_report.Results)."""
    servers = [compare.Server(s, log_dir, ready_timeout, 20.0, None) for s in specs]
    failed = start_all(servers)
    up = {}
    for s in servers:
        name = s.spec.name
        try:
            if name in failed:
                raise RuntimeError(failed[name])
            states = model_states(s.spec.http)
        except Exception as exc:  # noqa: BLE001  this server is out, the others go on
            print(f"gpu_compare: {name} is not up: {exc}", file=sys.stderr, flush=True)
            res.data["servers"][name] = {"started": False, "why": str(exc)[-2000:],
                                         "cmd": s.spec.cmd, "log": s.log_path}
            continue
        res.data["servers"][name] = {"started": True, "cmd": s.spec.cmd,
                                     "models": states, "log": s.log_path}
        print(f"# {name} ready after {time.monotonic() - t0:.0f}s: " + ", ".join(
            f"{m} {st['state']}" for m, st in sorted(states.items())), flush=True)
        up[name] = s
    res.save()
    return servers, up
