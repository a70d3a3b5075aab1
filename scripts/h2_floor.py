"""A canned unary gRPC server on the frontend's own HTTP/2 layer (transport/h2.py) with
no gRPC layer above it, for scripts/grpc_floor.py's `h2-raw` mode: what one unary RPC
costs the transport alone, beside grpc.aio's floor and the full native gRPC frontend
(`shmserve` mode). Each stream is answered when the request ends, with the reply
registered for its method; the request itself is not parsed.
"""

from __future__ import annotations

import asyncio
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from frontend.transport import h2  # noqa: E402
from frontend.transport.grpc_native import OK_TRAILERS, RESPONSE_HEADERS, STATUS_HEADERS, \
    status_block  # noqa: E402


class CannedConnection(h2.H2Connection):
    """One client connection; `replies` maps a method name to its serialized reply."""

    def __init__(self, replies: dict[str, bytes]):
        super().__init__()
        self.replies = replies

    def stream_opened(self, stream, headers, end_stream) -> None:
        for name, value in headers:
            if name == b":path":
                stream.app = self.replies.get(value.decode().rsplit("/", 1)[-1])

    def stream_ended(self, stream) -> None:
        reply = stream.app
        if reply is None:  # UNIMPLEMENTED, trailers only
            self.send_trailers(stream, STATUS_HEADERS + status_block(12, "Method not found!"))
            return
        self.send_headers(stream, RESPONSE_HEADERS)
        self.send_data(stream, struct.pack(">BI", 0, len(reply)) + reply)
        self.send_trailers(stream, OK_TRAILERS)


def serve(port: int, replies: dict[str, bytes]) -> None:
    import uvloop

    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: CannedConnection(replies), "127.0.0.1",
                                          port)
        async with server:
            await server.serve_forever()

    uvloop.run(main())
