"""The contract between the worker loop (workers/main.py) and a backend's instance
class (FrameworkInstance in workers/framework.py, PythonInstance in
workers/python_backend/runner.py).

A framework backend module declares its model class and optional auto-complete in a
`FrameworkBackend`. The loop calls `execute` and `finalize`, reads the members below, and hands the
instance the worker's services through `connect`. A capability an instance may lack
is a declared member with the default that means "not this one", so the loop reads it
instead of probing with hasattr. The instance classes derive from `Instance` to take
those defaults.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, NamedTuple, Protocol

if TYPE_CHECKING:
    from workers.python_backend.bls import BlsClient
    from workers.tensors import Copies, TensorIO


class FrameworkBackend(NamedTuple):
    """What a framework backend module (workers/onnx_backend.py, torch_backend.py)
    declares as its `BACKEND`: the model class FrameworkInstance drives (made with
    (config, path, device, backend_config, stream pointer); run(inputs, output names);
    close()) and, if it has one, its config auto-complete (config, model path,
    backend_config) -> config."""

    model_class: type
    auto_complete: Callable[[dict, str, dict], dict] | None = None


class WorkerLinks(NamedTuple):
    """The worker's services for an instance that calls other models or answers
    requests by itself (a python model's BLS calls and response senders)."""

    bls: BlsClient
    # responder(request, result, final, empty, parameters), from any thread: writes a
    # response's outputs and sends it to the request's reply_to
    responder: Callable
    # report_responses(request, timings): a decoupled request's per-response timings,
    # once it is complete (shm.messages.worker.ResponseStats)
    report_responses: Callable


class Instance(Protocol):
    """A loaded model instance, as the worker loop sees it."""

    config: dict  # the model config (JSON form), auto-completed where asked
    copies: Copies  # bytes it copied so far; counted afresh after the warmup
    # when the last batch's inputs were ready and when the model returned (ns)
    input_end_ns: int = 0
    output_start_ns: int = 0
    # batches run on a thread of the instance's own (InstanceThread), so the worker's
    # main thread keeps receiving while one runs
    threaded: bool = True
    # a batch may run on the worker's receiving thread while the instance's own thread
    # is idle (Worker.run_inline); the worker clears it once the model had to receive
    inline: bool = False
    # a GPU instance's CUDA stream (a sequence model's state then lives on the device)
    stream: object | None = None

    def execute(self, requests: list, io: TensorIO) -> list:
        """Per request: a list of (name, datatype, array), an InferError, or ANSWERED /
        ANSWERED_FAILED when its responses went out as the model sent them."""
        ...

    def finalize(self) -> None:
        """Unload: release the model, its threads and its device memory."""
        ...

    def connect(self, links: WorkerLinks) -> None:
        """Take the worker's services; called once, right after loading. Default: an
        instance that needs none (its results go back through execute's return)."""
