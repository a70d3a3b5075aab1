"""Header forwarding (--http/--grpc-header-forward-pattern) as pure logic."""

import pytest

from frontend.header_forward import forward
from shm.header_pattern import compile_forward_pattern as compile_pattern
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
    with pytest.raises(ValueError, match="header forward pattern: invalid regular"):
        compile_pattern("(")
    with pytest.raises(SystemExit):
        parse_args(["--model-repository", "/x", "--http-header-forward-pattern", "("])
    assert "--http-header-forward-pattern" in capsys.readouterr().err


def _forwarded(pattern: str, names) -> dict:
    params = {}
    forward(params, [(name, "v") for name in names], compile_pattern(pattern))
    return params


def test_pattern_matches_names_case_insensitively_as_triton():
    """Rule (issue 26, 8): Triton's RE2 matches the pattern case-insensitively, so
    `MY_HEADER.*` forwards the lower-case names clients send (Triton's own qa test,
    L0_parameters, sends `my_header_1` with the pattern `MY_HEADER.*`; checked on
    Triton 2.51 over HTTP)."""
    names = ["my_header_1", "my_header_2", "header_1"]
    assert _forwarded("MY_HEADER.*", names) == {"my_header_1": "v", "my_header_2": "v"}
    assert _forwarded("my_header.*", names) == {"my_header_1": "v", "my_header_2": "v"}
    assert _forwarded("^HEADER_1$", names) == {"header_1": "v"}


@pytest.mark.parametrize("pattern", ["(?-i)MY_HEADER.*", "(?s-i)MY_HEADER.*",
                                     "(?-is)MY_HEADER.*|OTHER"])
def test_re2_case_sensitive_prefix_is_accepted_and_makes_case_matter(pattern):
    """Rule: RE2's `(?-i)` (flags turned off for the rest of the pattern), which
    Python's re refuses, starts the server and makes case matter, as on Triton
    (checked on 2.51: gRPC key `my_header_b` is not forwarded by `(?-i)MY_HEADER.*`)."""
    assert _forwarded(pattern, ["my_header_1", "MY_HEADER_2"]) == {"MY_HEADER_2": "v"}
    parse_args(["--model-repository", "/x", "--grpc-header-forward-pattern", pattern])


@pytest.mark.parametrize("flag", ["--http-header-forward-pattern",
                                  "--grpc-header-forward-pattern"])
@pytest.mark.parametrize("pattern", ["(?-i", "a(?-i)b", "(?U)a+", "(?Q)"])
def test_unreadable_patterns_stop_the_start_naming_the_flag(flag, pattern, capsys):
    """Rule: a pattern neither RE2's rewrite nor Python's re can read (an open group,
    a flag turned off mid-pattern, RE2's ungreedy flag) stops the server at start with
    a clear error naming the flag, never a traceback or a server that forwards
    nothing."""
    with pytest.raises(SystemExit):
        parse_args(["--model-repository", "/x", flag, pattern])
    err = capsys.readouterr().err
    assert f"{flag}: invalid regular expression '{pattern}'" in err
    assert "Traceback" not in err
