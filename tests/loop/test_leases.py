"""Leases over the scheduler's real loop (tests/loop/rig.py): the test plays the frontend
(frontend/dataplane.py's side of the protocol, shm/messages/leases.py). With the real
worker: the lease comes on an answer, a request sent under it runs at the worker and
counts in the statistics, a request sent to the scheduler takes the lease back, and one
sent under the ended lease is handed on and still answered. With fake workers: a
worker's death or turning trace on ends a lease."""

import asyncio
import time
from pathlib import Path

import scheduler.server
from scheduler.scheduling.dynamic_scheduler import LEASE_AFTER
from shm.messages.frontend import InferRequest
from shm.messages.leases import LEASE_DEPTH, LeaseEnded
from shm.messages.repository import RepositoryOp, RepositoryRequest
from shm.messages.settings import TraceSettingRequest
from shm.messages.worker import BatchDone, ExecuteBatch, StopWorker, done_address
from shm.tensor import TensorRef
from tests.loop.rig import DEADLINE_S, identity_repo, run


def _repo(tmp_path) -> Path:
    return identity_repo(tmp_path, "alone")


async def _one_at_a_time(rig, n: int) -> list:
    """`n` requests to the scheduler, each sent once the one before was answered and
    its batch's end had reached the scheduler. (The worker answers before it tells the
    scheduler, so a request sent at once may find the batch still running there, and
    that request then starts the streak again: the test fixes the order.)"""
    replies = []
    executions = (await rig.stats("alone"))["model_stats"][0]["execution_count"]
    for _ in range(n):
        reply = await asyncio.wait_for(rig.send("alone"), DEADLINE_S)
        assert reply.error is None, reply.error
        replies.append(reply)
        executions += 1
        assert (await _executions(rig, executions))["execution_count"] == executions
    return replies


def _direct(rig, lease: tuple[int, str, str, int], payload: bytes) -> asyncio.Future:
    """A request sent under `lease` straight to its worker, as the frontend sends it."""
    lease_id, instance, address, _ = lease
    fe = rig.frontend
    rid = next(rig._ids)
    fut = fe.expect(rid)
    req = InferRequest(rid, fe.address, "alone", 1,
                       [TensorRef("INPUT0", "FP32", [1, len(payload) // 4], data=payload)],
                       start_ns=rig.clock())
    fe.outbox.send(address, ExecuteBatch(0, instance, [req], quiet=True, lease=lease_id,
                                         direct=True))
    fut.request_id = rid
    return fut


async def _executions(rig, n: int) -> dict:
    """The model's statistics once they count `n` executions (what ran under a lease
    is counted when the scheduler reads the quiet inbox: a moment after the answer)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        stats = (await rig.stats("alone"))["model_stats"][0]
        if stats["execution_count"] >= n or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.001)


def test_a_frontend_sends_under_its_lease_until_the_scheduler_takes_it_back(tmp_path,
                                                                          monkeypatch):
    # the statistics call itself reads the quiet inbox first (not the timer, below)
    monkeypatch.setattr(scheduler.server, "LEASE_READ_S", 10 * DEADLINE_S)

    async def test(rig):
        fe = rig.frontend
        replies = await _one_at_a_time(rig, LEASE_AFTER)
        assert [r.lease for r in replies[:-1]] == [None] * (LEASE_AFTER - 1)
        lease = replies[-1].lease
        assert lease is not None, "no lease after LEASE_AFTER requests found it idle"
        worker = rig.workers[0].worker
        assert lease[2] == worker.address and lease[1] in worker.instances
        slot = next(s for s in rig.server.callbacks.lent_slots)
        assert (slot.key, slot.lease, slot.lessee) == (lease[1], lease[0], fe.address)

        # under the lease: answered by the worker, counted by the scheduler
        payload = bytes(range(16))
        reply = await asyncio.wait_for(_direct(rig, lease, payload), DEADLINE_S)
        assert reply.error is None and reply.lease is None
        assert reply.outputs[0].data == payload
        stats = await _executions(rig, LEASE_AFTER + 1)
        assert (stats["execution_count"], stats["inference_count"]) == \
            (LEASE_AFTER + 1, LEASE_AFTER + 1)
        assert stats["inference_stats"]["success"]["count"] == LEASE_AFTER + 1
        assert slot.lease == lease[0], "a request sent under the lease ended it"

        # the model runs each request alone on its one instance: the lease is deep,
        # and a request of the lessee's to the scheduler goes on under it
        assert lease[3] == LEASE_DEPTH
        reply = await asyncio.wait_for(rig.send("alone"), DEADLINE_S)
        assert reply.error is None and reply.lease is None and not fe.leases_ended
        stats = await _executions(rig, LEASE_AFTER + 2)
        assert stats["execution_count"] == LEASE_AFTER + 2 and slot.lease == lease[0]

        # one the scheduler must see (a priority) takes the lease back; it runs once
        # the lease is over
        reply = await asyncio.wait_for(rig.send("alone", priority=1), DEADLINE_S)
        assert reply.error is None and reply.lease is None
        assert fe.leases_ended == [LeaseEnded(lease[1], lease[0])]
        assert slot.lease == 0 and not rig.server.callbacks.lent_slots

        # under the ended lease (the frontend had not heard yet): handed on, answered
        payload = bytes(range(16, 32))
        sent = _direct(rig, lease, payload)
        reply = await asyncio.wait_for(sent, DEADLINE_S)
        assert reply.error is None and reply.outputs[0].data == payload
        assert fe.leases_ended[1:] == [LeaseEnded(lease[1], lease[0],
                                                  request=sent.request_id)]
        stats = await _executions(rig, LEASE_AFTER + 4)
        assert (stats["execution_count"], stats["inference_count"]) == \
            (LEASE_AFTER + 4, LEASE_AFTER + 4)

    run(_repo(tmp_path), test, real_workers=True)


async def _lend(rig):
    """Lend the fake worker's instance to the frontend: its granting batch."""
    rig.auto_finish = True
    await _one_at_a_time(rig, LEASE_AFTER)
    worker, batch = rig.batches[-1]
    assert batch.lease and all(b.lease == 0 for _, b in rig.batches[:-1])
    return worker, batch


def _direct_batch_ended(rig, worker, batch) -> None:
    """The fake worker says a batch sent under `batch`'s lease ended, as the real one
    does: in the scheduler's quiet inbox, which wakes nobody by itself."""
    now = rig.clock()
    worker.outbox.send(done_address(worker.scheduler), BatchDone(
        0, batch.instance, now, now, now, now, direct=[(now, 1)]))
    worker.outbox.uncork()


def test_a_worker_that_dies_while_lent_ends_the_lease_as_lost(tmp_path):
    async def test(rig):
        worker, batch = await _lend(rig)
        worker.child.signal(9)
        fe = rig.frontend
        await rig.until(lambda: fe.leases_ended, "the frontend to hear of the loss")
        ended, = fe.leases_ended
        assert (ended.instance, ended.lease, ended.lost) == (batch.instance, batch.lease,
                                                             True)
        assert "alone" in ended.reason
        assert not rig.server.callbacks.lent_slots
    run(_repo(tmp_path), test)


def test_turning_trace_on_takes_every_lease_back(tmp_path):
    async def test(rig):
        worker, batch = await _lend(rig)
        fe = rig.frontend
        cid = next(rig._ids)
        fut = fe.expect(cid)
        fe.outbox.send(fe.scheduler, TraceSettingRequest(
            cid, fe.address, update={"trace_level": ["TIMESTAMPS"]}))
        assert not (await asyncio.wait_for(fut, DEADLINE_S)).error
        await rig.until(lambda: rig.end_leases, "EndLease")
        (to, end), = rig.end_leases
        assert to is worker and (end.instance, end.lease) == (batch.instance, batch.lease)
    run(_repo(tmp_path), test, "--trace-config", f"triton,file={tmp_path / 'trace.json'}",
        "--trace-config", "level=OFF")


def test_while_lent_the_loop_reads_the_ends_of_direct_batches_unwoken(tmp_path):
    """A batch sent under a lease ends in the quiet inbox, which wakes nobody: the loop
    reads it within LEASE_READ_S all the same, with no other message to wake it."""
    async def test(rig):
        worker, batch = await _lend(rig)
        sched = rig.server.manager.by_instance[batch.instance]
        executions = sched.stats.execution_count
        _direct_batch_ended(rig, worker, batch)
        await rig.until(lambda: sched.stats.execution_count == executions + 1,
                        "the direct batch counted")
        assert sched.stats.success_count == executions + 1
    run(_repo(tmp_path), test)


def test_an_idle_loop_with_a_lease_out_stops_reading_until_an_end_wakes_it(tmp_path):
    """A read that finds no end of a batch sent under a lease stops the reads (an idle
    server with a lease out sleeps); the quiet inbox is watched meanwhile, so the next
    such end wakes the loop, which counts it and reads on."""
    async def test(rig):
        worker, batch = await _lend(rig)
        server = rig.server
        await rig.until(lambda: server._lease_quiet and server._lease_reads is None,
                        "the reads to stop")
        assert server.done_inbox._watching
        sched = server.manager.by_instance[batch.instance]
        executions, woken = sched.stats.execution_count, server.wakes["quiet inbox wake"]
        _direct_batch_ended(rig, worker, batch)
        await rig.until(lambda: sched.stats.execution_count == executions + 1,
                        "the direct batch counted")
        assert server.wakes["quiet inbox wake"] == woken + 1
        assert server._lease_reads is not None and not server.done_inbox._watching
    run(_repo(tmp_path), test)


def test_unloading_a_lent_model_ends_its_lease_everywhere(tmp_path):
    async def test(rig):
        replies = await _one_at_a_time(rig, LEASE_AFTER)
        lease = replies[-1].lease
        assert lease is not None and rig.server.callbacks.lent_slots
        fe = rig.frontend
        cid = next(rig._ids)
        fut = fe.expect(cid)
        fe.outbox.send(fe.scheduler, RepositoryRequest(cid, fe.address, RepositoryOp.UNLOAD,
                                                       "alone"))
        assert not (await asyncio.wait_for(fut, DEADLINE_S)).error
        await rig.until(lambda: fe.leases_ended, "the frontend to hear the lease ended")
        assert fe.leases_ended == [LeaseEnded(lease[1], lease[0])]
        # the loop stops reading the quiet inbox for it
        await rig.until(lambda: not rig.server.callbacks.lent_slots, "the lent slot gone")
    run(_repo(tmp_path), test, "--model-control-mode", "explicit", "--load-model", "alone",
        real_workers=True)


def test_a_worker_told_to_stop_hands_on_a_request_it_had_not_read(tmp_path):
    """A request its frontend sent under the lease waits unread when the worker is told
    to stop (the frontend had not heard the lease end; the scheduler stopped the
    worker first): the worker hands it on to the scheduler, which answers it, rather
    than let it die unread with the process."""
    async def test(rig):
        replies = await _one_at_a_time(rig, LEASE_AFTER)
        lease = replies[-1].lease
        assert lease is not None
        fe = rig.frontend
        fe.outbox.send(lease[2], StopWorker())  # one connection: read in this order
        sent = _direct(rig, lease, bytes(range(16)))
        rid = sent.request_id
        reply = await asyncio.wait_for(sent, DEADLINE_S)
        if reply.error is None:  # run on the instance started again
            assert reply.outputs[0].data == bytes(range(16))
        else:  # or failed as lost with the stopped one
            assert "alone" in reply.error.message, reply.error
        # the lease still held: its end, then the hand-on's (the frontend's data plane
        # counts the second as "handed on", so the worker's stop does not fail it)
        await rig.until(lambda: len(fe.leases_ended) >= 2, "both ends of the lease")
        assert fe.leases_ended == [LeaseEnded(lease[1], lease[0]),
                                   LeaseEnded(lease[1], lease[0], request=rid)]
    run(_repo(tmp_path), test, real_workers=True)
