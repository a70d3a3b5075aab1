"""A request that runs alone waits at its busy instance's worker (issue 23 part 2).

Under Triton's default scheduler (no dynamic batching) requests run one at a time. Ours
sends the next one to the busy instance's worker as well, one batch deep, so the
instance starts it the moment the running one ends instead of idling while that end
reaches the scheduler and the next batch comes back: at c=4 on the H200 a 16 MiB
CUDA-region request left the instance idle ~100 us of every ~250 (tests/loop/rig.py:
the real scheduler loop and worker pool, fake workers)."""

import asyncio
from pathlib import Path

from tests.loop.rig import DEADLINE_S, identity_repo, ids, run


def _repo(tmp_path, extra: str = "") -> Path:
    return identity_repo(tmp_path, "alone", extra=extra)


def test_the_next_request_reaches_the_worker_while_the_one_before_runs(tmp_path):
    async def test(rig):
        futs = [rig.send("alone") for _ in range(3)]
        # two batches at the worker, the first not finished: the second waits there
        (w1, b1), (w2, b2) = await rig.batches_sent(2)
        await rig.settle()
        assert len(rig.batches) == 2, "more than one batch waited at the instance"
        assert w1 is w2 and b1.instance == b2.instance
        assert [ids(b1), ids(b2)] == [[futs[0].request_id], [futs[1].request_id]]
        # its end sends the third to wait behind the second, which now runs
        w1.finish(b1)
        (_, b3), = (await rig.batches_sent(3))[2:]
        assert ids(b3) == [futs[2].request_id]
        for batch in (b2, b3):
            w1.finish(batch)
        for fut in futs:
            assert (await asyncio.wait_for(fut, DEADLINE_S)).error is None
        stats = (await rig.stats("alone"))["model_stats"][0]
        assert stats["execution_count"] == 3 and stats["inference_count"] == 3
    run(_repo(tmp_path), test)


def test_an_instance_with_an_execute_timeout_gets_one_batch_at_a_time(tmp_path):
    # its watch counts from when a batch is sent, so a batch waiting there would be
    # timed from before it started
    extra = ('parameters { key: "EXECUTE_TIMEOUT_SECS" '
             'value { string_value: "30" } }\n')

    async def test(rig):
        futs = [rig.send("alone") for _ in range(2)]
        (w1, b1), = await rig.batches_sent(1)
        await rig.settle()
        assert len(rig.batches) == 1
        w1.finish(b1)
        (_, b2), = (await rig.batches_sent(2))[1:]
        w1.finish(b2)
        for fut in futs:
            assert (await asyncio.wait_for(fut, DEADLINE_S)).error is None
    run(_repo(tmp_path, extra), test)
