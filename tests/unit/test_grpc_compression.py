"""Compressed gRPC messages on the native transport (frontend/transport/grpc_native.py over
frontend/inflate.py): inflated up to the largest message the server takes, then
RESOURCE_EXHAUSTED (grpc-go's words), a step at a time so that other calls on the
same loop are answered while a bomb inflates; corrupt or trailing input is INTERNAL."""

import asyncio
import gzip
import struct
import time
import zlib

import grpc
import pytest

from frontend import grpc_codec, inflate
from frontend.transport import h2
from scripts.attack_wire import gzip_of_zeros  # built, not deflated: ~0.3 s less
from shm.errors import InferError
from tests.unit.test_h2 import Peer, _echo_handlers, run

pytestmark = pytest.mark.timeout(60)

def compressed(p, sid, path, packed, encoding="gzip", end=True):
    p.request(sid, path, extra=[("grpc-encoding", encoding)], end=False)
    p.send(h2.frame(h2.DATA, h2.END_STREAM if end else 0, sid,
                    struct.pack(">BI", 1, len(packed)) + packed))


def status(p, sid):
    heads = p.of(sid, h2.HEADERS)
    return heads[-1][3].get("grpc-status") if heads else None, \
        heads[-1][3].get("grpc-message") if heads else None


def _handlers():
    handlers = _echo_handlers()

    async def chat(requests, context):  # a message may come as any bytes-like object
        async for r in requests:
            await context.write(bytes(r).upper())

    async def infer(request, context):  # ModelInfer's parse, without a model
        try:
            grpc_codec.parse_infer_request(request)
        except InferError as e:  # says how much of the message was inflated
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"{e.message} ({len(request)} bytes)")
        return b"%d" % len(request)

    handlers["/s/Chat"] = grpc.stream_stream_rpc_method_handler(chat)
    handlers["/s/Infer"] = grpc.unary_unary_rpc_method_handler(infer)
    return handlers


def peer(max_message):
    p = Peer(_handlers())
    p.conn.server.max_message = max_message
    return p


async def answered(p, *sids, timeout=20.0):
    deadline = time.monotonic() + timeout
    while any(status(p, sid)[0] is None for sid in sids):
        assert time.monotonic() < deadline, [status(p, sid) for sid in sids]
        await asyncio.sleep(0.001)


@run
async def test_gzip_and_deflate_messages_are_inflated():
    p = peer(1 << 20)
    compressed(p, 1, "/s/Echo", gzip.compress(b"hello"))
    compressed(p, 3, "/s/Echo", zlib.compress(b"world"), "deflate")
    compressed(p, 5, "/s/Echo", b"")  # grpc-core: an empty input is an empty message
    await answered(p, 1, 3, 5)
    assert status(p, 1)[0] == status(p, 3)[0] == status(p, 5)[0] == "0"
    assert p.body(1) == b"\0\0\0\0\x05hello" and p.body(3) == b"\0\0\0\0\x05world"
    assert p.body(5) == b"\0\0\0\0\0"


@run
async def test_exactly_the_limit_is_taken_and_one_byte_more_refused():
    p = peer(1000)
    compressed(p, 1, "/s/Echo", gzip.compress(b"x" * 1000))
    compressed(p, 3, "/s/Echo", gzip.compress(b"x" * 1001))
    await answered(p, 1, 3)
    assert status(p, 1)[0] == "0"
    assert status(p, 3) == ("8", "grpc: received message after decompression larger "
                                 "than max 1000")


ABC = gzip.compress(b"abc", mtime=0)


@pytest.mark.parametrize("packed,why", [
    (ABC + b"junk", "input left after the compressed stream"),
    (ABC * 2, "input left after the compressed stream"),
    (ABC[:-4], "incomplete or truncated stream"),
    (b"not gzip at all", "incorrect header check"),
], ids=["trailing-junk", "two-members", "cut", "not-gzip"])
def test_corrupt_or_trailing_input_is_internal(packed, why):
    # grpc-core's zlib_decompress: one stream, all input consumed, else an error
    @run
    async def check():
        p = peer(1 << 20)
        compressed(p, 1, "/s/Echo", packed)
        await answered(p, 1)
        code, message = status(p, 1)
        assert code == "13" and why in message
    check()


@run
async def test_a_bomb_costs_the_cap_and_holds_no_other_call_up():
    """16 MiB of zeros in 16 KiB of gzip, against a 12 MiB cap: refused once 12 MiB
    are out (not 16, nor the bomb's claim), inflated in steps of inflate.STEP (three
    steps or more), and a call sent after it is answered while it inflates."""
    cap = 12 << 20
    bomb = gzip_of_zeros(16 << 20)
    assert cap >= 3 * inflate.STEP
    assert len(bomb) < 64 << 10
    p = peer(cap)
    start = time.process_time()
    compressed(p, 1, "/s/Echo", bomb)
    p.request(3, "/s/Echo", b"after")
    await answered(p, 1, 3)
    assert status(p, 1) == ("8", f"grpc: received message after decompression larger "
                                 f"than max {cap}")
    order = [f[2] for f in p.read() if f[0] == h2.HEADERS and f[1] & h2.END_STREAM]
    assert order.index(3) < order.index(1), "the echo waited for the bomb"
    assert p.body(3) == b"\0\0\0\0\x05after"
    # a bound on CPU, generous: 12 MiB of inflate is ~0.05 s here; a GiB-sized
    # bomb's claim would be more
    assert time.process_time() - start < 5.0


@run
async def test_a_message_malformed_from_its_first_bytes_stops_inflating_there():
    """Gzipped zeros (the attack probe sent 1 MiB of them: 1 GiB) under the 2 GiB
    limit: a ModelInferRequest beginning with field number 0 is refused whatever
    follows, so the inflation stops after its first step and the request is refused
    then; a valid beginning goes on inflating (up to the limit)."""
    p = peer(2**31 - 1)
    p.conn.server.message_checks = {"/s/Infer": grpc_codec.malformed_prefix}
    compressed(p, 1, "/s/Infer", gzip_of_zeros(64 << 20))
    valid = b"\x0a\x01m" + b"\x3a\x80\x80\x80\x02" + bytes(4 << 20)  # 4 MiB raw input
    # level 1: deflating 4 MiB at gzip's default level 9 costs ~3x the CPU
    compressed(p, 3, "/s/Infer", gzip.compress(valid + b"\x00", 1))  # field 0 at the end
    compressed(p, 5, "/s/Infer", gzip.compress(valid, 1))
    await answered(p, 1, 3, 5)
    assert status(p, 1) == ("3", "failed to parse the ModelInferRequest message "
                                 f"({inflate.STEP} bytes)")
    assert status(p, 3) == ("3", "failed to parse the ModelInferRequest message "
                                 f"({len(valid) + 1} bytes)")
    assert status(p, 5)[0] == "0" and p.body(5)[5:] == b"%d" % len(valid)


@run
async def test_a_bomb_in_a_stream_ends_the_stream_with_resource_exhausted():
    p = peer(1 << 20)
    p.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1,
                    p.headers_block("/s/Chat", [("grpc-encoding", "gzip")])))
    for packed in (gzip.compress(b"ab"), gzip_of_zeros(4 << 20)):
        p.send(h2.frame(h2.DATA, 0, 1, struct.pack(">BI", 1, len(packed)) + packed))
    p.send(h2.frame(h2.DATA, h2.END_STREAM, 1, b""))
    await answered(p, 1)
    assert p.body(1) == b"\0\0\0\0\x02AB"
    assert status(p, 1)[0] == "8"


def test_the_http_dialect_takes_members_and_ignores_what_follows_deflate():
    assert bytes(inflate.inflate(gzip.compress(b"ab") + gzip.compress(b"cd"), "gzip",
                                 10, http=True)) == b"abcd"
    assert bytes(inflate.inflate(zlib.compress(b"ab") + b"junk", "deflate", 10,
                                 http=True)) == b"ab"
    with pytest.raises(zlib.error, match="gzip members"):
        inflate.inflate(gzip.compress(b"") * (inflate.GZIP_MEMBERS_MAX + 1), "gzip", 10,
                        http=True)
    with pytest.raises(inflate.TooLarge):
        inflate.inflate(gzip.compress(b"a" * 11), "gzip", 10, http=True)


def test_steps_inflate_no_more_than_asked():
    inf = inflate.Inflater(gzip_of_zeros(10 << 20), "gzip", 1 << 30, http=False)
    assert inf.step(1 << 20) is False and len(inf.out) == 1 << 20
    while not inf.step(1 << 20):
        assert len(inf.out) % (1 << 20) == 0
    assert len(inf.result()) == 10 << 20
