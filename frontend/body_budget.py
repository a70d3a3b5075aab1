"""How much of the frontend's arena request bodies may hold: per connection and per
process.

A large body (HTTP Content-Length, a gRPC message's length prefix) is received straight
into an arena block reserved on the word of its announced size. The block's pages cost
memory only as bytes are written into them (arena segments beyond the first chunk are
sparse), but the announcement alone still makes the arena grow. So the blocks that
bodies hold, from the reservation until the request ends and frees them, are counted
against two budgets: `CONNECTION_MAX` per connection (one body of the largest size the
arena path takes; a gRPC connection multiplexes many) and `PROCESS_MAX` per frontend
process. A body that would pass either is not refused: it is received into process
memory as its bytes arrive, as every body smaller than BODY_IN_ARENA_MIN is, and
copied into the arena once whole. That is what grpc-core and Triton's HTTP server do
with every body: memory follows the bytes received, never the size announced, and a
client sees no error for it (grpc-core's resource quota cancels streams with
ENHANCE_YOUR_CALM "Buffers full" only once memory itself runs short). The way round
costs the frontend about what the arena path does: a 16 MiB gRPC message received in
16 KiB frames took 13-16 ms either way (in-process, the copy into the arena included).
"""

from __future__ import annotations

CONNECTION_MAX = 64 << 20  # Triton's default HTTP input limit, and ARENA_BODY_MAX
PROCESS_MAX = 1 << 30  # 16 connections at their limit


class BodyQuota:
    """The arena bytes one connection's request bodies hold."""

    __slots__ = ("limit", "held")

    def __init__(self, limit: int = CONNECTION_MAX):
        self.limit = limit
        self.held = 0


class BodyBudget:
    """The arena bytes all the request bodies of one frontend process hold, and which
    connection holds each block."""

    def __init__(self, limit: int = PROCESS_MAX, connection_limit: int = CONNECTION_MAX):
        self.limit = limit
        self.connection_limit = connection_limit
        self.held = 0
        self.blocks: dict[tuple[str, int], tuple[BodyQuota | None, int]] = {}

    def quota(self) -> BodyQuota:
        """A new connection's share."""
        return BodyQuota(self.connection_limit)

    def admits(self, quota: BodyQuota | None, nbytes: int) -> bool:
        """Whether a body of `nbytes` may have an arena block now."""
        if self.held + nbytes > self.limit:
            return False
        return quota is None or quota.held + nbytes <= quota.limit

    def hold(self, block: tuple[str, int], quota: BodyQuota | None, nbytes: int) -> None:
        self.blocks[block] = (quota, nbytes)
        self.held += nbytes
        if quota is not None:
            quota.held += nbytes

    def release(self, block: tuple[str, int]) -> None:
        """`block` was freed (a block not held for a body is ignored)."""
        entry = self.blocks.pop(block, None)
        if entry is not None:
            quota, nbytes = entry
            self.held -= nbytes
            if quota is not None:
                quota.held -= nbytes
