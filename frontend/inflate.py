"""Decompression of request bodies (HTTP Content-Encoding) and gRPC messages
(grpc-encoding), bounded in size and done a step at a time.

A few KiB of gzip can stand for GiBs: the output is capped (the limit a raw body or
message of the same protocol has) and inflated with zlib's `max_length`, so a bomb
costs at most the cap, never its own claim. The async form inflates STEP bytes, then
lets the event loop serve others, so one request never holds a frontend for more
than a step (~5-20 ms here) however far it inflates.

Two dialects: HTTP takes gzip members one after another, as gzip(1) and Python's
gzip module do (at most GZIP_MEMBERS_MAX: each costs a decompressor), and ignores
what follows a deflate stream, as Triton does; gRPC takes exactly one stream, and
input left after it is an error, as grpc-core's zlib_decompress has it.
"""

from __future__ import annotations

import asyncio
import zlib

STEP = 4 << 20  # output bytes per step of the async form
_INPUT = 64 << 10  # input bytes fed at a time (zlib copies what it leaves unconsumed)
GZIP_MEMBERS_MAX = 64
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class TooLarge(Exception):
    """The output passed the limit (nothing past limit + 1 bytes was inflated)."""


class Inflater:
    """Inflates `data` (gzip or deflate) into at most `limit` bytes, `step()` by step.

    `http`: HTTP's rules (gzip members may follow one another; what follows a
    deflate stream is ignored); else gRPC's (one stream, no input after it). An empty
    input is an empty output (grpc-core's rule; an empty HTTP body has nothing to
    inflate either). Raises zlib.error for input that is not the encoding's, and
    TooLarge past the limit."""

    __slots__ = ("view", "pos", "wbits", "limit", "after", "count", "d", "out")

    def __init__(self, data, encoding: str, limit: int, http: bool):
        self.view = memoryview(data).cast("B")
        self.pos = 0
        self.wbits = _WBITS[encoding]
        self.limit = limit
        # what input after the end of a stream is: another gzip member, nothing to
        # read, or an error
        self.after = ("member" if encoding == "gzip" else "ignored") if http else "error"
        self.count = 0
        self.out = bytearray()
        self.d = None
        if len(self.view):
            self._begin()

    def _begin(self) -> None:
        self.count += 1
        if self.count > GZIP_MEMBERS_MAX:
            raise zlib.error(f"more than {GZIP_MEMBERS_MAX} gzip members")
        self.d = zlib.decompressobj(self.wbits)

    def step(self, budget: int = STEP) -> bool:
        """Inflate up to `budget` more bytes; True once the input is all inflated."""
        out = self.out
        while self.d is not None:
            d = self.d
            if d.eof:
                left = len(d.unused_data) + len(self.view) - self.pos
                if not left or self.after == "ignored":
                    self.d = None
                elif self.after == "error":
                    raise zlib.error("input left after the compressed stream")
                else:
                    self.pos -= len(d.unused_data)  # the next member starts there
                    self._begin()
                continue
            want = min(budget, self.limit + 1 - len(out))
            if d.unconsumed_tail:
                chunk = d.decompress(d.unconsumed_tail, want)
            elif self.pos < len(self.view):
                piece = self.view[self.pos:self.pos + _INPUT]
                self.pos += len(piece)
                chunk = d.decompress(piece, want)
            else:
                raise zlib.error("incomplete or truncated stream")
            out += chunk
            if len(out) > self.limit:
                raise TooLarge(self.limit)
            budget -= len(chunk)
            if budget <= 0:
                return False
        return True

    def result(self) -> memoryview:
        """The output, without a copy (a view of the buffer it was inflated into)."""
        return memoryview(self.out)


def inflate(data, encoding: str, limit: int, http: bool) -> memoryview:
    """All of it at once (for input known to be small, and for tests)."""
    inf = Inflater(data, encoding, limit, http)
    while not inf.step():
        pass
    return inf.result()


async def inflate_async(data, encoding: str, limit: int, http: bool,
                        check=None) -> memoryview:
    """STEP bytes at a time, the event loop serving others in between. `check(out)`,
    after each step: True when what came out so far is bad however it goes on (then
    that is the result: its reader refuses it without the rest being inflated)."""
    inf = Inflater(data, encoding, limit, http)
    while not inf.step():
        if check is not None and check(inf.out):
            break
        await asyncio.sleep(0)
    return inf.result()
