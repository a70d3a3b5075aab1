"""Batches whose requests use client regions end quietly (issue 23 part 2): their
BatchDone waits for the loop's next wake like any other, and the one call that waits
for it, an unregister of a region in use, is still answered as soon as the last batch
using the region ends (tests/loop/rig.py: the real scheduler loop, fake workers)."""

import asyncio
import os
import shutil
import uuid
from pathlib import Path

import pytest

from shm.arena import SHM_DIR
from shm.messages.frontend import InferRequest, RequestedOutput
from shm.messages.regions import SYSTEM, RegionOp, RegionRequest
from shm.tensor import TensorRef
from tests.loop.rig import DEADLINE_S, run

MODELS = Path(__file__).parents[1]


@pytest.fixture
def key():
    """A client's system shm object of 4 KiB."""
    name = f"cudacpu-test-{uuid.uuid4().hex[:12]}"
    with open(os.path.join(SHM_DIR, name), "wb") as f:
        f.truncate(4096)
    yield "/" + name
    os.unlink(os.path.join(SHM_DIR, name))


def _repo(tmp_path) -> Path:
    shutil.copytree(MODELS / "models" / "nobatch_identity", tmp_path / "nobatch_identity")
    return tmp_path


def _call(rig, op: RegionOp, name: str, key: str = "") -> asyncio.Future:
    fe = rig.frontend
    cid = next(rig._ids)
    fut = fe.expect(cid)
    fe.outbox.send(fe.scheduler, RegionRequest(cid, fe.address, op, SYSTEM, name, key,
                                               byte_size=4096 if key else 0))
    return fut


def _send(rig, region: str) -> asyncio.Future:
    """A request whose input and output lie in `region`, as a frontend sends it."""
    rid = next(rig._ids)
    fe = rig.frontend
    fut = fe.expect(rid)
    ref = TensorRef("INPUT0", "INT32", [2, 2], segment=region, nbytes=16, region=-1)
    out = TensorRef("OUTPUT0", "INT32", [2, 2], segment=region, offset=64, nbytes=16,
                    region=-1)
    fe.outbox.send(fe.scheduler, InferRequest(
        rid, fe.address, "nobatch_identity", 0, [ref],
        outputs=[RequestedOutput("OUTPUT0", target=out)], start_ns=rig.clock()))
    return fut


def test_region_batches_end_quietly_and_an_unregister_waits_for_the_last(tmp_path, key):
    async def test(rig):
        reply = await asyncio.wait_for(_call(rig, RegionOp.REGISTER, "r", key), DEADLINE_S)
        assert reply.error is None
        # c=1: each batch ends quietly; the next request's wake reads its end
        for i in range(3):
            fut = _send(rig, "r")
            (worker, batch), = await rig.batches_sent(1)
            rig.take_batches()
            assert batch.quiet, "a batch using a client region woke the loop at its end"
            assert batch.requests[0].inputs[0].region > 0  # resolved
            worker.finish(batch)
            assert (await asyncio.wait_for(fut, DEADLINE_S)).error is None
        # one in flight when the client unregisters: the call waits for it, and the
        # batch's quiet end, now watched for, answers the call
        fut = _send(rig, "r")
        (worker, batch), = await rig.batches_sent(1)
        rig.take_batches()
        assert batch.quiet
        gone = _call(rig, RegionOp.UNREGISTER, "r")
        await rig.settle()
        assert not gone.done(), "unregistered while a request still used the region"
        assert rig.server.regions.draining
        worker.finish(batch)
        assert (await asyncio.wait_for(fut, DEADLINE_S)).error is None
        reply = await asyncio.wait_for(gone, DEADLINE_S)
        assert reply.error is None
        assert not rig.server.regions.draining and not rig.server.regions.users
        # a name registered again is a new registration (a new uid)
        reply = await asyncio.wait_for(_call(rig, RegionOp.REGISTER, "r", key), DEADLINE_S)
        assert reply.error is None
        fut = _send(rig, "r")
        (worker, again), = await rig.batches_sent(1)
        assert again.requests[0].inputs[0].region != batch.requests[0].inputs[0].region
        worker.finish(again)
        await asyncio.wait_for(fut, DEADLINE_S)
    run(_repo(tmp_path), test, "--allow-client-shm", "true")


def test_unregister_of_an_idle_region_answers_at_once_after_quiet_ends(tmp_path, key):
    """The quiet ends not read yet are read before the call (any call drains them
    first), so a region whose requests all finished is not waited for."""
    async def test(rig):
        reply = await asyncio.wait_for(_call(rig, RegionOp.REGISTER, "r", key), DEADLINE_S)
        assert reply.error is None
        rig.auto_finish = True
        for _ in range(2):
            assert (await asyncio.wait_for(_send(rig, "r"), DEADLINE_S)).error is None
        reply = await asyncio.wait_for(_call(rig, RegionOp.UNREGISTER, "r"), DEADLINE_S)
        assert reply.error is None
        assert not rig.server.regions.users and not rig.server.regions.draining
    run(_repo(tmp_path), test, "--allow-client-shm", "true")
