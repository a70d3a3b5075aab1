"""Which backend runs a model, chosen from its config as Triton chooses."""

from __future__ import annotations

import json
import os

from shm.backends import BACKENDS, MODEL_FILES, SERVED_BACKENDS
from shm.messages.worker import LoadInstance

# backend -> the module whose BACKEND (workers.instance.FrameworkBackend) implements
# it; imported only when used, so a worker that runs python models never pays for
# onnxruntime or torch
_FRAMEWORKS = {
    "onnxruntime": "workers.onnx_backend",
    "pytorch": "workers.torch_backend",
}


def create_instance(msg: LoadInstance):
    """Load the instance `msg` describes; returns (instance, config JSON bytes).

    The config comes normalized from the scheduler, so `backend` is already filled in
    from `platform` where Triton does that."""
    config = json.loads(msg.config)
    backend = config.get("backend", "")
    if backend == "python":
        from workers.python_backend.runner import PythonInstance
        inst = PythonInstance(msg, config)
        return inst, json.dumps(inst.config).encode()
    if backend in _FRAMEWORKS:
        import importlib
        from workers.framework import FrameworkInstance
        try:
            framework = importlib.import_module(_FRAMEWORKS[backend]).BACKEND
        except ImportError as exc:
            raise RuntimeError(f"backend '{backend}' is not available: {exc} "
                               f"({BACKENDS[backend].install})") from None
        filename = config.get("default_model_filename") or MODEL_FILES[backend]
        path = os.path.join(msg.model_dir, str(msg.version), filename)
        if msg.auto_complete and framework.auto_complete is not None:
            if not os.path.exists(path):
                raise FileNotFoundError(f"model file not found: {path}")
            config = framework.auto_complete(config, path, msg.backend_config)
        inst = FrameworkInstance(msg, config, framework.model_class, filename)
        return inst, json.dumps(config).encode()
    if not backend:
        raise ValueError(f"model '{msg.model}' names no backend or platform")
    raise ValueError(f"unknown backend '{backend}' for model '{msg.model}' "
                     f"(this server runs: {', '.join(SERVED_BACKENDS)})")
