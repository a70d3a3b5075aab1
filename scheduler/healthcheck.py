"""`python -m scheduler.healthcheck [PID]`: exit 0 while the shmserve running here is
ready, 1 otherwise; the container image's HEALTHCHECK.

It asks the port the server was really started with, read from the server's own
command line (/proc/PID/cmdline, parsed by the server's own parser), so
`docker run IMAGE --http-port=9000 ...` stays healthy where a HEALTHCHECK with 8000
written into it would mark it unhealthy. Without PID it takes the oldest process
running shmserve (the root: it starts every other). A server started with
--allow-http=false is asked over gRPC instead."""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

from scheduler.cli import build_parser

# how a process shows it runs shmserve: the console script, or the module
MARKERS = ("shmserve", "scheduler.main")


def cmdline(pid: int | str, proc: str = "/proc") -> list[str]:
    try:
        raw = (Path(proc) / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def find_server(proc: str = "/proc") -> list[str] | None:
    """The argv of the oldest (lowest-PID) process running shmserve, or None."""
    pids = sorted(int(p) for p in os.listdir(proc) if p.isdigit())
    for pid in pids:
        argv = cmdline(pid, proc)
        if len(argv) > 1 and any(Path(a).name == m or a == m
                                 for a in argv[:3] for m in MARKERS):
            return argv
    return None


def _local(address: str) -> str:
    """Where to reach an address the server listens on from inside its container."""
    if address in ("", "0.0.0.0"):
        return "127.0.0.1"
    if address == "::":
        return "[::1]"
    return f"[{address}]" if ":" in address else address


def target(argv: list[str]) -> tuple[str, str]:
    """('http', URL) or ('grpc', HOST:PORT) of the readiness check for the server
    started with `argv` (its interpreter and script first)."""
    start = next((i + 1 for i, a in enumerate(argv)
                  if any(Path(a).name == m or a == m for m in MARKERS)), 1)
    args, _ = build_parser().parse_known_args(argv[start:])
    if args.allow_http:
        return "http", f"http://{_local(args.http_address)}:{args.http_port}/v2/health/ready"
    return "grpc", f"{_local(args.grpc_address)}:{args.grpc_port}"


def ready(kind: str, where: str, timeout: float = 4.0) -> bool:
    try:
        if kind == "http":
            with urllib.request.urlopen(where, timeout=timeout) as r:
                return r.status == 200
        import tritonclient.grpc as grpcclient
        return grpcclient.InferenceServerClient(where).is_server_ready(
            client_timeout=timeout)
    except Exception:  # refused, timed out, not ready (503): all unhealthy
        return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    server = cmdline(argv[0]) if argv else find_server()
    if not server:
        print("healthcheck: no shmserve process found", file=sys.stderr)
        return 1
    kind, where = target(server)
    if ready(kind, where):
        return 0
    print(f"healthcheck: not ready at {where}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
