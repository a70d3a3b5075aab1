"""Which idle instance takes the next batch (issue 23 part 3): the one that ran last.

At c=1 a batch's end is quiet: the scheduler reads it first thing on the next
request's wake, so the instance that just ran is idle again when that request is
placed, and it runs it while its process is still warm. Taking turns instead cost each
worker a cold start per request (tests/loop/rig.py: the real scheduler loop, fake
workers)."""

import asyncio
from pathlib import Path

from tests.loop.rig import DEADLINE_S, identity_repo, run


def _repo(tmp_path) -> Path:
    return identity_repo(tmp_path, "pair", count=2)


async def _one(rig, expect_quiet: bool = True) -> str:
    """One request on its own: returns the instance that ran it."""
    fut = rig.send("pair")
    (worker, batch), = await rig.batches_sent(1)
    rig.take_batches()
    assert batch.quiet is expect_quiet
    worker.finish(batch)
    assert (await asyncio.wait_for(fut, DEADLINE_S)).error is None
    return batch.instance


def test_requests_one_at_a_time_stay_on_the_instance_that_ran_last(tmp_path):
    async def test(rig):
        first = await _one(rig)
        for _ in range(5):
            assert await _one(rig) == first, "an idle instance that just ran was passed over"
        # two at once: both instances run; the one that ends last runs the next alone
        a, b = rig.send("pair"), rig.send("pair")
        (wa, ba), (wb, bb) = await rig.batches_sent(2)
        rig.take_batches()
        assert ba.instance != bb.instance
        for worker, batch, fut in ((wb, bb, b), (wa, ba, a)):
            worker.finish(batch)
            await asyncio.wait_for(fut, DEADLINE_S)
        assert await _one(rig) == ba.instance
        # the statistics still count every batch, read before they answer
        stats = (await rig.stats("pair"))["model_stats"][0]
        assert stats["execution_count"] == 9 and stats["inference_count"] == 9
    run(_repo(tmp_path), test)
