"""The child specs (shm/messages/roles.py): one declaration from which the pools build
a child's command line and the child parses it back."""

import asyncio

import msgspec
import pytest

from scheduler.cli import parse_args
from scheduler.processes.frontend_pool import frontend_spec
from scheduler.processes.worker_pool import WorkerHandle, WorkerPool
from shm.argv import SpecError
from shm.messages.roles import FrontendSpec, GrpcKeepalive, TlsSettings, WorkerSpec
from shm.messages.settings import LogSettings

REQUIRED = {"address": "ipc:///run/f0", "scheduler": "ipc:///run/s",
            "segment_prefix": "/shmserve-1-f0g1"}


def _not_default(field):
    """A value of `field`'s type that differs from its default (if it has one)."""
    samples = {int: 12345, str: "some text -- with spaces", int | None: 4096}
    if field.type is bool:
        return not field.default
    if field.type in samples:
        return samples[field.type]
    return {"log_settings": LogSettings(log_verbose_level=3, log_file="/tmp/x.log"),
            "http_restricted_api": {"health": ("api-key", "secret")},
            "grpc_restricted_protocol": {"inference": ("triton-grpc-protocol-k", "v")},
            "grpc_frontend": "grpcio", "http_frontend": "uvicorn",
            "grpc_keepalive": GrpcKeepalive(keepalive_time_ms=1000,
                                            keepalive_permit_without_calls=True),
            "grpc_tls": TlsSettings("cert.pem", "key.pem", "ca.pem", mutual=True),
            }[field.name]


@pytest.mark.parametrize("cls", [FrontendSpec, WorkerSpec])
def test_every_field_round_trips_through_argv(cls):
    fields = msgspec.structs.fields(cls)
    spec = cls(**{f.name: _not_default(f) for f in fields})
    for f in fields:  # each value really differs from the default it overrides
        assert f.required or getattr(spec, f.name) != (
            f.default if f.default is not msgspec.NODEFAULT else f.default_factory())
    argv = spec.to_argv()
    # every field spelled once, as --field-name
    assert argv[::2] == ["--" + f.name.replace("_", "-") for f in fields]
    assert cls.from_argv(argv) == spec


@pytest.mark.parametrize("cls, extra", [(FrontendSpec, {"index": 2}),
                                        (WorkerSpec, {"name": "cpu worker"})])
def test_defaults_are_the_structs_own(cls, extra):
    """What a child assumes for a field it is not given is the struct's default,
    declared once; the round trip keeps it."""
    flags = {**REQUIRED, **extra}
    argv = [x for name, value in flags.items()
            for x in ("--" + name.replace("_", "-"), str(value))]
    spec = cls.from_argv(argv)
    assert spec == cls(**flags)
    assert cls.from_argv(spec.to_argv()) == spec


def test_the_frontend_defaults_are_what_production_runs():
    spec = FrontendSpec(index=0, **REQUIRED)
    assert (spec.grpc_frontend, spec.http_frontend) == ("native", "native")
    assert spec.grpc_tls is None
    assert spec.grpc_keepalive == GrpcKeepalive(7_200_000, 20_000, False, 2, 300_000, 2,
                                                0, 0)
    assert spec.log_settings == LogSettings()


@pytest.mark.parametrize("argv, error", [
    (["--index", "0", "--nope", "1"], "unknown argument '--nope'"),
    (["--index"], "--index needs a value"),
    (["--index", "zero"], "--index: not JSON"),
    (["--index", '"0"'], "Expected `int`, got `str`"),
    (["--index", "0", "--grpc-frontend", "h2"], "grpc_frontend"),
    (["--index", "0"], "missing required field `address`"),
])
def test_a_bad_command_line_is_refused_with_the_reason(argv, error):
    with pytest.raises(SpecError, match=error):
        FrontendSpec.from_argv(argv)


def test_the_frontend_pools_argv_parses_back_to_its_spec(certs):
    args = parse_args([
        "--model-repository", "/m", "--http-port", "18000", "--grpc-port", "18001",
        "--http-address", "127.0.0.1", "--allow-http=false", "--id", "edge-1",
        "--arena-mib", "8", "--arena-high-water-mib", "16", "--log-verbose", "2",
        "--http-restricted-api", "health:k=v", "--grpc-frontend", "grpcio",
        "--http-header-forward-pattern", "x-.*", "--http-max-input-size", "1000",
        "--grpc-keepalive-time", "1000", "--grpc-max-connection-age", "9000",
        "--grpc-use-ssl-mutual=true", "--grpc-server-cert", certs.server_cert,
        "--grpc-server-key", certs.server_key, "--grpc-root-cert", certs.ca])
    spec = frontend_spec(args, 1, "ipc:///run/f1", "/shmserve-1-f1g1", "ipc:///run/s")
    assert FrontendSpec.from_argv(spec.to_argv()) == spec
    assert (spec.index, spec.http_port, spec.grpc_port, spec.http_address) == (
        1, 18000, 18001, "127.0.0.1")
    assert (spec.allow_http, spec.allow_grpc, spec.server_id) == (False, True, "edge-1")
    assert (spec.arena_bytes, spec.arena_high_water) == (8 << 20, 16 << 20)
    assert spec.log_settings.log_verbose_level == 2
    assert spec.http_restricted_api == {"health": ("k", "v")}
    assert (spec.grpc_frontend, spec.http_header_forward_pattern,
            spec.http_max_input_size) == ("grpcio", "x-.*", 1000)
    assert (spec.grpc_keepalive.keepalive_time_ms,
            spec.grpc_keepalive.max_connection_age_ms) == (1000, 9000)
    assert spec.grpc_tls == TlsSettings(certs.server_cert, certs.server_key, certs.ca,
                                        mutual=True)


def test_the_worker_pools_argv_parses_back_to_its_spec():
    async def build():
        args = parse_args(["--model-repository", "/m", "--arena-mib", "4",
                           "--log-verbose", "1"])
        pool = WorkerPool(args, "/run", "/shmserve-1-", "ipc:///run/s", None,
                          lambda: [], lambda slots, how: None)
        device = WorkerHandle("gpu:1 worker", "ipc:///run/w1", "/shmserve-1-w1", "gpu:1")
        python = WorkerHandle("add_sub/1/add_sub_0_0#2", "ipc:///run/w2", "/shmserve-1-w2")
        return pool.spec(device), pool.spec(python)

    device, python = asyncio.run(build())
    for spec in (device, python):
        assert WorkerSpec.from_argv(spec.to_argv()) == spec
        assert (spec.scheduler, spec.arena_bytes, spec.arena_high_water) == (
            "ipc:///run/s", 4 << 20, None)
        assert spec.log_settings.log_verbose_level == 1
    assert (device.name, device.device, device.segment_prefix) == (
        "gpu:1 worker", "gpu:1", "/shmserve-1-w1")
    assert python.device == "cpu"  # a python instance's own worker
