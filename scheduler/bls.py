"""Requests a python model makes of other models (BLS), as they enter the scheduler.

A BLS request comes from a worker, not a frontend, so nobody has checked it against
the callee's config yet: here it gets the checks Triton core runs on every request
(inputs the model has, of its datatypes, its batch size) with Triton's words, and its
batch size is derived from its shapes as a frontend would. It also carries the chain
of models whose `execute` is waiting on it: a call back into one of them would queue
behind the very execution that waits for it (Triton deadlocks there), so it fails.
"""

from __future__ import annotations

import msgspec

from scheduler.repository.models import ModelReadyState
from shm.datatypes import from_config
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import InferRequest

_INVALID = ErrorCode.INVALID_ARG


def _datatype(config_input) -> str:
    from tritonclient.grpc import model_config_pb2
    return from_config(model_config_pb2.DataType.Name(config_input.data_type))


def admit(req: InferRequest, mv) -> InferRequest:
    """Check a BLS request against its callee (a ModelVersion, None if unknown); returns
    it with its batch size set (the worker reads it). Raises InferError with the reason
    it cannot run."""
    if mv is None or mv.scheduler is None or mv.state is not ModelReadyState.READY:
        raise InferError(ErrorCode.UNAVAILABLE, "Failed for execute the inference "
                                                f"request. Model '{req.model}' is not ready.")
    size = check(req, mv.config)
    if size == req.batch_size:
        return req
    return msgspec.structs.replace(req, batch_size=size)


def refusal(req: InferRequest, message: str) -> str:
    """A refused BLS request's error as Triton's python backend words it."""
    return f"Model {req.model} - Error when running inference: {message}"


def check_chain(req: InferRequest) -> None:
    """Refuse a request into a model that waits up its call chain (a BLS call, or an
    ensemble step of one, which carries its callers on)."""
    if req.model in req.callers:
        chain = " -> ".join([*req.callers, req.model])
        raise InferError(
            _INVALID,
            f"[request id: {req.request_id or '<id_unknown>'}] BLS request to model "
            f"'{req.model}' from its own execution ({chain}) would wait for itself; "
            "the call is refused")


def check(req: InferRequest, config) -> int:
    """Check a BLS request against its callee's config (a ModelConfig); returns its
    batch size (derived from its shapes). Raises InferError with the reason it cannot
    run."""
    prefix = f"[request id: {req.request_id or '<id_unknown>'}] "
    check_chain(req)
    inputs = {i.name: i for i in config.input}
    given = set()
    for ref in req.inputs:
        spec = inputs.get(ref.name)
        if spec is None:
            raise InferError(_INVALID, f"{prefix}unexpected inference input '{ref.name}' "
                                       f"for model '{req.model}'")
        expected = _datatype(spec)
        if ref.datatype != expected:
            raise InferError(
                _INVALID, f"{prefix}inference input '{ref.name}' data-type is "
                          f"'{ref.datatype}', but model '{req.model}' expects "
                          f"'{expected}'")
        given.add(ref.name)
    missing = [i.name for i in config.input if not i.optional and i.name not in given]
    if missing:
        raise InferError(
            _INVALID, f"{prefix}expected {len(inputs)} inputs but got {len(given)} inputs "
                      f"for model '{req.model}'. Got input(s) "
                      f"[{','.join(repr(n) for n in sorted(given))}], but missing required "
                      f"input(s) [{','.join(repr(n) for n in missing)}]. Please provide "
                      "all required input(s).")
    if config.max_batch_size <= 0:
        return 1
    sizes = {ref.shape[0] if ref.shape else 0 for ref in req.inputs}
    if len(sizes) != 1:
        raise InferError(_INVALID, f"{prefix}input batch sizes differ for model "
                                   f"'{req.model}'")
    size = sizes.pop()
    if not 0 < size <= config.max_batch_size:
        raise InferError(
            _INVALID, f"{prefix}inference request batch-size must be <= "
                      f"{config.max_batch_size} for '{req.model}'")
    return size
