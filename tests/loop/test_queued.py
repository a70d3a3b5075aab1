"""The scheduler's record of a request (scheduling/queued.py) in its loop
(tests/loop/rig.py): the stamps it takes while a request waits stay in the scheduler
and still decide what happens to the request's batch, while the worker gets the
request as the frontend sent it."""

import asyncio
import json
import shutil
from pathlib import Path

from shm.messages.frontend import InferRequest
from tests.loop.rig import DEADLINE_S, ids, run

MODELS = Path(__file__).parents[1] / "models"

TIMESTAMPS = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
              "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]


def test_a_traced_request_is_stamped_in_the_scheduler_not_on_the_wire(tmp_path):
    """With trace rate 2 the second request is traced: only its batch ends loudly (its
    BatchDone is read at once, to write the trace's compute times), both go to the
    worker exactly as sent, and the trace holds the scheduler's QUEUE_START and the
    batch's times in Triton's order."""
    repo = tmp_path / "repo"
    shutil.copytree(MODELS / "nobatch_identity", repo / "nobatch_identity")
    trace_file = tmp_path / "trace.json"
    sent, got = [], []

    async def test(rig):
        for expect_quiet in (True, False):
            fut = rig.send("nobatch_identity")
            n = len(got) + 1
            (worker, batch), = (await rig.batches_sent(n))[n - 1:]
            assert batch.quiet is expect_quiet
            got.append((batch, worker.finish(batch)))
            await asyncio.wait_for(fut, DEADLINE_S)
        sent.extend(r for b, _ in got for r in b.requests)

    run(repo, test, "--trace-config", f"triton,file={trace_file}",
        "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=2",
        "--trace-config", "count=-1")
    assert [ids(b) for b, _ in got] == [[1], [2]]
    # what the worker decoded is the frontend's message, nothing added
    assert all(type(r) is InferRequest and r.start_ns > 0 for r in sent)
    records = json.loads(trace_file.read_text())
    head, *stamps = records
    assert head["model_name"] == "nobatch_identity"
    assert {r["id"] for r in records} == {head["id"]}  # one trace: the second request
    names = [s["timestamps"][0]["name"] for s in stamps]
    ns = {s["timestamps"][0]["name"]: s["timestamps"][0]["ns"] for s in stamps}
    assert names == TIMESTAMPS
    done = got[1][1]
    assert ns["REQUEST_START"] == sent[1].start_ns
    assert ns["REQUEST_START"] <= ns["QUEUE_START"] <= ns["COMPUTE_START"]
    assert (ns["COMPUTE_START"], ns["COMPUTE_END"]) == (done.compute_start_ns,
                                                        done.compute_end_ns)
