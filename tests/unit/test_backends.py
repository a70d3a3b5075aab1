"""The backend table (shm/backends.py): what the scheduler and the workers both read;
and what each framework module of the workers declares it implements."""

import importlib

import pytest

from shm.backends import (BACKENDS, DEVICE_WORKER_BACKENDS, MODEL_FILES, PLATFORM_BACKEND,
                          SERVED_BACKENDS)
from workers import backends as worker_backends
from workers.instance import FrameworkBackend


def test_the_platforms_triton_maps():
    assert PLATFORM_BACKEND == {
        "tensorrt_plan": "tensorrt", "onnxruntime_onnx": "onnxruntime",
        "pytorch_libtorch": "pytorch", "tensorflow_savedmodel": "tensorflow",
        "tensorflow_graphdef": "tensorflow"}


def test_default_model_files_in_tritons_search_order():
    assert list(MODEL_FILES.items()) == [
        ("tensorrt", "model.plan"), ("onnxruntime", "model.onnx"),
        ("openvino", "model.xml"), ("pytorch", "model.pt"), ("python", "model.py")]


def test_cpu_instance_counts_and_device_workers():
    assert {b.name for b in BACKENDS.values() if b.cpu_instances == 2} == {
        "onnxruntime", "tensorflow"}
    assert DEVICE_WORKER_BACKENDS == {"onnxruntime", "pytorch"}


def test_every_served_backend_has_an_implementation_and_an_install_hint():
    assert set(SERVED_BACKENDS) == {"python", "onnxruntime", "pytorch"}
    assert set(SERVED_BACKENDS) == set(worker_backends._FRAMEWORKS) | {"python"}
    for name in worker_backends._FRAMEWORKS:
        assert "pip install 'shmserve[" in BACKENDS[name].install


def test_each_framework_module_declares_its_backend():
    """The worker reads what a framework module offers from its BACKEND, not by probing
    the module: onnxruntime completes configs from the graph, TorchScript does not."""
    declared = {}
    for name, module in worker_backends._FRAMEWORKS.items():
        try:
            declared[name] = importlib.import_module(module).BACKEND
        except ImportError:  # the framework is not installed here
            continue
        assert isinstance(declared[name], FrameworkBackend)
    if not declared:
        pytest.skip("no framework installed")
    if "onnxruntime" in declared:
        assert declared["onnxruntime"].model_class.__name__ == "OnnxModel"
        assert declared["onnxruntime"].auto_complete is not None
    if "pytorch" in declared:
        assert declared["pytorch"].model_class.__name__ == "TorchModel"
        assert declared["pytorch"].auto_complete is None
