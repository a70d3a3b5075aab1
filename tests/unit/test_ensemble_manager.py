"""Ensembles in the model repository manager, with a fake worker pool: an ensemble
loads after the models of its steps, is READY exactly while they all are, and
explicit loading of an ensemble loads its steps."""

import asyncio
from pathlib import Path

from scheduler.cli import parse_args
from scheduler.scheduling.ensemble import EnsembleScheduler
from scheduler.repository.manager import ModelRepositoryManager
from scheduler.repository.models import ModelReadyState
from scheduler.scheduling.rate_limiter import RateLimiter
from shm.messages.worker import InstanceLoaded
from tests.unit.fake_callbacks import FakeCallbacks

# without the onnx_identity the e2e tests build: ens_mixed cannot load
REPO = Path(__file__).resolve().parents[1] / "models_ensemble"


class FakePool:
    """Every instance loads at once, answering with the config it was given."""

    async def load_instance(self, slot, backend, msg):
        await asyncio.sleep(0)
        return InstanceLoaded(msg.instance, True, config=msg.config)

    async def drop_instance(self, slot):
        pass


def manager(*argv: str):
    args = parse_args(["--model-repository", str(REPO), "--allow-metrics=false", *argv])
    published = []
    mgr = ModelRepositoryManager(args, FakePool(), RateLimiter(), 0,
                                 publish=published.append, callbacks=FakeCallbacks())
    return mgr, published


def load(mgr) -> bool:
    return asyncio.run(mgr.load_repository())


def states(mgr) -> dict[str, tuple[str, str]]:
    return {mv.name: (mv.state.value, mv.reason) for mv in mgr.models.all()}


def test_an_ensemble_loads_after_its_steps_and_is_ready_with_them():
    """Rule: an ensemble loads once its steps' models have loaded (it is published
    READY after them), has no instances, and gets the ensemble scheduler."""
    mgr, published = manager("--exit-on-error=false")
    assert not load(mgr)  # ens_unknown and ens_mixed fail
    ready_order = [u.name for u in published if u.state == "READY"]
    assert ready_order.index("ens_py_chain") > ready_order.index("py_identity")
    assert ready_order.index("ens_py_chain") > ready_order.index("py_double")
    mv = mgr.models.resolve("ens_py_chain", 0)
    assert isinstance(mv.scheduler, EnsembleScheduler) and mv.slots == []
    got = states(mgr)
    assert got["ens_py_chain"] == ("READY", "")
    assert got["ens_mixed"] == ("UNAVAILABLE", "ensemble ens_mixed contains models that "
                                "are not available or ambiguous: onnx_identity")
    assert got["ens_unknown"][0] == "UNAVAILABLE"


def test_an_ensemble_becomes_unavailable_with_a_step_and_ready_again():
    """Rule: an ensemble is READY exactly while all its steps' models are."""
    mgr, published = manager()
    load(mgr)
    step = mgr.models.resolve("py_double", 0)
    step.state = ModelReadyState.UNAVAILABLE
    mgr.publish(step)
    chain = mgr.models.resolve("ens_py_chain", 1)
    assert (chain.state, chain.reason) == (ModelReadyState.UNAVAILABLE,
                                           "composing model 'py_double' is not ready")
    assert published[-1].name == "ens_py_chain" and published[-1].state == "UNAVAILABLE"
    assert mgr.models.resolve("ens_fail", 1).state is ModelReadyState.READY  # no py_double
    step.state = ModelReadyState.READY
    mgr.publish(step)
    assert (chain.state, chain.reason) == (ModelReadyState.READY, "")


def test_a_step_that_failed_to_load_is_named_with_its_error(tmp_path):
    """Rule (Triton's message): an ensemble whose step model failed to load says so,
    with that model's error."""
    import shutil
    repo = tmp_path / "repo"
    shutil.copytree(REPO, repo)
    (repo / "py_double" / "config.pbtxt").write_text(
        'name: "py_double" backend: "python" max_batch_size: -1')
    args = parse_args(["--model-repository", str(repo), "--allow-metrics=false"])
    mgr = ModelRepositoryManager(args, FakePool(), RateLimiter(), 0, publish=lambda u: None,
                                 callbacks=FakeCallbacks())
    load(mgr)
    state, reason = states(mgr)["ens_py_chain"]
    assert state == "UNAVAILABLE"
    assert reason.startswith("ensemble 'ens_py_chain' depends on 'py_double' which has no "
                             "loaded version. Model 'py_double' loading failed with error: ")
    assert "'max_batch_size' must be non-negative" in reason


def test_explicit_loading_of_an_ensemble_loads_its_steps():
    """Rule (Triton): in explicit mode, loading an ensemble loads the models it uses,
    and nothing else."""
    mgr, _ = manager("--model-control-mode=explicit", "--load-model=ens_py_chain")
    assert load(mgr)
    assert states(mgr) == {"ens_py_chain": ("READY", ""), "py_identity": ("READY", ""),
                           "py_double": ("READY", "")}
