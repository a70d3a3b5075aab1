"""Header forwarding (--http/--grpc-header-forward-pattern) as pure logic."""

import pytest

from frontend.header_forward import compile_pattern, forward
from scheduler.cli import parse_args


def test_matching_headers_become_string_parameters():
    """Rule: a header whose name the pattern matches anywhere (a search, as Triton's
    partial match) becomes a string parameter; others, reserved gRPC keys and a
    parameter the request set itself are left alone."""
    params = {"x-b": "body"}
    forward(params, [(b"x-a", b"1"), (b"x-b", b"2"), (b"other", b"3"), (":path", "/p"),
                     ("grpc-timeout", "1S"), ("x-c-bin", b"\0")], compile_pattern("x-"))
    assert params == {"x-b": "body", "x-a": "1"}


def test_no_pattern_forwards_nothing():
    params = {}
    forward(params, [(b"x-a", b"1")], compile_pattern(""))
    assert params == {}


def test_bad_pattern_refused_at_start(capsys):
    """A pattern that is not a regular expression stops the server at start with the
    flag named, rather than failing every request later."""
    with pytest.raises(ValueError, match="invalid header forward pattern"):
        compile_pattern("(")
    with pytest.raises(SystemExit):
        parse_args(["--model-repository", "/x", "--http-header-forward-pattern", "("])
    assert "--http-header-forward-pattern" in capsys.readouterr().err
