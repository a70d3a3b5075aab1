"""Frontend <-> scheduler."""

from __future__ import annotations

import enum

import msgspec

from shm.messages.leases import LeaseEnded
from shm.messages.regions import RegionReply, RegionRequest, RegionShared, RegionUnshared
from shm.messages.repository import ModelReadyState, RepositoryReply, RepositoryRequest
from shm.messages.results import Error, InferResponse, PeerGone, ReleaseBlocks
from shm.messages.settings import (LogSettings, LogSettingsReply, LogSettingsRequest,
                                   TraceSettingReply, TraceSettingRequest)
from shm.tensor import TensorRef


class RequestedOutput(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    """An output the client asked for. `target`, when set, is the client region the
    output must be written into (a TensorRef with `region` != 0, no data)."""

    name: str
    parameters: dict = {}
    target: TensorRef | None = None


class RequestOrigin(enum.IntEnum):
    """Who made a request: a client through a frontend, a python model's execute()
    (BLS), an ensemble's step, or a model's warmup (an unknown one does not
    decode)."""

    CLIENT = 0
    BLS = 1
    ENSEMBLE = 2
    WARMUP = 3


class InferRequest(msgspec.Struct, tag=True, array_like=True, omit_defaults=True,
                   frozen=True):
    """One inference request. `id` is unique within `reply_to` (the requester's inbox);
    responses go straight there from the worker that ran it. `version` 0 means the
    version policy's choice. `outputs` None means every output. Frozen: what the
    scheduler learns about a request while it waits (queue entry, trace, cache lookup)
    lives in its own record (scheduler/scheduling/queued.py), and the struct goes on to
    the worker in ExecuteBatch as the requester sent it."""

    id: int
    reply_to: str
    model: str
    version: int
    inputs: list[TensorRef]
    outputs: list[RequestedOutput] | None = None
    request_id: str = ""  # the client's id string
    batch_size: int = 1
    priority: int = 0
    timeout_us: int = 0
    sequence_id: int | str = 0
    sequence_start: bool = False
    sequence_end: bool = False
    parameters: dict = {}
    # CLOCK_MONOTONIC ns: set by the frontend once the request is valid (Triton's
    # request start)
    start_ns: int = 0
    # the response cache key (frontend/cache_key.py), set only for models that cache
    cache_key: bytes = b""
    # BLS: the models whose execute() made this call, outermost first (empty for a
    # client's request); the scheduler refuses a call to a model already in it, which
    # would wait for itself.
    callers: list[str] = []
    # a BLS request's batch size is the scheduler's to derive from the callee's config,
    # as a frontend does from the one it was pushed
    origin: RequestOrigin = RequestOrigin.CLIENT


class CancelRequest(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The client went away: drop request `id` of `reply_to` if it has not run yet;
    if it is running, the scheduler forwards this to the worker running it, where
    the model sees `request.is_cancelled()` turn true."""

    id: int
    reply_to: str


class FrontendReady(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """A frontend is listening; it wants the model table."""

    index: int
    address: str
    pid: int


class ModelStateUpdate(msgspec.Struct, tag=True, array_like=True, omit_defaults=True,
                       frozen=True):
    """The state of one model version. `config` is serialized `ModelConfig` bytes and
    `config_json` the JSON Triton's config endpoint prints, so frontends validate and
    answer metadata without asking."""

    name: str
    version: int
    state: ModelReadyState
    reason: str = ""
    config: bytes = b""
    config_json: bytes = b""
    # responses are cached: the config enables response_cache and the server has a
    # cache; only then do frontends compute cache keys
    cache: bool = False
    # output name -> its class labels (the lines of the output's `label_filename` in
    # the model directory), for the classification extension's "score:index:label"
    labels: dict[str, list[str]] = {}


class ServerState(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Server readiness as a whole (false while loading and while stopping)."""

    ready: bool
    stopping: bool = False
    # --strict-readiness: the frontends then answer ready only while every model
    # version in their table is READY (or was unloaded), as Triton's IsReady
    strict: bool = True


class Drain(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Stop taking requests, finish those in flight within `timeout_s`, then exit."""

    timeout_s: float


class FrontendStopped(msgspec.Struct, tag=True, array_like=True, frozen=True):
    index: int
    abandoned: int  # requests still in flight when the drain timed out


class CacheInsert(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The outputs of a request that missed the response cache and succeeded, sent once
    by the frontend that answered it, inline, for the scheduler to cache under `key`."""

    key: bytes
    model: str
    version: int
    outputs: list[TensorRef]


class StatsRequest(msgspec.Struct, tag=True, array_like=True, omit_defaults=True,
                   frozen=True):
    """The statistics extension: every ready model version (`model` empty), every ready
    version of `model` (`version` -1), or one version."""

    call_id: int
    reply_to: str
    model: str = ""
    version: int = -1


class StatsReply(msgspec.Struct, tag=True, array_like=True, omit_defaults=True):
    """`body` is the statistics JSON as Triton's HTTP endpoint returns it; gRPC
    frontends parse it into ModelStatisticsResponse."""

    call_id: int
    error: Error | None = None
    body: bytes = b""


TO_SCHEDULER_FROM_FRONTEND = (InferRequest, CancelRequest, FrontendReady, FrontendStopped,
                               RegionRequest, StatsRequest, CacheInsert,
                               LogSettingsRequest, TraceSettingRequest, RepositoryRequest)
FRONTEND_INBOX = (InferResponse, ModelStateUpdate, ServerState, Drain, PeerGone,
                  ReleaseBlocks, RegionReply, StatsReply, LogSettingsReply,
                  TraceSettingReply, LogSettings, RepositoryReply, LeaseEnded,
                  RegionShared, RegionUnshared)
