"""Several GPUs, without them: instance groups placed on injected device lists (Triton's
`count` instances on EACH listed GPU, its names, its refusals), one device worker per
GPU told its device, and the plan for a client's CUDA region on another GPU than the
instance using it. Nothing here needs CUDA; what does is in the e2e `gpu` tests."""

import asyncio

import numpy as np
import pytest

from scheduler.cli import parse_args
from scheduler.repository.manager import ModelRepositoryManager
from scheduler.repository.models import ModelReadyState
from scheduler.scheduling.rate_limiter import InstanceSlot, RateLimiter
from scheduler.processes.worker_pool import WorkerHandle, WorkerPool
from shm import devices
from shm.devices import IN_PLACE, PEER, STAGED, TO_HOST, RegionPlan, region_plan
from shm.messages.worker import InstanceLoaded, LoadInstance
from shm.tensor import TensorRef
from workers import tensors
from workers.main import gpu_of
from workers.tensors import Copies, TensorIO
from tests.unit.fake_callbacks import FakeCallbacks

PY_MODEL = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
{groups}
"""


# -- the device list --------------------------------------------------------------------


def test_the_device_count_is_injected_by_one_variable(monkeypatch):
    """Rule: SHMSERVE_FAKE_GPUS=N makes the scheduler plan for GPUs 0..N-1 whatever the
    machine has; a value that is not a count stops the server with a clear error."""
    monkeypatch.setenv(devices.FAKE_GPUS_ENV, "2")
    assert devices.gpu_count() == 2
    monkeypatch.setenv(devices.FAKE_GPUS_ENV, "0")
    assert devices.gpu_count() == 0
    for bad in ("two", "-1"):
        monkeypatch.setenv(devices.FAKE_GPUS_ENV, bad)
        with pytest.raises(RuntimeError, match="SHMSERVE_FAKE_GPUS must be a number"):
            devices.gpu_count()


# -- instance groups to instances --------------------------------------------------------


class RecordingPool:
    """Loads every instance at once and keeps the LoadInstance each was sent."""

    def __init__(self):
        self.loads: list[LoadInstance] = []

    async def load_instance(self, slot, backend, msg):
        self.loads.append(msg)
        return InstanceLoaded(msg.instance, True, config=msg.config)

    async def drop_instance(self, slot):
        pass


def load(tmp_path, gpus: int, **groups: str):
    """Models named by `groups` (their instance_group text) loaded with `gpus` GPUs."""
    for name, group in groups.items():
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(PY_MODEL.format(name=name,
                                                                      groups=group))
    args = parse_args(["--model-repository", str(tmp_path), "--allow-metrics=false",
                       "--exit-on-error=false"])
    pool = RecordingPool()
    mgr = ModelRepositoryManager(args, pool, RateLimiter(), gpus, publish=lambda u: None,
                                 callbacks=FakeCallbacks())
    asyncio.run(mgr.load_repository())
    return mgr, pool


def version(mgr, model: str):
    return next(mv for mv in mgr.models.all() if mv.name == model)


def placed(pool, model: str) -> list[tuple[str, str, int]]:
    return [(m.instance_name, m.kind, m.device_id) for m in pool.loads if m.model == model]


def test_count_instances_on_each_listed_gpu(tmp_path):
    """Rule (Triton's TritonModel::PrepareInstances): a KIND_GPU group makes `count`
    instances on EACH of its GPUs, named `<group>_<c>` with the same name on every
    device, in Triton's order (per index, then per GPU); each is keyed apart."""
    mgr, pool = load(tmp_path, 2,
                     m="instance_group [{ count: 2 kind: KIND_GPU gpus: [0, 1] }]")
    assert placed(pool, "m") == [("m_0_0", "KIND_GPU", 0), ("m_0_0", "KIND_GPU", 1),
                                 ("m_0_1", "KIND_GPU", 0), ("m_0_1", "KIND_GPU", 1)]
    slots = mgr.models.resolve("m", 1).slots
    assert len({s.key for s in slots}) == 4
    assert [s.device_id for s in slots] == [0, 1, 0, 1]


def test_a_gpu_group_without_gpus_spreads_over_every_visible_gpu(tmp_path):
    """Rule: KIND_GPU (or KIND_AUTO on a GPU machine) with no `gpus` gets every visible
    GPU (NormalizeInstanceGroup), hence `count` instances on each; a CPU group's
    instances are unchanged by the GPUs there are."""
    _, pool = load(tmp_path, 3, g="instance_group [{ count: 1 kind: KIND_GPU }]",
                   a="instance_group [{ count: 2 }]",
                   c="instance_group [{ count: 2 kind: KIND_CPU }]")
    assert placed(pool, "g") == [("g_0_0", "KIND_GPU", d) for d in (0, 1, 2)]
    assert sorted(d for _, _, d in placed(pool, "a")) == [0, 0, 1, 1, 2, 2]
    assert placed(pool, "c") == [("c_0_0", "KIND_CPU", 0), ("c_0_1", "KIND_CPU", 0)]


def test_a_gpu_that_does_not_exist_fails_the_load_in_tritons_words(tmp_path):
    """Rule: a listed GPU that is not visible fails the load, no instance starts; with
    no GPU at all a KIND_GPU group fails as on Triton's CPU build (both messages as
    Triton 2.51 prints them)."""
    mgr, pool = load(tmp_path, 2,
                     m="instance_group [{ count: 1 kind: KIND_GPU gpus: [0, 2] }]")
    mv = version(mgr, "m")
    assert mv.state is ModelReadyState.UNAVAILABLE and not pool.loads
    assert mv.reason == (
        "instance group m_0 of model m specifies invalid or unsupported gpu id 2. GPUs "
        "with at least the minimum required CUDA compute compatibility of 6.000000 are: "
        "0, 1")
    mgr, pool = load(tmp_path / "none", 0, n="instance_group [{ count: 1 kind: KIND_GPU }]")
    assert version(mgr, "n").reason == (
        "instance group n_0 of model n has kind KIND_GPU but no GPUs are available")


# -- instances to worker processes ----------------------------------------------------


class SpawnlessPool(WorkerPool):
    """The real placement with the processes left out: a spawned worker is ready at
    once, and an instance sent to it loads at once."""

    def __init__(self):
        args = parse_args(["--model-repository", "/nonexistent"])
        super().__init__(args, "/tmp/run", "pfx-", "ipc://scheduler", outbox=self,
                         peers=list, on_instances_lost=lambda slots, how: None)
        self.spawned: list[WorkerHandle] = []
        self.sent: list[tuple[str, LoadInstance]] = []

    async def _spawn(self, label, device="", executable="", env=None):
        worker = WorkerHandle(label, f"ipc://w{len(self.spawned)}", "pfx-w", device)
        self.workers[worker.address] = worker
        self.spawned.append(worker)
        return worker

    def send(self, address, msg):  # the pool's outbox
        self.sent.append((address, msg))
        self.loop.call_soon(self.on_instance_loaded, InstanceLoaded(msg.instance, True))


def test_one_device_worker_per_gpu_each_told_its_device():
    """Rule: framework instances share the one worker of their device: instances on
    GPUs 0 and 1 start exactly two workers, `--device gpu:0` and `--device gpu:1`, and
    each instance is loaded in the worker of its own GPU."""
    async def place():
        pool = SpawnlessPool()
        slots = [InstanceSlot(f"m/1/m_0_{c}@gpu{d}#1", f"m_0_{c}", "KIND_GPU", d)
                 for c in range(2) for d in (0, 1)]
        await asyncio.gather(*(pool.load_instance(s, "onnxruntime", LoadInstance(
            s.key, s.name, "m", 1, "/m", b"{}", kind=s.kind, device_id=s.device_id))
            for s in slots))
        return pool, slots

    pool, slots = asyncio.run(place())
    assert sorted(w.device for w in pool.spawned) == ["gpu:0", "gpu:1"]
    for worker in pool.spawned:
        argv = pool.spec(worker).to_argv()
        assert argv[argv.index("--device") + 1] == worker.device
    for slot in slots:
        assert slot.worker.device == f"gpu:{slot.device_id}"
    by_address = {w.address: w.device for w in pool.spawned}
    assert sorted((by_address[a], m.device_id) for a, m in pool.sent) == [
        ("gpu:0", 0), ("gpu:0", 0), ("gpu:1", 1), ("gpu:1", 1)]


def test_a_workers_device_flag_names_its_gpu():
    assert gpu_of("cpu") is None and gpu_of("gpu:0") == 0 and gpu_of("gpu:3") == 3
    for bad in ("gpu", "gpu:x", "tpu:0"):
        with pytest.raises(ValueError, match="--device"):
            gpu_of(bad)


# -- a region on one GPU, the instance on another ------------------------------------


def test_region_plan():
    """Rule: the IPC handle is opened on the region's own device; the bytes then cross
    once: in place on the same GPU, a peer copy to another GPU (direct where the two
    can reach each other, staged by the driver where not), a device-to-host copy for an
    instance on the CPU."""
    reach = lambda device, peer: {device, peer} == {0, 1}  # noqa: E731  (0 <-> 1 only)
    assert region_plan(1, 1, reach) == RegionPlan(1, IN_PLACE)
    assert region_plan(1, 0, reach) == RegionPlan(1, PEER)
    assert region_plan(0, 1, reach) == RegionPlan(0, PEER)
    assert region_plan(2, 0, reach) == RegionPlan(2, STAGED)
    assert region_plan(1, None, reach) == RegionPlan(1, TO_HOST)


class FakeRegion:
    def __init__(self, device):
        self.device = device

    def array(self, offset, nbytes, dtype, shape):
        return np.zeros(shape, dtype)  # stands for a cupy array on self.device


class FakeRegionMaps:
    def cuda(self, uid, handle, device, byte_size):
        return FakeRegion(device)


@pytest.mark.parametrize("region_device,copied", [(1, True), (0, False)])
def test_a_region_on_another_gpu_is_copied_onto_the_instances(monkeypatch, region_device,
                                                               copied):
    """Rule: a device worker on GPU 0 reading an input from a client's region on GPU 1
    hands the model a copy on GPU 0 (one device-to-device copy, counted); a region on
    its own GPU is read in place."""
    moved = []
    monkeypatch.setattr(tensors, "can_access_peer", lambda a, b: True)
    monkeypatch.setattr(tensors, "onto_device",
                        lambda array, device: moved.append(device) or array)
    io = TensorIO(arena=None, owner="ipc://w", device=0)
    io.regions = FakeRegionMaps()
    ref = TensorRef("IN", "FP32", [2, 4], offset=0, nbytes=32, region=7,
                    device=region_device, handle=b"h", region_size=64)
    copies = Copies()
    io.input(ref, copies)
    assert moved == ([0] if copied else [])
    assert copies.d2d == (32 if copied else 0)
