"""shm.cuda.set_sync (--cuda-sync): the scheduling flag every visible device's
primary context gets, set through the driver (here the fake's record of it)."""

import pytest

from scheduler.cli import build_parser
from shm import cuda, cuda_fake
from shm.messages.roles import WorkerSpec


@pytest.fixture
def two_fake_devices(monkeypatch):
    monkeypatch.setattr(cuda, "FAKE_DEVICES", 2)
    monkeypatch.setattr(cuda, "cuda_fake", cuda_fake, raising=False)
    monkeypatch.setattr(cuda, "device_count", lambda: 2)
    cuda_fake.PRIMARY_FLAGS.clear()
    yield cuda_fake.PRIMARY_FLAGS
    cuda_fake.PRIMARY_FLAGS.clear()


@pytest.mark.parametrize("mode, flag", [("spin", 1), ("yield", 2), ("block", 4)])
def test_each_device_gets_the_flag(two_fake_devices, mode, flag):
    assert cuda.set_sync(mode) == [0, 1]
    assert two_fake_devices == {0: flag, 1: flag}


def test_auto_leaves_cuda_its_choice(two_fake_devices):
    assert cuda.set_sync("auto") == [] and not two_fake_devices


def test_no_device_nothing_to_set(monkeypatch):
    monkeypatch.setattr(cuda, "device_count", lambda: 0)
    assert cuda.set_sync("block") == []


def test_the_flag_goes_from_the_command_line_to_every_worker():
    args = build_parser().parse_args(["--model-repository", "/tmp/r", "--cuda-sync",
                                      "block"])
    assert args.cuda_sync == "block"
    assert build_parser().parse_args(["--model-repository", "/tmp/r"]).cuda_sync == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--model-repository", "/tmp/r", "--cuda-sync", "fast"])
    spec = WorkerSpec(name="w", address="ipc:///tmp/w", scheduler="ipc:///tmp/s",
                      segment_prefix="p", cuda_sync="block")
    assert WorkerSpec.from_argv(spec.to_argv()).cuda_sync == "block"
