"""Scheduler -> a child it starts: what the child is, as one frozen spec per role.

The pools (scheduler/processes/) build a spec and start the child with its argv
(`spec.to_argv()`); the child's main parses it back (`Spec.from_argv`). The fields,
their types and their defaults are written here and nowhere else. The defaults are
what a child assumes when a field is not given; the server's own defaults, the ones
users see, are `tritonserver`'s and live in the scheduler's CLI.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from shm.argv import ArgvSpec
from shm.messages.settings import LogSettings


class GrpcKeepalive(msgspec.Struct, frozen=True):
    """Triton's gRPC keepalive, PING abuse and connection age flags in milliseconds,
    with Triton's defaults (grpc-core's server defaults; for the age, Triton passes
    nothing to grpc-core while the flag is 0)."""

    keepalive_time_ms: int = 7_200_000
    keepalive_timeout_ms: int = 20_000
    keepalive_permit_without_calls: bool = False
    http2_max_pings_without_data: int = 2
    http2_min_recv_ping_interval_without_data_ms: int = 300_000
    http2_max_ping_strikes: int = 2
    max_connection_age_ms: int = 0
    max_connection_age_grace_ms: int = 0


class TlsSettings(msgspec.Struct, frozen=True):
    """gRPC over TLS: PEM file paths; `mutual`: require and verify client certificates."""

    server_cert: str
    server_key: str
    root_cert: str = ""
    mutual: bool = False


class ChildSpec(ArgvSpec, frozen=True, kw_only=True):
    """What every child is given: its inbox, the scheduler's, its arena, its logging."""

    address: str  # this child's inbox
    scheduler: str  # the scheduler's inbox
    segment_prefix: str  # names of the shared-memory segments this child creates
    arena_bytes: int = 64 << 20  # one arena chunk
    # bytes of free arena segments kept for reuse; None: the arena's default (4 chunks)
    arena_high_water: int | None = None
    log_settings: LogSettings = msgspec.field(default_factory=LogSettings)


class FrontendSpec(ChildSpec, frozen=True, kw_only=True):
    """A frontend process (frontend/main.py): its ports and protocol settings."""

    index: int  # which of the frontends; a restarted one keeps its index
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    allow_http: bool = True
    allow_grpc: bool = True
    http_header_forward_pattern: str = ""
    grpc_header_forward_pattern: str = ""
    server_id: str = "shmserve"  # the server metadata's name
    # {API group: (header or metadata key, value)}, parsed by the scheduler's CLI
    http_restricted_api: dict[str, tuple[str, str]] = {}
    grpc_restricted_protocol: dict[str, tuple[str, str]] = {}
    http_max_input_size: int = 1 << 26
    grpc_frontend: Literal["native", "grpcio"] = "native"
    http_frontend: Literal["native", "uvicorn"] = "native"
    grpc_keepalive: GrpcKeepalive = GrpcKeepalive()
    grpc_tls: TlsSettings | None = None  # None: plain gRPC


class WorkerSpec(ChildSpec, frozen=True, kw_only=True):
    """A worker process (workers/main.py)."""

    name: str  # what it hosts, e.g. "cpu worker" or "add_sub/1/add_sub_0_0#3"
    # "cpu", or "gpu:N" for a device worker pinned to GPU N (see shm/devices.py)
    device: str = "cpu"
    # how its threads wait for a GPU (--cuda-sync; shm.cuda.set_sync)
    cuda_sync: str = "auto"
