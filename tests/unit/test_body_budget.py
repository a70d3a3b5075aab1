"""The arena blocks request bodies may hold (frontend/body_budget.py): counted per
connection and per process from the reservation until the request frees them; past
either budget a body is received into process memory as it arrives, and served alike,
on the native HTTP/1.1 and gRPC transports."""

import os
import struct

import pytest
from tritonclient.grpc import model_config_pb2

from frontend.transport import h2
from frontend.body_budget import BodyBudget
from frontend.dataplane import SchedulerDataPlane
from frontend.http_server import make_http_app
from frontend.types import BODY_IN_ARENA_MIN, ModelView
from shm.arena import Arena
from tests.unit.test_h2 import ARENA_PATHS, FakeArena, Peer, _arena_handlers, run
from tests.unit.test_http1 import (ArenaCore, Flood, Streamer, _serve, check_identity,
                                   connect, infer_request)
from tests.unit.test_http_server import IDENTITY, asgi_call, infer_body

pytestmark = pytest.mark.timeout(60)
MiB = 1 << 20


def test_the_budget_counts_per_connection_and_per_process():
    budget = BodyBudget(limit=3 * MiB, connection_limit=2 * MiB)
    a, b = budget.quota(), budget.quota()
    assert budget.admits(a, 2 * MiB) and not budget.admits(a, 2 * MiB + 1)
    budget.hold(("s", 0), a, 2 * MiB)
    assert not budget.admits(a, 1)  # the connection is at its limit
    assert budget.admits(b, MiB) and not budget.admits(b, MiB + 1)  # the process nearly
    budget.hold(("s", 1), b, MiB)
    assert not budget.admits(b, 1) and not budget.admits(None, 1)
    budget.release(("s", 0))
    budget.release(("s", 0))  # freed twice, or never held: ignored
    budget.release(("other", 7))
    assert (budget.held, a.held, b.held) == (MiB, 0, MiB)
    assert budget.admits(a, 2 * MiB)


@pytest.fixture
def core():
    """SchedulerDataPlane's body_buffer / free_blocks over a real arena of 1 MiB
    chunks."""
    core = SchedulerDataPlane.__new__(SchedulerDataPlane)
    core.arena = Arena(f"shmserve-unittest-{os.getpid()}-bodies", chunk_size=MiB,
                       high_water=0)
    core.bodies = BodyBudget(limit=3 * MiB, connection_limit=2 * MiB)
    yield core
    core.arena.close()


def _allocated(segment):
    return os.stat(f"/dev/shm/{segment}").st_blocks * 512


def test_reservations_are_refused_past_a_budget_and_cost_no_memory(core):
    a, b, c = core.body_quota(), core.body_quota(), core.body_quota()
    view1, block1 = core.body_buffer(MiB, a)  # the warm first chunk
    view2, block2 = core.body_buffer(MiB, a)  # a second, sparse segment
    assert core.body_buffer(1, a) is None  # the connection's 2 MiB are taken
    view3, block3 = core.body_buffer(MiB, b)
    assert core.body_buffer(1, c) is None  # the process's 3 MiB are taken
    assert _allocated(block2[0]) == 0 and _allocated(block3[0]) == 0
    view2[:1] = b"x"  # bytes arrive: pages follow them
    assert _allocated(block2[0]) == 4096
    core.free_blocks([block2])
    assert core.body_buffer(MiB, c) is not None  # room again, for anyone
    assert core.bodies.held == 3 * MiB and a.held == MiB
    core.free_blocks([block1, block3])
    assert (a.held, b.held) == (0, 0)


class BudgetCore(ArenaCore):
    """The HTTP tests' core with SchedulerDataPlane's budgeted body_buffer over a real
    arena; a request's blocks are freed when its result is released, as the real core
    frees them on the final response."""

    body_quota = SchedulerDataPlane.body_quota
    body_buffer = SchedulerDataPlane.body_buffer
    free_blocks = SchedulerDataPlane.free_blocks
    _trim_later = SchedulerDataPlane._trim_later  # free_blocks gives idle segments back
    _trim = None

    def __init__(self, connection_limit):
        super().__init__()
        self.arena = Arena(f"shmserve-unittest-{os.getpid()}-http", chunk_size=MiB)
        self.bodies = BodyBudget(connection_limit=connection_limit)

    async def infer(self, request, decoupled_refusal=""):
        result = await super().infer(request, decoupled_refusal)
        release = result.release

        def free():
            release()
            self.free_blocks(request.arena_blocks)
        result.release = free
        return result


@pytest.mark.parametrize("connection_limit", [MiB, 1000])
def test_http_bodies_past_the_connection_budget_are_received_in_process_memory(
        connection_limit):
    core = BudgetCore(connection_limit)
    n = BODY_IN_ARENA_MIN // 64 + 1
    data, body, headers = infer_body(batch=n)
    config = model_config_pb2.ModelConfig()
    config.CopyFrom(IDENTITY)
    config.max_batch_size = n
    core.models["identity"] = [ModelView("identity", 1, "READY", "", config)]
    serving = _serve(core, Streamer(), Flood())
    port = next(serving)
    try:
        sock, r = connect(port)
        with sock:
            for _ in range(2):  # the same connection again: its block was given back
                request = infer_request(body, headers)
                for i in range(0, len(request), 100_000):
                    sock.sendall(request[i:i + 100_000])
                check_identity(*r.read()[0], data)
        in_arena = connection_limit >= len(body)
        assert core.arena.capacity == (MiB if in_arena else 0)
        assert core.bodies.held == 0 and core.arena.used_bytes() == 0
    finally:
        next(serving, None)
        core.arena.close()


@pytest.mark.parametrize("process_limit", [MiB, 1000])
def test_asgi_bodies_past_the_process_budget_are_received_in_process_memory(process_limit):
    """uvicorn's path (no connection quota): the process's budget alone."""
    core = BudgetCore(MiB)
    core.bodies.limit = process_limit
    n = BODY_IN_ARENA_MIN // 64 + 1
    data, body, headers = infer_body(batch=n)
    config = model_config_pb2.ModelConfig()
    config.CopyFrom(IDENTITY)
    config.max_batch_size = n
    core.models["identity"] = [ModelView("identity", 1, "READY", "", config)]
    try:
        check_identity(*asgi_call(make_http_app(core), "POST",
                                  "/v2/models/identity/infer", body, headers), data)
        assert core.arena.capacity == (MiB if process_limit >= len(body) else 0)
        assert core.bodies.held == 0 and core.arena.used_bytes() == 0
    finally:
        core.arena.close()


class BudgetArena(FakeArena):
    """test_h2's FakeArena, with the body budget in front of it."""

    def __init__(self, budget):
        super().__init__()
        self.budget = budget

    def body_buffer(self, nbytes, quota=None):
        if not self.budget.admits(quota, nbytes):
            return None
        view, block = super().body_buffer(nbytes)
        self.budget.hold(block, quota, nbytes)
        return view, block

    def free_blocks(self, blocks):
        super().free_blocks(blocks)
        for block in blocks:
            self.budget.release(block)


@run
async def test_grpc_messages_past_the_connection_budget_are_received_in_process_memory():
    budget = BodyBudget(connection_limit=400_000)
    arena, seen = BudgetArena(budget), []
    p = Peer(_arena_handlers(seen), arena=arena, arena_paths=ARENA_PATHS)
    p.conn.quota = budget.quota()
    first, second = b"a" * 300_000, b"b" * 300_000
    p.request(1, "/s/Take")  # both messages in flight on the one connection at once
    p.request(3, "/s/Take")
    for sid, message in ((1, first), (3, second)):
        p.send(h2.frame(h2.DATA, 0, sid, struct.pack(">BI", 0, len(message))
                        + message[:100_000]))
    for sid, message in ((1, first), (3, second)):
        p.send(h2.frame(h2.DATA, h2.END_STREAM, sid, message[100_000:]))
    await p.settle()
    # the first holds 300 kB of the connection's 400 kB: the second had no block
    by_body = {bytes(request)[:1]: block for request, block in seen}
    assert by_body[b"a"] is not None and by_body[b"b"] is None
    assert sorted(bytes(r) for r, _ in seen) == [first, second]
    for sid in (1, 3):
        assert p.of(sid, h2.HEADERS)[-1][3]["grpc-status"] == "0"
    assert budget.held == 300_005  # the handler took the block: its request frees it
    arena.free_blocks([by_body[b"a"]])
    assert budget.held == 0 and p.conn.quota.held == 0
