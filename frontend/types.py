"""What the protocol codecs hand to the frontend core and get back from it.

The codecs (HTTP JSON/binary, gRPC) turn a wire request into a `DecodedRequest` whose
input data are buffers in Triton's raw layout (little-endian, row-major, BYTES as 4-byte
length-prefixed elements), slicing the received body without copying where they can.
The core validates it against the model, runs it and returns an `InferResult` whose
output buffers stay valid until `release()` is called.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, runtime_checkable

from shm.errors import ErrorCode, InferError  # noqa: F401  (re-exported for codecs)
from shm.messages.repository import ModelReadyState

# Triton core's limit on a string sequence_id, for every model, and its words (2.51
# answers 501 / UNIMPLEMENTED; the fault is the client's: 400 / INVALID_ARGUMENT here,
# as for the other client errors Triton answers with a 5xx, issue 11, 5b)
CORRELATION_ID_MAX = 128  # bytes
CORRELATION_ID_TOO_LONG = "string correlation ID cannot be longer than 128 characters"


@dataclasses.dataclass(slots=True)
class DecodedInput:
    name: str
    datatype: str
    shape: list[int]
    data: Any  # bytes-like in raw layout; None when the input lives in a shm region
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class RequestedOutput:
    name: str
    binary_data: bool | None = None  # None: the request's default applies
    class_count: int = 0
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class DecodedRequest:
    model_name: str
    model_version: str  # "" means the version policy's choice
    id: str
    inputs: list[DecodedInput]
    outputs: list[RequestedOutput] | None  # None: every output of the model
    parameters: dict[str, Any]  # priority, timeout, sequence_*, binary_data_output, ...
    # Blocks of the core's arena holding this request's data (a body received straight
    # into shared memory); the core frees them once the request is finished.
    arena_blocks: list = dataclasses.field(default_factory=list)
    # (model config, batch size): validate_request passed it against that config. The
    # core sets it; a request decoded from a header seen before brings the earlier
    # one's (http_codec.HeaderMemo, grpc_codec's templates), and the core validates
    # again for another config
    checked: tuple | None = None
    # what it was decoded from, where the core keeps its verdict for the next request
    # decoded alike (`memo.keep(request)`); None: nowhere. Not part of its value.
    memo: Any = dataclasses.field(default=None, compare=False, repr=False)


@dataclasses.dataclass(slots=True)
class OutputTensor:
    name: str
    datatype: str
    shape: list[int]
    data: Any  # bytes-like in raw layout, valid until the result is released
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class InferResult:
    model_name: str
    model_version: str
    id: str
    outputs: list[OutputTensor]
    release: Callable[[], None] = lambda: None
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)  # response's
    cache_hit: bool = False


@dataclasses.dataclass(slots=True)
class ModelView:
    """What the frontend knows of one model version, pushed to it by the scheduler."""

    name: str
    version: int
    state: ModelReadyState
    reason: str
    config: Any  # tritonclient.grpc.model_config_pb2.ModelConfig
    config_json: dict | None = None  # the config as Triton's HTTP endpoint prints it
    # output name -> class labels (its `label_filename`), for HTTP classification
    labels: dict[str, list[str]] | None = None
    cache: bool = False  # its responses are cached: compute each request's cache key
    decoupled: bool = False  # model_transaction_policy { decoupled: true }
    cache_outputs: list | None = None  # the config's outputs, keyed for "every output"


def not_ready_error(view: ModelView, version: str, why: bool = True) -> InferError:
    """A model (or the version asked for) that is not READY, in Triton core's words
    (ModelLifeCycle::GetModel, checked on 2.51): with no version named, nothing is
    available (404); a named version is not at ready state (503). Triton stops there;
    for a request (`why`) we add why (a load error names the model's file and line),
    after ': ', so the one who sent it sees what to fix; the status and the words before
    are Triton's (a listed difference in tests/e2e/test_error_table.py). Metadata and
    config calls answer exactly as Triton."""
    # an unload is no failure to explain: Triton's words alone
    why = f": {view.reason}" if (why and view.reason and not unloaded(view)) else ""
    if not version:
        return InferError(ErrorCode.NOT_FOUND, f"Request for unknown model: "
                                               f"'{view.name}' has no available versions{why}")
    return InferError(ErrorCode.UNAVAILABLE,
                      f"Request for unknown model: '{view.name}' version {view.version} is "
                      f"not at ready state{why}")


# A request body (HTTP) or unary ModelInfer message (gRPC) at least this large is
# received straight into the core's shared-memory arena as it arrives (body_buffer).
BODY_IN_ARENA_MIN = 256 * 1024


@runtime_checkable
class DataPlane(Protocol):
    """What the HTTP and gRPC servers call, and all of it: the protocol servers' only
    view of the rest of the server (frontend.dataplane.SchedulerDataPlane behind the
    channels to the scheduler in production, a fake in the unit tests)."""

    # draining: new requests are refused (the health service says NOT_SERVING)
    stopping: bool
    # the largest body a block of body_buffer holds without a segment of its own
    body_block_max: int

    def server_live(self) -> bool: ...

    def server_ready(self) -> bool: ...

    def get_model(self, name: str, version: str = "") -> ModelView:
        """The model version that `version` names ("" = latest ready one).

        Raises InferError(NOT_FOUND) for an unknown model or version."""

    def model_versions(self, name: str) -> list[ModelView]: ...

    async def infer(self, request: DecodedRequest, decoupled_refusal: str = ""
                    ) -> InferResult:
        """Validate, run and answer one request; raises InferError (with
        `decoupled_refusal` set, UNSUPPORTED with that text for a decoupled model).

        Inputs with `data` None name a client shared-memory region in `parameters`
        (shared_memory_region / shared_memory_offset / shared_memory_byte_size), and
        so may requested outputs. An output written into a region comes back with
        `data` None (Triton says nothing more about it in the response)."""

    def start(self, request: DecodedRequest, decoupled_refusal: str = ""):
        """Validate and issue one request; its responses (zero to many for a decoupled
        model) come through the returned stream: `await stream.next()` gives
        (InferResult | InferError | None, final), `stream.view` is the model version,
        `stream.cancel()` cancels it. Raises InferError for a request refused before
        it ran."""

    def start_unary(self, request: DecodedRequest, on_done: Callable[[Any], None],
                    decoupled_refusal: str = ""):
        """`infer` without a coroutine: validate and issue one request, and call
        `on_done(answer)` once, from the loop, with what `infer` would return or raise
        (an InferResult, or the exception). Raises InferError for a request refused
        before it ran. Returns a handle whose `cancel()` drops the request (the client
        went away): on_done is not called then."""

    def body_quota(self):
        """A new connection's share of the arena for its request bodies
        (frontend.body_budget.BodyQuota), held by the transport for the connection's
        life; None: no share (its bodies count against the process's budget alone)."""

    def body_buffer(self, nbytes: int, quota=None) -> tuple[memoryview, Any] | None:
        """A block of shared memory to receive an `nbytes` request body into, and the
        block's name for free_blocks (or for DecodedRequest.arena_blocks, which hands
        it to the request); None when there is no room (the transport then receives
        the body in process memory)."""

    def free_blocks(self, blocks) -> None:
        """Give back blocks of body_buffer that no request took (a body cut short)."""

    async def model_statistics(self, name: str = "", version: str = "") -> bytes:
        """The statistics extension's JSON (Triton's HTTP form) for every ready model
        (`name` empty), every ready version of `name`, or one version; raises
        InferError."""

    async def log_settings(self, update: dict | None = None):
        """The logging extension: shm.messages.settings.LogSettings in force after
        applying `update` (None: read only); raises InferError on a bad update."""

    async def trace_settings(self, model: str = "", update: dict | None = None) -> dict:
        """The trace extension: the global (`model` "") or a model's settings, as
        Triton's HTTP JSON, after applying `update` (None: read only)."""

    async def repository_index(self, ready: bool = False) -> list:
        """The model-repository extension's index: shm.messages.repository.IndexEntry
        rows for every model in the repositories (only READY versions if `ready`)."""

    async def repository_load(self, name: str, config: str | None = None,
                              files: dict[str, bytes] | None = None) -> None:
        """Load (or reload) a model, with an optional JSON config override and model
        files ("file:<version>/<name>" -> bytes); raises InferError."""

    async def repository_unload(self, name: str, unload_dependents: bool = False) -> None:
        """Unload a model (and, for an ensemble with `unload_dependents`, its steps)."""

    async def shm_call(self, op: str, kind: str, *, name: str = "", key: str = "",
                       offset: int = 0, byte_size: int = 0, device_id: int = 0,
                       raw_handle: bytes = b"") -> list:
        """A shared-memory extension call, answered by the scheduler (the registry).

        `op`: "register", "status" or "unregister"; `kind`: "system" or "cuda"; an empty
        `name` means every region of the kind (status, unregister). Returns a list of
        shm.messages.regions.RegionStatus (status; empty otherwise); raises InferError
        in the protocol-neutral form (code + message)."""


def unloaded(view: ModelView) -> bool:
    """A version unloaded (or being unloaded) by the repository API or a poll."""
    return view.state == ModelReadyState.UNLOADING or (
        view.state == ModelReadyState.UNAVAILABLE and view.reason == "unloaded")
