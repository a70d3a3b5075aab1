"""Ensemble scheduling in the scheduler's loop (tests/loop/rig.py), for the ensembles of
tests/models_ensemble: which steps run when, what a failing step does to the request,
and how the statistics count an ensemble and its steps. The fake workers answer a
step with its input under each output name, so the steps after it run; what the
models compute, the tensors' passage by reference and the wire stay e2e
(tests/e2e/test_ensemble.py)."""

import asyncio
import shutil
from pathlib import Path

from shm.errors import ErrorCode
from shm.messages.frontend import RequestedOutput
from tests.loop.rig import DEADLINE_S, run

MODELS = Path(__file__).parents[1] / "models_ensemble"
# the ensembles these tests send to and their steps (the others need real models)
SERVED = ("ens_meet", "py_meet_a", "py_meet_b", "ens_fail", "py_identity", "py_fail",
          "ens_py_chain", "py_double")


def _repo(tmp_path) -> Path:
    for model in SERVED:
        shutil.copytree(MODELS / model, tmp_path / model)
    return tmp_path


async def _steps(rig, *models: str):
    """Wait for one batch of each of `models` (and no other) to reach the workers,
    none finished yet; take them, in `models`' order."""
    got = await rig.batches_sent(len(models))
    rig.take_batches()
    by_model = {batch.requests[0].model: (worker, batch) for worker, batch in got}
    assert sorted(by_model) == sorted(models)
    return [by_model[m] for m in models]


async def _chain(rig, ensemble: str, steps, fail_last=False):
    """One request through an ensemble whose steps run one after the other."""
    fut = rig.send(ensemble, inputs=("IN",))
    for i, model in enumerate(steps):
        (worker, batch), = await _steps(rig, model)
        last = i == len(steps) - 1
        worker.finish(batch, failed=[0] if fail_last and last else ())
    return await asyncio.wait_for(fut, DEADLINE_S)


def _counts(reply: dict) -> dict:
    m, = reply["model_stats"]
    inf = m["inference_stats"]
    return {"execution_count": m["execution_count"], "inference_count": m["inference_count"],
            "success": inf["success"]["count"], "fail": inf["fail"]["count"]}


def test_independent_steps_run_at_the_same_time(tmp_path):
    """Rule: steps that do not depend on each other run at once: both of ens_meet's
    steps reach the workers before either is done; the request is answered with both
    outputs once both are. (Was e2e
    test_ensemble.py::test_independent_steps_run_at_the_same_time[grpc]; [http] stays,
    with real workers that meet.)"""
    async def test(rig):
        fut = rig.send("ens_meet", inputs=("IN",))
        (wa, a), (wb, b) = await _steps(rig, "py_meet_a", "py_meet_b")
        wa.finish(a)
        await rig.settle()
        assert not fut.done()  # OUT_B is not there yet
        wb.finish(b)
        reply = await asyncio.wait_for(fut, DEADLINE_S)
        assert not reply.error, reply.error
        assert sorted(o.name for o in reply.outputs) == ["OUT_A", "OUT_B"]
    run(_repo(tmp_path), test)


def test_a_failing_step_fails_the_request_and_names_it(tmp_path):
    """Rule: a step's error fails the ensemble request with Triton's "in ensemble"
    prefix, the failing step's index and model and its message; the next request runs
    through. (Was e2e test_ensemble.py::test_a_failing_step_fails_the_request_and_names_it
    [grpc]; [http] stays, with py_fail's own message.)"""
    async def test(rig):
        reply = await _chain(rig, "ens_fail", ["py_identity", "py_fail"], fail_last=True)
        assert reply.error.message == "in ensemble 'ens_fail', step 1 (model 'py_fail'): failed"
        assert reply.error.code == ErrorCode.INTERNAL  # the step's own
        reply = await _chain(rig, "ens_fail", ["py_identity", "py_fail"])
        assert not reply.error, reply.error
        assert [o.name for o in reply.outputs] == ["OUT"]
    run(_repo(tmp_path), test)


def test_statistics_count_the_ensemble_and_its_steps(tmp_path):
    """Rule (as Triton 2.51 reports it): an ensemble request is one execution and one
    success of the ensemble, and one of each of its step models; a failed one is a
    failure of the ensemble, not an execution. (The counts of e2e
    test_ensemble.py::test_statistics_count_the_ensemble_and_its_steps, whose [grpc]
    case goes; [http] stays for the summed compute times real workers report.)"""
    async def test(rig):
        for _ in range(3):
            assert not (await _chain(rig, "ens_py_chain", ["py_identity", "py_double"])).error
        assert (await _chain(rig, "ens_fail", ["py_identity", "py_fail"], fail_last=True)).error
        await rig.settle()
        counts = {m: _counts(await rig.stats(m))
                  for m in ("ens_py_chain", "py_identity", "py_double", "ens_fail", "py_fail")}
        assert counts["ens_py_chain"] == dict(execution_count=3, inference_count=3,
                                              success=3, fail=0)
        assert counts["py_identity"] == dict(execution_count=4, inference_count=4,
                                             success=4, fail=0)
        assert counts["py_double"] == dict(execution_count=3, inference_count=3,
                                           success=3, fail=0)
        assert counts["ens_fail"] == dict(execution_count=0, inference_count=0,
                                          success=0, fail=1)
        assert counts["py_fail"] == dict(execution_count=1, inference_count=0,
                                         success=0, fail=1)
    run(_repo(tmp_path), test)


# A chain beside a single step, for pruning:
#   IN -> py_identity -> T -> py_double -> OUT_D;   IN -> py_meet_a -> OUT_A
ENS_PRUNE = """
name: "ens_prune"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "OUT_D" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "OUT_A" data_type: TYPE_FP32 dims: [ -1 ] }
]
ensemble_scheduling {
  step [
    { model_name: "py_identity" model_version: -1
      input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "T" } },
    { model_name: "py_double" model_version: -1
      input_map { key: "INPUT0" value: "T" } output_map { key: "OUTPUT0" value: "OUT_D" } },
    { model_name: "py_meet_a" model_version: -1
      input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT_A" } }
  ]
}
"""


def test_steps_no_requested_output_depends_on_are_skipped(tmp_path):
    """Rule (Triton 2.51 prunes an ensemble's steps per request): a step runs only if
    a requested output depends on it, directly or through later steps. Asking ens_prune
    for OUT_A runs py_meet_a alone; asking for OUT_D runs the chain and not py_meet_a;
    asking for everything runs all three. Statistics show the skipped steps never
    ran."""
    repo = _repo(tmp_path / "repo")
    (repo / "ens_prune" / "1").mkdir(parents=True)
    (repo / "ens_prune" / "config.pbtxt").write_text(ENS_PRUNE)

    async def test(rig):
        fut = rig.send("ens_prune", inputs=("IN",), outputs=[RequestedOutput("OUT_A")])
        (worker, batch), = await _steps(rig, "py_meet_a")
        worker.finish(batch)
        reply = await asyncio.wait_for(fut, DEADLINE_S)
        assert not reply.error, reply.error
        assert [o.name for o in reply.outputs] == ["OUT_A"]

        fut = rig.send("ens_prune", inputs=("IN",), outputs=[RequestedOutput("OUT_D")])
        for model in ("py_identity", "py_double"):
            (worker, batch), = await _steps(rig, model)
            worker.finish(batch)
        reply = await asyncio.wait_for(fut, DEADLINE_S)
        assert not reply.error, reply.error
        assert [o.name for o in reply.outputs] == ["OUT_D"]

        fut = rig.send("ens_prune", inputs=("IN",))
        (wi, bi), (wa, ba) = await _steps(rig, "py_identity", "py_meet_a")
        wi.finish(bi)
        wa.finish(ba)
        (worker, batch), = await _steps(rig, "py_double")
        worker.finish(batch)
        reply = await asyncio.wait_for(fut, DEADLINE_S)
        assert not reply.error, reply.error
        assert sorted(o.name for o in reply.outputs) == ["OUT_A", "OUT_D"]
        await rig.settle()
        assert not rig.take_batches()  # nothing else ran
        counts = {m: _counts(await rig.stats(m))["execution_count"]
                  for m in ("ens_prune", "py_identity", "py_double", "py_meet_a")}
        assert counts == {"ens_prune": 3, "py_identity": 2, "py_double": 2, "py_meet_a": 2}
    run(repo, test)
