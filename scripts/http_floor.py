#!/usr/bin/env python3
"""How much of an HTTP request's cost is uvicorn's and ASGI's: server CPU per request of
HTTP servers that answer POST .../infer with a canned reply and do nothing else, driven
by wrk (64 keep-alive connections, the body of scripts/bench_cclient.py), alternating.

    scripts/http_floor.py --rounds 2 --duration 5

Servers (all on uvloop, one process):
- `uvicorn`: a raw ASGI app (no starlette) under uvicorn with httptools, configured as
  frontend/main.py configures it;
- `raw`: no ASGI: an asyncio Protocol feeding httptools.HttpRequestParser, answering
  from its on_message_complete callback;
- `raw-task`: the same, but each request is answered from an asyncio Task (as a real
  endpoint that awaits the scheduler must be).

A canned server's CPU per request is the floor a Python HTTP frontend built that way
cannot go under here. On the 2-core VM, 2 rounds of 5 s: uvicorn 28.5 / 28.3 us per
request (26k-34k req/s), raw 8.9 / 9.3 us (70k-108k), raw-task 10.9 / 10.4 us (65k-88k).
Also runs as the canned server itself: `--serve MODE PORT`.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

from scheduler.bench.procs import cpu_seconds  # noqa: E402

MODES = ("uvicorn", "raw", "raw-task")
REPLY_JSON = (b'{"model_name":"identity_fp32","model_version":"1","outputs":[{"name":'
              b'"OUTPUT0","datatype":"FP32","shape":[1,16],"parameters":'
              b'{"binary_data_size":64}}]}')
REPLY = REPLY_JSON + bytes(64)


def serve(mode: str, port: int) -> None:
    import asyncio

    import uvloop

    headers = [(b"content-type", b"application/octet-stream"),
               (b"inference-header-content-length", b"%d" % len(REPLY_JSON)),
               (b"content-length", b"%d" % len(REPLY))]
    if mode == "uvicorn":
        import uvicorn

        async def app(scope, receive, send):
            message = await receive()
            while message.get("more_body"):
                message = await receive()
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": REPLY})

        uvicorn.run(app, host="127.0.0.1", port=port, http="httptools", loop="uvloop",
                    lifespan="off", access_log=False, log_level="warning",
                    proxy_headers=False, date_header=False, server_header=False)
        return

    import httptools
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in headers)
    wire = head + b"\r\n" + REPLY

    class Canned(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport
            self.parser = httptools.HttpRequestParser(self)
            self.body = []

        def data_received(self, data):
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                self.transport.close()

        def on_body(self, chunk):
            self.body.append(chunk)

        def on_message_complete(self):
            self.body = []
            if mode == "raw":
                self.transport.write(wire)
            else:
                asyncio.get_running_loop().create_task(self.answer())

        async def answer(self):
            self.transport.write(wire)

    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Canned, "127.0.0.1", port, backlog=1024)
        await server.serve_forever()

    uvloop.run(main())


def measure(mode: str, args, lua: Path) -> dict:
    from bench_cclient import parse_wrk
    from grpc_floor import _wait_port
    server = subprocess.Popen([sys.executable, __file__, "--serve", mode, str(args.port)],
                              cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{args.port}/v2/models/identity_fp32/infer"
    wrk = ["wrk", "-t2", f"-c{args.connections}", "-s", str(lua)]
    try:
        _wait_port(args.port, server)
        subprocess.run([*wrk, "-d1s", url], capture_output=True, check=True)  # warm-up
        c0 = cpu_seconds(server.pid)
        out = subprocess.run([*wrk, f"-d{args.duration}s", "--latency", url],
                             capture_output=True, text=True, check=True).stdout
        c1 = cpu_seconds(server.pid)
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait(30)
    row = parse_wrk(out)
    n = row["requests"]
    return {"mode": mode, "rps": n / args.duration, "failed": row["failed"],
            "p50": row["p50"], "cpu_us": 1e6 * (c1 - c0) / n if n else float("nan")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--serve", nargs=2, metavar=("MODE", "PORT"), help=argparse.SUPPRESS)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--duration", type=int, default=5)
    p.add_argument("--port", type=int, default=28470)
    args = p.parse_args()
    if args.serve:
        return serve(args.serve[0], int(args.serve[1]))
    from bench_cclient import write_inputs
    modes = args.modes.split(",")
    print(f"{'round':>5} {'server':>9} {'req/s':>9} {'p50':>9} {'server CPU us/req':>18}")
    with tempfile.TemporaryDirectory(prefix="http-floor-") as tmp:
        lua = write_inputs(Path(tmp), 16)["lua"]
        for r in range(args.rounds):
            for mode in modes:
                x = measure(mode, args, lua)
                print(f"{r + 1:>5} {mode:>9} {x['rps']:>9.0f} {x['p50']!s:>9} "
                      f"{x['cpu_us']:>18.1f}" + (f"  failed {x['failed']}"
                                                 if x["failed"] else ""), flush=True)


if __name__ == "__main__":
    main()
