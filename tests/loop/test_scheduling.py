"""Batch formation and the statistics that count it, in the scheduler's loop
(tests/loop/rig.py), for the models e2e tests/e2e/test_scheduling.py and
test_statistics.py serve (tests/models/batch_probe, tests/models_sched/delayed_batch)."""

import asyncio
import shutil
import time
from pathlib import Path

from tests.loop.rig import ids, run

MODELS = Path(__file__).parents[1]


def _repo(tmp_path, *models: str) -> Path:
    for model in models:
        src = MODELS / model
        shutil.copytree(src, tmp_path / src.name)
    return tmp_path


def _stats(reply: dict) -> dict:
    m = reply["model_stats"][0]
    inf = m["inference_stats"]
    return {"execution_count": m["execution_count"], "inference_count": m["inference_count"],
            **{k: v["count"] for k, v in inf.items()},
            "batch_stats": {b["batch_size"]: b["compute_infer"]["count"]
                            for b in m["batch_stats"]}}


def test_concurrent_requests_reach_one_batch_at_the_preferred_size(tmp_path):
    """batch_probe waits up to 2 s for preferred size 4: four requests that arrive
    together go in one batch at once, in their order. (Was e2e
    test_scheduling.py::test_concurrent_requests_reach_one_execute_call[grpc]; [http]
    stays e2e, proving each request gets its own rows back.)"""
    async def test(rig):
        futs = [rig.send("batch_probe") for _ in range(4)]
        (worker, batch), = await rig.batches_sent(1)
        assert ids(batch) == [1, 2, 3, 4]
        worker.finish(batch)
        await asyncio.gather(*futs)
    run(_repo(tmp_path, "models/batch_probe"), test)


def test_batch_respects_max_batch_size(tmp_path):
    """Three requests of three rows: at most 8 rows fit, so no batch holds all
    three; each request runs once, in order. (Was e2e
    test_scheduling.py::test_batch_respects_max_batch_size.)"""
    async def test(rig):
        futs = [rig.send("batch_probe", rows=3) for _ in range(3)]
        seen = []
        while len(seen) < 3:
            await rig.until(lambda: rig.batches or rig.timer.deadline, "a batch or a deadline")
            if not rig.batches:
                rig.timer.fire()  # below the preferred size: it goes at the delay
            (worker, batch), = await rig.batches_sent(1)
            assert sum(r.batch_size for r in batch.requests) <= 8
            seen += ids(batch)
            rig.take_batches()
            worker.finish(batch)
        assert seen == [1, 2, 3]
        await asyncio.gather(*futs)
    run(_repo(tmp_path, "models/batch_probe"), test)


def test_statistics_count_one_batch_exactly_and_a_failed_request_as_a_failure(tmp_path):
    """Rule: execution_count counts executions, inference_count batch items, batch_stats
    executions by batch size; success, queue and compute count successful requests; a
    request the backend fails counts in fail, not in inference_count, while its
    execution still counts. Times: each request of a batch is charged the batch's whole
    compute phases, a request's duration holds its queue and compute times, and
    last_inference is the wall clock in ms. (Was e2e
    test_statistics.py::test_held_batcher_forms_one_batch_and_statistics_count_it_exactly,
    which needed a server of its own held by TRITONSERVER_DELAY_SCHEDULER; that the real
    model's time lands in compute_infer is e2e test_metrics.py's.)"""
    async def test(rig):
        start_ms = time.time() * 1000
        futs = [rig.send("delayed_batch") for _ in range(4)]
        await rig.until(lambda: rig.batches or rig.timer.deadline, "a batch or a deadline")
        if not rig.batches:
            rig.timer.fire()
        (worker, batch), = await rig.batches_sent(1)
        assert len(batch.requests) == 4
        rig.take_batches()
        done = worker.finish(batch)
        await asyncio.gather(*futs)
        reply = await rig.stats("delayed_batch")
        s = _stats(reply)
        assert (s["execution_count"], s["inference_count"], s["batch_stats"]) == (1, 4, {4: 1})
        assert s["success"] == s["queue"] == s["compute_infer"] == 4
        assert s["fail"] == s["cache_hit"] == 0
        m, = reply["model_stats"]
        ns = {k: v["ns"] for k, v in m["inference_stats"].items()}
        infer_ns = done.output_start_ns - done.input_end_ns
        assert infer_ns > 0
        assert ns["compute_infer"] == 4 * infer_ns
        assert ns["compute_input"] == ns["compute_output"] == 0  # the fake's took none
        assert ns["queue"] > 0  # the batch waited for its deadline
        assert ns["success"] >= ns["queue"] + ns["compute_infer"]
        assert start_ms - 1000 <= m["last_inference"] <= time.time() * 1000 + 1000

        for failed in (True, False):
            fut = rig.send("delayed_batch")
            await rig.until(lambda: rig.batches or rig.timer.deadline, "a deadline")
            if not rig.batches:
                rig.timer.fire()
            (worker, batch), = await rig.batches_sent(1)
            rig.take_batches()
            worker.finish(batch, failed=[0] if failed else [])
            assert bool((await fut).error) == failed
        s = _stats(await rig.stats("delayed_batch"))
        assert (s["execution_count"], s["inference_count"]) == (3, 5)
        assert s["batch_stats"] == {1: 2, 4: 1}
        assert (s["success"], s["fail"]) == (5, 1)
        m, = (await rig.stats("delayed_batch"))["model_stats"]
        assert m["inference_stats"]["fail"]["ns"] > 0
    run(_repo(tmp_path, "models_sched/delayed_batch"), test)


def test_a_worker_that_dies_fails_its_batch_and_the_instance_comes_back(tmp_path):
    """A worker killed while it runs a batch: the batch's requests fail with the
    instance's death in the message (manager.instances_lost), the worker is started
    again, and the next request is served by the new one. (The processes' side, a real
    kill -9 and the restart policy, is e2e test_faults.py's.)"""
    async def test(rig):
        first = rig.send("batch_probe", rows=4)  # the preferred size: it goes at once
        (worker, _), = await rig.batches_sent(1)
        rig.take_batches()
        worker.child.signal(9)
        reply = await asyncio.wait_for(first, 10)
        assert reply.error is not None and "SIGKILL" in reply.error.message, reply.error
        await rig.until(lambda: len(rig.workers) == 2, "the worker started again")
        second = rig.send("batch_probe", rows=4)
        (again, batch), = await rig.batches_sent(1)
        assert again is rig.workers[1]
        again.finish(batch)
        assert (await second).error is None
    run(_repo(tmp_path, "models/batch_probe"), test)
