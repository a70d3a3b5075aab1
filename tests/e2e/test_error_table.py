"""Triton's exact errors: every case of the error table (tests/data/error_cases.py), over
HTTP and over gRPC, answers with the status, code and message the real Triton 2.51
gave (tests/data/triton_errors_2.51.json, written by scripts/error_table.py), except
the few cases in DELIBERATE, where we differ on purpose and say why."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tests.data import error_cases
from tests.e2e.clients import PROTOCOLS, client
from tests.e2e.harness import ROOT, ServerProcess

pytestmark = pytest.mark.e2e

STORED = ROOT / "tests" / "data" / "triton_errors_2.51.json"
TRITON = json.loads(STORED.read_text())

_CLIENT_ERROR_500 = ("Triton answers 500 (INTERNAL) for a request body its JSON reader "
                     "cannot use; the fault is the client's, so 400 as for every other "
                     "malformed request (issue 11, 5b); the words are Triton's")


@dataclasses.dataclass
class Differs:
    """Where we answer otherwise than Triton 2.51 on purpose: what we answer instead
    (fields left None are Triton's), and why."""
    reason: str
    protocols: tuple = PROTOCOLS
    status: int | None = None   # HTTP
    code: str | None = None     # gRPC
    message: str | None = None
    message_prefix: str | None = None  # the rest comes from a different parser
    outcome: object = None  # protocol -> our whole outcome, where more than one answer


def _all_ok(protocol: str) -> dict:
    ok = error_cases.outcome_ok(protocol)
    return {**ok, "after": {"unregister": ok, "request": ok}}


_NOT_READY = "Request for unknown model: 'err_broken' has no available versions"
_NOT_READY_WHY = (
    "Triton's status and words, then why the model is not ready (its load error, which "
    "names the model's file and line), so the one who sent the request sees what to fix "
    "without the server's log; clients that match Triton's text by prefix or on the code "
    "see no difference (metadata and config calls answer exactly as Triton)")
_WHY = "RuntimeError: err_broken never loads"

_WAIT_FOR_USERS = (
    "Triton 2.51 refuses to unregister a region a request is using (500, INTERNAL). Here "
    "a response reaches its client straight from the worker, before the scheduler hears "
    "that the batch is done, so a client that unregisters right after its answer would "
    "be refused at random; the unregister call waits for the region's requests instead "
    "(the name goes at once) and succeeds, and the request succeeds")


DELIBERATE = {
    "classification_bytes": Differs(
        "Triton 2.51 crashes (the whole server) when a client asks for the classification "
        "of a BYTES output; we refuse the request instead",
        status=400, code="INVALID_ARGUMENT",
        message="class result not available for output due to unsupported type 'BYTES'"),
    "batch_zero_with_data": Differs(
        "Triton 2.51 runs a request whose shape says 0 items but which carries one item's "
        "bytes; the bytes contradict the shape, and a batch of nothing cannot be "
        "scheduled, so we refuse it", status=400, code="INVALID_ARGUMENT",
        message="[request id: <id_unknown>] inference request batch-size must be >= 1 "
                "for 'err_id'"),
    "shm_output_region_too_small": Differs(
        "Triton answers 500 (INTERNAL) for an output region the client sized too small; "
        "it is the client's error: 400 (INVALID_ARGUMENT), Triton's words",
        status=400, code="INVALID_ARGUMENT"),
    "http_malformed_json": Differs(
        _CLIENT_ERROR_500 + "; after the prefix comes our JSON parser's own description "
        "(Triton's is RapidJSON's)", ("http",), status=400,
        message_prefix="failed to parse the request JSON buffer: "),
    "negative_dim": Differs(_CLIENT_ERROR_500, ("http",), status=400),
    "http_no_inputs_field": Differs(_CLIENT_ERROR_500, ("http",), status=400),
    "http_json_data_count": Differs(_CLIENT_ERROR_500, ("http",), status=400),
    "http_json_data_wrong_type": Differs(_CLIENT_ERROR_500, ("http",), status=400),
    "http_shape_not_ints": Differs(_CLIENT_ERROR_500, ("http",), status=400),
    "model_not_ready": Differs(_NOT_READY_WHY, message_prefix=_NOT_READY + ": "),
    "model_not_ready_version": Differs(
        _NOT_READY_WHY, message_prefix="Request for unknown model: 'err_broken' version 1 "
                                       "is not at ready state: "),
    "shm_unregister_in_use": Differs(_WAIT_FOR_USERS, outcome=_all_ok),
    "shm_unregister_all_in_use": Differs(_WAIT_FOR_USERS, outcome=_all_ok),
}

PARAMS = [pytest.param(c, p, id=f"{c.id}-{p}") for c in error_cases.CASES
          for p in c.protocols]


@pytest.fixture(scope="module")
def table_server(tmp_path_factory):
    """The table's repository with the table's flags, client shared memory allowed (as
    Triton 2.51 allows it), and two frontends: a region registered through one is used
    through the other."""
    srv = ServerProcess(error_cases.REPOSITORY, *error_cases.SERVER_FLAGS,
                        "--allow-client-shm=true", frontends=2,
                        log_dir=tmp_path_factory.mktemp("error-table-logs"))
    yield from srv.serve()


def expected_outcome(case_id: str, protocol: str) -> dict:
    """Triton's stored outcome, or ours where DELIBERATE says we differ."""
    want = dict(TRITON["cases"][case_id][protocol])
    differs = DELIBERATE.get(case_id)
    if differs is not None and protocol in differs.protocols:
        if differs.outcome is not None:
            return differs.outcome(protocol)
        if protocol == "http" and differs.status is not None:
            want["status"] = differs.status
        if protocol == "grpc" and differs.code is not None:
            want["code"] = differs.code
        if differs.message is not None:
            want["message"] = differs.message
    return want


def test_the_stored_table_has_every_case():
    """Rule: every case of the table was run against the real Triton (a new case needs
    `scripts/error_table.py --case ID --merge ...` against it), and every deliberate
    difference names a case that exists, with a reason."""
    for c in error_cases.CASES:
        assert c.id in TRITON["cases"], c.id
        for protocol in c.protocols:
            assert protocol in TRITON["cases"][c.id], (c.id, protocol)
    ids = {c.id for c in error_cases.CASES}
    for case_id, differs in DELIBERATE.items():
        assert case_id in ids and differs.reason, case_id
    assert TRITON["version"] == "triton 2.51.0" and TRITON["date"]


@pytest.mark.parametrize("case,protocol", PARAMS)
def test_error_case_matches_triton(table_server, case, protocol):
    """Rule: the case's answer (HTTP status + error text, or gRPC code + message, and
    what follows where the case observes more) is the real Triton 2.51's, or the
    deliberate difference listed for it; and the server stays up."""
    got = error_cases.run_case(case, protocol, table_server.http_url,
                               table_server.grpc_url)
    want = expected_outcome(case.id, protocol)
    differs = DELIBERATE.get(case.id)
    if differs is not None and protocol in differs.protocols and differs.message_prefix:
        assert got.get("message", "").startswith(differs.message_prefix), got
        if differs.reason is _NOT_READY_WHY:
            assert _WHY in got["message"], got
        got = {k: v for k, v in got.items() if k != "message"}
        want = {k: v for k, v in want.items() if k != "message"}
    assert got == want
    assert client(table_server, protocol).is_server_live()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_valid_request_succeeds_after_the_table(table_server, protocol):
    """Rule: after every error of the table the server still serves a valid request."""
    from tests.e2e.clients import infer_input
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    c = client(table_server, protocol)
    result = c.infer("err_id", [infer_input(protocol, "INPUT0", x, "FP32"),
                                infer_input(protocol, "INPUT1", 2 * x, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), 2 * x)
