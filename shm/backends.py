"""The backends: one table of what Triton knows about each, read by the scheduler
(config auto-complete, instance counts, which worker process an instance joins) and
by the workers (the file a model loads, what to install when a framework is missing).

The order is Triton's: a bare config is completed from the first backend whose
default model file is in the version folder. tensorflow, tensorrt and openvino are
not served here, but a config naming them still prints as Triton prints it.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Backend:
    name: str
    model_file: str = ""  # the default_model_filename Triton fills in ("": none)
    platforms: tuple[str, ...] = ()  # the platforms that mean it; the first is filled in
    cpu_instances: int = 1  # instances a KIND_CPU group without a count gets
    # served here: True for backends this server runs, with `install` the pip extra
    # that brings its framework ("" for none needed)
    served: bool = False
    install: str = ""
    # instances share one worker process per device ("cpu", "gpu:N"), each on its own
    # thread (frameworks release the GIL while they compute); otherwise (python) each
    # instance gets a process of its own
    device_worker: bool = False


BACKENDS = {b.name: b for b in (
    Backend("tensorrt", "model.plan", ("tensorrt_plan",)),
    Backend("onnxruntime", "model.onnx", ("onnxruntime_onnx",), cpu_instances=2,
            served=True, install="pip install 'shmserve[cpu]' or 'shmserve[gpu]'",
            device_worker=True),
    Backend("openvino", "model.xml"),
    Backend("pytorch", "model.pt", ("pytorch_libtorch",), served=True,
            install="pip install 'shmserve[pytorch]'", device_worker=True),
    Backend("python", "model.py", served=True),
    Backend("tensorflow", "", ("tensorflow_savedmodel", "tensorflow_graphdef"),
            cpu_instances=2),
)}

# platform -> backend, for the platforms Triton maps
PLATFORM_BACKEND = {p: b.name for b in BACKENDS.values() for p in b.platforms}
# backend -> default model file, in Triton's search order
MODEL_FILES = {b.name: b.model_file for b in BACKENDS.values() if b.model_file}
DEVICE_WORKER_BACKENDS = frozenset(b.name for b in BACKENDS.values() if b.device_worker)
SERVED_BACKENDS = tuple(b.name for b in BACKENDS.values() if b.served)
