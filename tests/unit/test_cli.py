"""The command line: Triton flag names carry over, nothing is silently ignored."""

from __future__ import annotations

import logging

import pytest

from scheduler.cli import IGNORED_FLAGS, parse_args, warn_ignored

BASE = ["--model-repository", "repo"]


def test_prefix_abbreviations_refused(capsys):
    """A prefix of a flag (--model-repo, --http-po) is an error, not that flag."""
    with pytest.raises(SystemExit) as e:
        parse_args(["--model-repo", "repo"])
    assert e.value.code == 2
    assert "unrecognized arguments: --model-repo repo" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args([*BASE, "--http-po", "9000"])


def test_strict_readiness_default_true_and_false():
    """--strict-readiness defaults to true, as tritonserver's."""
    assert parse_args(BASE).strict_readiness is True
    assert parse_args([*BASE, "--strict-readiness=false"]).strict_readiness is False


def test_grpc_frontend_defaults_to_native():
    """The native HTTP/2 gRPC transport serves unless grpc.aio is asked for."""
    assert parse_args(BASE).grpc_frontend == "native"
    assert parse_args([*BASE, "--grpc-frontend", "grpcio"]).grpc_frontend == "grpcio"
    with pytest.raises(SystemExit):
        parse_args([*BASE, "--grpc-frontend", "h2"])


def test_http_frontend_defaults_to_native():
    """The native HTTP/1.1 transport serves unless uvicorn is asked for."""
    assert parse_args(BASE).http_frontend == "native"
    assert parse_args([*BASE, "--http-frontend", "uvicorn"]).http_frontend == "uvicorn"
    with pytest.raises(SystemExit):
        parse_args([*BASE, "--http-frontend", "h11"])


def test_poll_mode_takes_poll_secs_with_tritons_default():
    """--model-control-mode=poll works: --repository-poll-secs defaults to Triton's 15
    and is not warned about there."""
    args = parse_args([*BASE, "--model-control-mode=poll"])
    assert args.repository_poll_secs == 15.0
    assert "--repository-poll-secs" not in args.ignored_flags
    args = parse_args([*BASE, "--model-control-mode=poll", "--repository-poll-secs", "2"])
    assert args.repository_poll_secs == 2.0


def test_bad_poll_secs_and_load_thread_count_refused(capsys):
    """A poll interval of 0 and a load thread count of 0 are refused by name."""
    with pytest.raises(SystemExit):
        parse_args([*BASE, "--model-control-mode=poll", "--repository-poll-secs", "0"])
    assert "--repository-poll-secs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args([*BASE, "--model-load-thread-count", "0"])
    assert "--model-load-thread-count" in capsys.readouterr().err
    assert parse_args(BASE).model_load_thread_count == 4


def test_repository_poll_secs_warned(caplog):
    """--repository-poll-secs does nothing outside poll mode: a warning says so."""
    args = parse_args([*BASE, "--repository-poll-secs", "5"])
    assert args.ignored_flags == ["--repository-poll-secs"]
    with caplog.at_level(logging.WARNING, logger="shmserve.scheduler"):
        warn_ignored(args)
    assert "--repository-poll-secs is ignored" in caplog.text


def test_every_triton_only_flag_accepted_with_one_warning(caplog):
    """Each tritonserver flag for a part shmserve lacks is accepted and warned about
    once, so a Triton command line carries over."""
    argv = list(BASE)
    for flag, _ in IGNORED_FLAGS:
        argv += [flag, "1"]
    args = parse_args(argv)
    assert args.ignored_flags == [flag for flag, _ in IGNORED_FLAGS]
    with caplog.at_level(logging.WARNING, logger="shmserve.scheduler"):
        warn_ignored(args)
    for flag, _ in IGNORED_FLAGS:
        assert sum(flag + " is ignored" in r.getMessage() for r in caplog.records) == 1
    assert not any(name.startswith("triton_only_") for name in vars(args))


def test_no_warning_without_triton_only_flags():
    assert parse_args(BASE).ignored_flags == []


def test_repeatable_triton_only_flags():
    """--cuda-memory-pool-byte-size is per GPU in Triton, so it may be repeated."""
    args = parse_args([*BASE, "--cuda-memory-pool-byte-size", "0:1024",
                       "--cuda-memory-pool-byte-size", "1:1024"])
    assert args.ignored_flags == ["--cuda-memory-pool-byte-size"]


@pytest.mark.parametrize("flag", ["--allow-sagemaker", "--allow-vertex-ai",
                                  "--reuse-http-port", "--model-namespacing"])
def test_harmful_flags_refused_when_true(flag, capsys):
    """Ignoring another endpoint would change what clients see: true is refused with
    the flag named, false is accepted quietly."""
    assert parse_args([*BASE, f"{flag}=false"]).ignored_flags == []
    with pytest.raises(SystemExit) as e:
        parse_args([*BASE, f"{flag}=true"])
    assert e.value.code == 2
    assert f"{flag}=true" in capsys.readouterr().err


def test_disable_auto_complete_config_is_strict_model_config():
    assert parse_args(BASE).strict_model_config is False
    assert parse_args([*BASE, "--disable-auto-complete-config"]).strict_model_config


def test_old_trace_flags_become_trace_config():
    """tritonserver's --trace-rate / --trace-level work as --trace-config items."""
    plain = parse_args(BASE).trace_config
    args = parse_args([*BASE, "--trace-rate", "7", "--trace-level", "TIMESTAMPS"])
    assert args.trace_config == parse_args(
        [*BASE, "--trace-config", "rate=7", "--trace-config", "level=TIMESTAMPS"]
    ).trace_config
    assert args.trace_config != plain


def test_id_sets_server_id():
    assert parse_args(BASE).server_id == "shmserve"
    assert parse_args([*BASE, "--id", "edge-1"]).server_id == "edge-1"


def test_model_repository_required(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--http-port", "9000"])
    assert e.value.code == 2
    assert "--model-repository must be specified" in capsys.readouterr().err


def test_cpus_list_and_the_frontend_default(monkeypatch, capsys):
    """--cpus takes taskset's list syntax, only CPUs this process may use; the default
    frontend count is half of the CPUs the server runs on."""
    import scheduler.cli as cli
    monkeypatch.setattr(cli, "available_cpus", lambda: {0, 1, 2, 3, 4, 5, 8})
    monkeypatch.setattr(cli, "cgroup_cpu_quota", lambda: None)  # whatever runs the tests
    assert cli.parse_cpu_list("0-2,5") == {0, 1, 2, 5}
    assert cli.parse_cpu_list(" 8 , 3-4") == {3, 4, 8}
    args = parse_args([*BASE, "--cpus", "0-3"])
    assert args.cpus == {0, 1, 2, 3} and args.frontend_processes == 2
    assert parse_args([*BASE, "--cpus", "5"]).frontend_processes == 1
    assert parse_args(BASE).frontend_processes == 3  # 7 CPUs available
    assert parse_args([*BASE, "--cpus", "0-3", "--frontend-processes", "3"]
                      ).frontend_processes == 3
    for text, reason in (("1-x", "'1-x' is not a CPU number"), ("3-1", "'3-1' is not a range"),
                         ("", "'' is not a CPU number"),
                         ("4-7", "CPU 6, 7 is not available here (available: 0-5,8)")):
        with pytest.raises(SystemExit) as e:
            parse_args([*BASE, "--cpus", text])
        assert e.value.code == 2
        assert reason in capsys.readouterr().err


# ------------------------------------------------------ gRPC keepalive, age and TLS


def frontend_settings(args):
    """What a frontend makes of the command line the frontend pool hands it."""
    from frontend.main import keepalive_settings
    from scheduler.processes.frontend_pool import frontend_spec
    from shm.messages.roles import FrontendSpec
    fe = FrontendSpec.from_argv(frontend_spec(args, 0, "a", "p", "s").to_argv())
    return keepalive_settings(fe), fe.grpc_tls


def test_grpc_keepalive_flags_reach_the_frontends_with_tritons_defaults():
    from frontend.transport.h2_keepalive import KeepaliveSettings
    keepalive, tls = frontend_settings(parse_args(BASE))
    assert keepalive == KeepaliveSettings(
        keepalive_time_ms=7_200_000, keepalive_timeout_ms=20_000,
        keepalive_permit_without_calls=False, http2_max_pings_without_data=2,
        http2_min_recv_ping_interval_without_data_ms=300_000, http2_max_ping_strikes=2,
        max_connection_age_ms=0, max_connection_age_grace_ms=0)
    assert tls is None
    args = parse_args([*BASE, "--grpc-keepalive-time", "1000",
                       "--grpc-keepalive-timeout=50",
                       "--grpc-keepalive-permit-without-calls", "1",
                       "--grpc-http2-max-pings-without-data", "0",
                       "--grpc-http2-min-recv-ping-interval-without-data", "700",
                       "--grpc-http2-max-ping-strikes", "5", "--grpc-max-connection-age",
                       "9000", "--grpc-max-connection-age-grace", "300"])
    assert args.ignored_flags == []
    assert frontend_settings(args)[0] == KeepaliveSettings(1000, 50, True, 0, 700, 5,
                                                           9000, 300)


@pytest.mark.parametrize("argv, error", [
    (["--grpc-keepalive-time", "0"], "--grpc-keepalive-time must be at least 1"),
    (["--grpc-max-connection-age", "-1"], "--grpc-max-connection-age must be 0 or more"),
    (["--grpc-http2-max-ping-strikes", "-2"], "--grpc-http2-max-ping-strikes must be 0"),
    (["--grpc-keepalive-time", "soon"], "invalid int value: 'soon'"),
    (["--grpc-use-ssl=true"], "--grpc-use-ssl=true needs --grpc-server-cert and "
                              "--grpc-server-key"),
])
def test_bad_grpc_transport_values_refused(argv, error, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args([*BASE, *argv])
    assert e.value.code == 2
    assert error in capsys.readouterr().err


def test_grpc_tls_flags(tmp_path, capsys, caplog, certs):
    """TLS files are loaded once at start, so a bad one fails the command line with
    the flag named; mutual TLS implies TLS and needs the root certificate; the files
    alone, without --grpc-use-ssl, are warned about as Triton ignores them."""
    files = ["--grpc-server-cert", certs.server_cert, "--grpc-server-key", certs.server_key]
    _, tls = frontend_settings(parse_args([*BASE, "--grpc-use-ssl=true", *files]))
    assert (tls.server_cert, tls.server_key, tls.mutual) == (
        certs.server_cert, certs.server_key, False)
    _, tls = frontend_settings(parse_args([*BASE, "--grpc-use-ssl-mutual=true", *files,
                                           "--grpc-root-cert", certs.ca]))
    assert tls.mutual and tls.root_cert == certs.ca
    bad = [(["--grpc-use-ssl-mutual=true", *files], "needs --grpc-root-cert"),
           (["--grpc-use-ssl=true", "--grpc-server-cert", certs.server_cert,
             "--grpc-server-key", certs.client_key], "--grpc-server-cert"),
           (["--grpc-use-ssl=true", *files, "--grpc-root-cert", str(tmp_path / "none")],
            "--grpc-root-cert")]
    for argv, error in bad:
        with pytest.raises(SystemExit):
            parse_args([*BASE, *argv])
        assert error in capsys.readouterr().err
    args = parse_args([*BASE, *files])
    assert args.ignored_flags == ["--grpc-server-cert", "--grpc-server-key"]
    assert frontend_settings(args)[1] is None
    with caplog.at_level(logging.WARNING, logger="shmserve.scheduler"):
        warn_ignored(args)
    assert "--grpc-server-cert is ignored: it is only used with --grpc-use-ssl=true" \
        in caplog.text
