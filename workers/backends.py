"""Which backend runs a model, chosen from its config as Triton chooses."""

from __future__ import annotations

import json
import os

from shm.messages.worker import LoadInstance

# backend -> (module, model class, default model file); imported only when used, so a
# worker that runs python models never pays for onnxruntime or torch
_FRAMEWORKS = {
    "onnxruntime": ("workers.onnx_backend", "OnnxModel", "model.onnx"),
    "pytorch": ("workers.torch_backend", "TorchModel", "model.pt"),
}
# what to install when a framework is missing (onnxruntime: either build, not both)
_EXTRAS = {
    "onnxruntime": " (pip install 'shmserve[cpu]' or 'shmserve[gpu]')",
    "pytorch": " (pip install 'shmserve[pytorch]')",
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
        module_name, class_name, default_file = _FRAMEWORKS[backend]
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            extra = _EXTRAS[backend]
            raise RuntimeError(f"backend '{backend}' is not available: {exc}{extra}") from None
        filename = config.get("default_model_filename") or default_file
        path = os.path.join(msg.model_dir, str(msg.version), filename)
        if msg.auto_complete and hasattr(module, "auto_complete"):
            if not os.path.exists(path):
                raise FileNotFoundError(f"model file not found: {path}")
            config = module.auto_complete(config, path, msg.backend_config)
        inst = FrameworkInstance(msg, config, getattr(module, class_name), filename)
        return inst, json.dumps(config).encode()
    if not backend:
        raise ValueError(f"model '{msg.model}' names no backend or platform")
    raise ValueError(f"unknown backend '{backend}' for model '{msg.model}' "
                     "(this server runs: python, onnxruntime, pytorch)")
