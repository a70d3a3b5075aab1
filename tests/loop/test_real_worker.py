"""The scheduler's loop with workers/main.py's Worker itself on a thread, both over
the in-memory transport (tests/loop/rig.py's RealWorker): a python model is loaded,
batched and run as in the processes, in one process and in milliseconds."""

import asyncio
import shutil
import time
from pathlib import Path

import numpy as np

from shm.arena import SegmentCache
from shm.messages.results import ReleaseBlocks
from tests.loop.rig import DEADLINE_S, run

MODELS = Path(__file__).parents[1] / "models"


def _values(ref, segments: SegmentCache) -> np.ndarray:
    dtype = {"FP32": np.float32, "INT32": np.int32}[ref.datatype]
    raw = ref.data if ref.data is not None else \
        bytes(segments.view(ref.segment, ref.offset, ref.nbytes))
    return np.frombuffer(raw, dtype=dtype).reshape(ref.shape)


def test_a_real_worker_runs_a_python_model_on_the_batches_the_loop_forms(tmp_path):
    """Four requests that come together reach batch_probe's execute() as one call of
    four (its REQUESTS_IN_CALL), each gets its rows back from the worker's arena (80 KB,
    past the inline limit), the blocks are released, and the statistics count one
    execution of four. (The scheduler does not check shapes; frontends do.)"""
    shutil.copytree(MODELS / "batch_probe", tmp_path / "batch_probe")
    segments = SegmentCache()

    async def test(rig):
        assert len(rig.workers) == 1 and rig.workers[0].worker is not None
        futs = [rig.send("batch_probe", cols=20_000) for _ in range(4)]
        replies = await asyncio.wait_for(asyncio.gather(*futs), DEADLINE_S)
        fe = rig.frontend
        for fut, reply in zip(futs, replies):
            assert reply.error is None, reply.error
            out = {ref.name: ref for ref in reply.outputs}
            assert _values(out["REQUESTS_IN_CALL"], segments).tolist() == [[4]]
            assert out["OUTPUT0"].segment, "80 KB lies in the arena"
            assert _values(out["OUTPUT0"], segments).shape == (1, 20_000)
            fe.outbox.send(reply.owner, ReleaseBlocks(fe.address, [(out["OUTPUT0"].segment,
                                                        out["OUTPUT0"].offset)]))
        # the worker answers each request as soon as its outputs are written and
        # tells the scheduler after the batch: the count may lag the answers a moment
        deadline = time.monotonic() + DEADLINE_S
        while True:
            stats = (await rig.stats("batch_probe"))["model_stats"][0]
            if stats["execution_count"] or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.001)
        assert (stats["execution_count"], stats["inference_count"]) == (1, 4)
        worker = rig.workers[0].worker
        await rig.until(lambda: worker.arena.used_bytes() == 0, "the blocks released")

    run(tmp_path, test, real_workers=True)
