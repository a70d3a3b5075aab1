"""Which backend runs a model, chosen from its config as Triton chooses."""

from __future__ import annotations

import json

from shm.messages.worker import LoadInstance

# platform -> backend, for configs that name only a platform
_PLATFORM_BACKEND = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
}


def backend_name(config: dict) -> str:
    backend = config.get("backend") or _PLATFORM_BACKEND.get(config.get("platform", ""), "")
    return backend


def create_instance(msg: LoadInstance):
    """Load the instance `msg` describes; returns (instance, config JSON bytes)."""
    config = json.loads(msg.config)
    backend = backend_name(config)
    if backend == "python":
        from workers.python_backend.runner import PythonInstance
        inst = PythonInstance(msg, config)
        return inst, json.dumps(inst.config).encode()
    if not backend:
        raise ValueError(f"model '{msg.model}' names no backend or platform")
    raise ValueError(f"unknown backend '{backend}' for model '{msg.model}' "
                     "(this server runs: python)")
