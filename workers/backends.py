"""Which backend runs a model, chosen from its config as Triton chooses."""

from __future__ import annotations

import json

from shm.messages.worker import LoadInstance

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
    if not backend:
        raise ValueError(f"model '{msg.model}' names no backend or platform")
    raise ValueError(f"unknown backend '{backend}' for model '{msg.model}' "
                     "(this server runs: python)")
