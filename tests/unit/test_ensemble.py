"""The ensemble scheduler as a pure state machine: a fake host takes the step requests
it submits and the tests answer them, so each rule is checked without processes."""

import pytest
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from scheduler.repository.config import ConfigError, normalize, validate
from scheduler.scheduling.ensemble import EnsembleError, EnsembleScheduler, check_steps
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import InferRequest, RequestedOutput
from shm.messages.results import Error, InferResponse
from shm.messages.worker import BatchDone
from shm.tensor import TensorRef

SCHED = "ipc:///run/scheduler"


def config(text: str) -> ModelConfig:
    c = normalize(text_format.Parse(text, ModelConfig()))
    validate(c)
    return c


def io(kind, name, dims="[ 16 ]", dtype="TYPE_FP32"):
    return f'{kind} [{{ name: "{name}" data_type: {dtype} dims: {dims} }}] '


def step(model, inputs: dict, outputs: dict, version=-1):
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: {version} {ins} {outs} }}'


def ensemble(steps, inputs=("IN",), outputs=("OUT",), mbs=8):
    text = f'name: "ens" platform: "ensemble" max_batch_size: {mbs} '
    text += "".join(io("input", n) for n in inputs) + "".join(io("output", n) for n in outputs)
    return config(text + "ensemble_scheduling { step [ " + ", ".join(steps) + " ] }")


def model(name, inputs=("INPUT0",), outputs=("OUTPUT0",), mbs=8, dims="[ 16 ]",
          dtype="TYPE_FP32", extra=""):
    text = f'name: "{name}" backend: "python" max_batch_size: {mbs} '
    text += "".join(io("input", n, dims, dtype) for n in inputs)
    text += "".join(io("output", n, dims, dtype) for n in outputs)
    return config(text + extra)


# A -> T -> B, and T -> C: a chain with a parallel branch reading one block twice
DIAMOND = ensemble([
    step("a", {"INPUT0": "IN"}, {"OUTPUT0": "T"}),
    step("b", {"INPUT0": "T"}, {"OUTPUT0": "OUT_B"}),
    step("c", {"INPUT0": "T"}, {"OUTPUT0": "OUT_C"}),
], outputs=("OUT_B", "OUT_C"))


class FakeHost:
    address = SCHED

    def __init__(self, refuse=()):
        self.ids = iter(range(100, 10_000))
        self.submitted: list[InferRequest] = []
        self.routes = {}
        self.refuse = set(refuse)
        self.finished: list[tuple[InferRequest, InferResponse, dict]] = []
        self.released: list[tuple[str, tuple[str, int]]] = []
        self.cancelled: list[int] = []

    def submit(self, owner, req):
        if req.model in self.refuse:
            raise InferError(ErrorCode.UNAVAILABLE, f"model '{req.model}' is not ready")
        req.id, req.reply_to = next(self.ids), self.address
        self.routes[req.id] = owner
        self.submitted.append(req)

    def forget(self, request_id):
        self.routes.pop(request_id, None)

    def cancel(self, request_id):
        self.cancelled.append(request_id)

    def finish(self, req, response, lent):
        self.finished.append((req, response, lent))

    def release(self, owner, blocks):
        self.released.extend((owner, b) for b in blocks)

    def running(self, model):
        return [r for r in self.submitted if r.model == model]


def client_request(**kw):
    inp = TensorRef("IN", "FP32", [1, 16], segment="fe-seg", offset=0, nbytes=64)
    return InferRequest(7, "ipc:///run/frontend0", "ens", 0, [inp], start_ns=1, **kw)


def answer(sched, req, owner="ipc:///run/worker-a", offset=0, error="", now=10):
    """The step's worker answers: each requested output as a block of its arena."""
    if error:
        sched.on_response(InferResponse(req.id, error=Error(ErrorCode.INTERNAL, error)),
                          now)
        return
    outs = [TensorRef(o.name, "FP32", [1, 16], segment=f"{owner}-seg", offset=offset + i,
                      nbytes=64) for i, o in enumerate(req.outputs)]
    sched.on_response(InferResponse(req.id, outputs=outs, owner=owner), now)


def ran(sched, req, phases=(0, 10, 30, 60)):
    sched.step_ran(req.id, BatchDone(1, "inst", *phases))


def test_steps_run_as_soon_as_their_inputs_exist_and_branches_run_together():
    """Rule: a step starts once every tensor it reads exists; independent steps are
    submitted together, not one after another."""
    host = FakeHost()
    sched = EnsembleScheduler("ens", 1, DIAMOND, host)
    sched.enqueue(client_request(), 5)
    assert [r.model for r in host.submitted] == ["a"]  # b and c wait for T
    (a,) = host.submitted
    assert [t.name for t in a.inputs] == ["INPUT0"] and a.inputs[0].segment == "fe-seg"
    answer(sched, a)
    assert sorted(r.model for r in host.submitted) == ["a", "b", "c"]
    b, c = host.running("b")[0], host.running("c")[0]
    # both read A's output block in place: the same segment and offset, renamed
    assert b.inputs[0].segment == c.inputs[0].segment == "ipc:///run/worker-a-seg"
    assert b.inputs[0].name == c.inputs[0].name == "INPUT0"
    assert host.finished == []


def test_a_block_read_by_two_steps_is_released_once_both_answered():
    """Rule: an intermediate block feeding several steps goes back to its owner only
    when its last reader is done, and exactly once."""
    host = FakeHost()
    sched = EnsembleScheduler("ens", 1, DIAMOND, host)
    sched.enqueue(client_request(), 5)
    answer(sched, host.submitted[0])  # T at worker-a offset 0
    t_block = ("ipc:///run/worker-a", ("ipc:///run/worker-a-seg", 0))
    answer(sched, host.running("b")[0], owner="ipc:///run/worker-b")
    assert t_block not in host.released  # c still reads it
    answer(sched, host.running("c")[0], owner="ipc:///run/worker-c")
    assert host.released.count(t_block) == 1
    (req, resp, lent), = host.finished
    assert not resp.error
    assert [o.name for o in resp.outputs] == ["OUT_B", "OUT_C"]
    # the final outputs are lent to the client, not released here
    assert lent == {("ipc:///run/worker-b-seg", 0): "ipc:///run/worker-b",
                    ("ipc:///run/worker-c-seg", 0): "ipc:///run/worker-c"}
    assert all(b[0] != "ipc:///run/worker-b" and b[0] != "ipc:///run/worker-c"
               for b in host.released)


def test_outputs_the_client_did_not_ask_for_are_released_and_not_sent():
    """Rule: the client's requested outputs are the response; a step that only makes
    outputs nobody asked for does not run (Triton prunes it), and an unrequested output
    of a step that runs is given back to its owner."""
    ens = ensemble([
        step("a", {"INPUT0": "IN"}, {"OUTPUT0": "T", "OUTPUT1": "OUT_X"}),
        step("b", {"INPUT0": "T"}, {"OUTPUT0": "OUT_B"}),
        step("c", {"INPUT0": "T"}, {"OUTPUT0": "OUT_C"}),
    ], outputs=("OUT_X", "OUT_B", "OUT_C"))
    host = FakeHost()
    sched = EnsembleScheduler("ens", 1, ens, host)
    sched.enqueue(client_request(outputs=[RequestedOutput("OUT_C")]), 5)
    a = host.submitted[0]
    answer(sched, a)  # each output at its place in the request (a protobuf map's order)
    x = [o.name for o in a.outputs].index("OUTPUT1")  # OUT_X: nobody reads it
    assert ("ipc:///run/worker-a", ("ipc:///run/worker-a-seg", x)) in host.released
    answer(sched, host.running("c")[0], owner="ipc:///run/worker-c")
    assert [r.model for r in host.submitted] == ["a", "c"]  # b feeds nothing wanted
    (_, resp, lent), = host.finished
    assert [o.name for o in resp.outputs] == ["OUT_C"]
    # T's only reader (c) is done: back to its owner, not kept until the end
    assert ("ipc:///run/worker-a", ("ipc:///run/worker-a-seg", 1 - x)) in host.released
    assert list(lent.values()) == ["ipc:///run/worker-c"]
    assert not sched.active


def test_a_failing_step_fails_the_request_naming_the_step_after_running_steps_end():
    """Rule: a failing step fails the ensemble request with Triton's "in ensemble"
    prefix and the step's model; the answer waits for steps still running, and every
    block is given back."""
    host = FakeHost()
    sched = EnsembleScheduler("ens", 1, DIAMOND, host)
    sched.enqueue(client_request(), 5)
    answer(sched, host.submitted[0])
    answer(sched, host.running("b")[0], error="negative input")
    assert host.finished == []  # c still runs
    answer(sched, host.running("c")[0], owner="ipc:///run/worker-c")
    (_, resp, _), = host.finished
    assert resp.error.message == "in ensemble 'ens', step 1 (model 'b'): negative input"
    assert resp.error.code == ErrorCode.INTERNAL
    released = {b for _, b in host.released}
    assert released == {("ipc:///run/worker-a-seg", 0), ("ipc:///run/worker-c-seg", 0)}
    assert sched.stats.fail_count == 1 and sched.stats.success_count == 0
    assert not sched.active and not host.routes


def test_a_failure_starts_no_further_step():
    """Rule: after a step failed, steps waiting for its outputs never start."""
    host = FakeHost()
    sched = EnsembleScheduler("ens", 1, DIAMOND, host)
    sched.enqueue(client_request(), 5)
    answer(sched, host.submitted[0], error="boom")
    assert [r.model for r in host.submitted] == ["a"]
    (_, resp, _), = host.finished
    assert "step 0 (model 'a'): boom" in resp.error.message


def test_a_step_whose_model_is_not_ready_fails_the_request():
    """Rule: a step refused by its model (not ready) fails the request, naming it."""
    host = FakeHost(refuse={"a"})
    sched = EnsembleScheduler("ens", 1, DIAMOND, host)
    sched.enqueue(client_request(), 5)
    (_, resp, _), = host.finished
    assert resp.error.message == ("in ensemble 'ens', step 0 (model 'a'): model 'a' is "
                                  "not ready")
    assert resp.error.code == ErrorCode.UNAVAILABLE


def test_sequence_fields_priority_and_client_regions_flow_to_the_steps():
    """Rule: correlation id and sequence flags go to every step (stateful steps need
    them); an ensemble output the client wants in its region is written there by the
    step that makes it."""
    host = FakeHost()
    sched = EnsembleScheduler("ens", 1, DIAMOND, host)
    target = TensorRef("OUT_C", "FP32", [], segment="/client", offset=128, nbytes=64, region=3)
    sched.enqueue(client_request(sequence_id="seq-1", sequence_start=True, priority=2,
                                 outputs=[RequestedOutput("OUT_C", target=target),
                                          RequestedOutput("OUT_B")]), 5)
    a = host.submitted[0]
    assert (a.sequence_id, a.sequence_start, a.sequence_end, a.priority) == ("seq-1", True,
                                                                               False, 2)
    answer(sched, a)
    c = host.running("c")[0]
    assert c.outputs[0].name == "OUTPUT0" and c.outputs[0].target == target
    assert host.running("b")[0].outputs[0].target is None


def test_statistics_count_the_request_once_with_its_steps_compute_summed():
    """Rule (Triton's ensemble statistics): one success and one execution per request,
    compute phases summed over its steps, whether a step's BatchDone comes before or
    after its response."""
    host = FakeHost()
    sched = EnsembleScheduler("ens", 1, DIAMOND, host)
    sched.enqueue(client_request(batch_size=1), 5)
    a = host.submitted[0]
    ran(sched, a)  # BatchDone before the response (relayed responses)
    answer(sched, a)
    b, c = host.running("b")[0], host.running("c")[0]
    answer(sched, b)
    answer(sched, c, now=100)
    assert host.finished and sched.stats.success_count == 0  # two timings still due
    ran(sched, b)
    ran(sched, c)
    st = sched.stats
    assert (st.success_count, st.execution_count, st.inference_count) == (1, 1, 1)
    assert (st.compute_input_ns, st.compute_infer_ns, st.compute_output_ns) == (30, 60, 90)
    assert st.success_ns == 100 - 1
    assert list(st.batches) == [1]
    assert not host.routes and not sched.runs


def test_cancel_drops_queued_steps_and_answers_once_they_end():
    """Rule: a cancelled ensemble request cancels its steps; its answer is CANCELLED."""
    host = FakeHost()
    sched = EnsembleScheduler("ens", 1, DIAMOND, host)
    req = client_request()
    sched.enqueue(req, 5)
    a = host.submitted[0]
    assert sched.cancel(req.reply_to, req.id, 6)
    assert host.cancelled == [a.id]
    cancelled = Error(ErrorCode.CANCELLED, "request was cancelled")
    sched.on_response(InferResponse(a.id, error=cancelled), 7)
    (_, resp, _), = host.finished
    assert resp.error.code == ErrorCode.CANCELLED
    assert not sched.cancel(req.reply_to, req.id, 8)


# -- load-time checks ------------------------------------------------------------------


def test_graph_checks_use_tritons_messages():
    """Rule: the data flow is checked at load: tensors never produced, unused tensors,
    cycles, a tensor written twice (ValidateEnsembleSchedulingConfig)."""
    def rejects(steps, message, **kw):
        with pytest.raises(ConfigError) as e:
            ensemble(steps, **kw)
        assert str(e.value) == message

    # (Triton's text, stray quote included)
    rejects([step("a", {"INPUT0": "IN"}, {"OUTPUT0": "T"})],
            "ensemble output 'OUT' for ensemble ens' is not used")
    rejects([step("a", {"INPUT0": "IN"}, {"OUTPUT0": "T"}),
             step("b", {"INPUT0": "X"}, {"OUTPUT0": "OUT"})],
            "output 'OUT' for ensemble 'ens' is not written: at least one of its depending "
            "tensors, 'X', is not connected")
    # a cycle: T1 needs T2 which needs T1
    rejects([step("a", {"INPUT0": "IN", "INPUT1": "T2"}, {"OUTPUT0": "T1"}),
             step("b", {"INPUT0": "T1"}, {"OUTPUT0": "T2"}),
             step("c", {"INPUT0": "T2"}, {"OUTPUT0": "OUT"})],
            "output 'OUT' for ensemble 'ens' is not written: at least one of its depending "
            "tensors, 'T1', is not connected")
    rejects([step("a", {"INPUT0": "IN"}, {"OUTPUT0": "OUT", "OUTPUT1": "SPARE"})],
            "ensemble tensor 'SPARE' is unused in ensemble 'ens'")
    rejects([step("a", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
             step("b", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})],
            "ensemble tensor 'OUT' can appear in an output map only once for ensemble "
            "'ens' step 1")
    rejects([step("a", {"INPUT0": "T"}, {"OUTPUT0": "OUT"})],
            "ensemble input 'IN' for ensemble ens' is not used")


def test_step_checks_against_the_step_models_configs():
    """Rule: once the step models are loaded, each step must fit its model: inputs and
    outputs that exist, every input mapped, consistent types and shapes, batch sizes
    (ValidateEnsembleConfig's messages)."""
    chain = ensemble([step("a", {"INPUT0": "IN"}, {"OUTPUT0": "T"}),
                      step("b", {"INPUT0": "T"}, {"OUTPUT0": "OUT"})])
    check_steps(chain, {"a": model("a"), "b": model("b")})

    def rejects(steps, message, ens=chain):
        with pytest.raises(EnsembleError) as e:
            check_steps(ens, steps)
        assert str(e.value) == message

    rejects({"a": model("a", dtype="TYPE_INT32"), "b": model("b")},
            "in ensemble ens, ensemble tensor IN: inconsistent data type: TYPE_FP32 is "
            "inferred from model ens while TYPE_INT32 is inferred from model a")
    rejects({"a": model("a"), "b": model("b", dims="[ 8 ]")},
            "in ensemble ens, ensemble tensor T: inconsistent shape: [-1,16] is inferred "
            "from model a while [-1,8] is inferred from model b")
    rejects({"a": model("a", inputs=("X",)), "b": model("b")},
            "in ensemble ens, ensemble tensor IN is mapping to non-existing input INPUT0 "
            "in model a")
    rejects({"a": model("a", inputs=("INPUT0", "INPUT1")), "b": model("b")},
            "in ensemble ens, input INPUT1 in model a is not mapped to any ensemble tensors")
    rejects({"a": model("a", outputs=("Y",)), "b": model("b")},
            "in ensemble ens, ensemble tensor T is mapped from non-existing output OUTPUT0 "
            "in model a")
    rejects({"a": model("a", mbs=4), "b": model("b")},
            "ensemble ens allows maximum batch size 8, but it contains model a which only "
            "allows maximum batch size to be 4")
    # a non-batching step with the batch dimension written out fits a batching one
    check_steps(chain, {"a": model("a", mbs=0, dims="[ -1, 16 ]"), "b": model("b")})


# -- decoupled steps ---------------------------------------------------------------------

DECOUPLED = 'model_transaction_policy { decoupled: true }'

# IN -> d (decoupled) -> T, IDX; T -> b -> OUT: each response of d runs b once
STREAMING = ensemble([
    step("d", {"INPUT0": "IN"}, {"OUTPUT0": "T", "OUTPUT1": "IDX"}),
    step("b", {"INPUT0": "T"}, {"OUTPUT0": "OUT"}),
], outputs=("OUT", "IDX"), mbs=0)


def streaming(host):
    """STREAMING, loaded as the model manager loads it (its policy set by the check)."""
    ens = ModelConfig()
    ens.CopyFrom(STREAMING)
    steps = {"d": model("d", outputs=("OUTPUT0", "OUTPUT1"), mbs=0, extra=DECOUPLED),
             "b": model("b", mbs=0)}
    ens.model_transaction_policy.decoupled = check_steps(ens, steps)
    return EnsembleScheduler("ens", 1, ens, host, decoupled_models=frozenset({"d"}))


def stream_answer(sched, req, k, owner="ipc:///run/worker-d"):
    """Response k (not final) of decoupled step `req`: each output a new block, at
    offset 10 k + the output's number."""
    outs = [TensorRef(o.name, "FP32", [16], segment=f"{owner}-seg",
                      offset=10 * k + int(o.name[-1]), nbytes=64) for o in req.outputs]
    sched.on_response(InferResponse(req.id, outputs=outs, owner=owner, final=False), 10)


def final_flag(sched, req):
    sched.on_response(InferResponse(req.id, empty=True), 10)


def test_the_decoupled_policy_is_inferred_from_the_steps():
    """Rule (Triton's ValidateEnsembleConfig): an ensemble is decoupled exactly when a
    decoupled step is on its data flow, whatever its own config says; a step reading
    tensors that descend from two different decoupled lines is refused, in Triton's
    words; so is the response cache on a decoupled ensemble (shmserve's choice)."""
    d = model("d", outputs=("OUTPUT0", "OUTPUT1"), mbs=0, extra=DECOUPLED)
    assert check_steps(STREAMING, {"d": d, "b": model("b", mbs=0)}) is True
    plain = model("d", outputs=("OUTPUT0", "OUTPUT1"), mbs=0)
    assert check_steps(STREAMING, {"d": plain, "b": model("b", mbs=0)}) is False
    cached = ModelConfig()
    cached.CopyFrom(STREAMING)
    cached.response_cache.enable = True
    with pytest.raises(EnsembleError, match="Response Cache does not currently support "
                       "model ens with 'decoupled' transaction policy"):
        check_steps(cached, {"d": d, "b": model("b", mbs=0)})
    # b reads T (from d's responses) and IN (the request's own): never paired
    mixed = ensemble([
        step("d", {"INPUT0": "IN"}, {"OUTPUT0": "T"}),
        step("b", {"INPUT0": "T", "INPUT1": "IN"}, {"OUTPUT0": "OUT"}),
    ], mbs=0)
    with pytest.raises(EnsembleError) as e:
        check_steps(mixed, {"d": model("d", mbs=0, extra=DECOUPLED),
                            "b": model("b", inputs=("INPUT0", "INPUT1"), mbs=0)})
    # Triton names the model OUT was first inferred from: the ensemble (checked on 2.51)
    assert str(e.value) == ("in ensemble ens, step of model 'ens' receives inputs "
                            "originated from different decoupled models")


def test_each_decoupled_response_runs_the_downstream_steps_and_answers_once():
    """Rule: each response of a decoupled step is a new set of tensors that runs the
    steps downstream once; the client gets one response per set of its outputs (not
    final while a step request is incomplete), then the final flag once every step
    request is complete; every block is read by the client or given back, once."""
    host = FakeHost()
    sched = streaming(host)
    sched.enqueue(client_request(), 5)
    (d,) = host.submitted
    for k in range(3):
        stream_answer(sched, d, k)
    bs = host.running("b")
    assert len(bs) == 3  # one run of b per response of d
    assert [b.inputs[0].offset for b in bs] == [0, 10, 20]
    for k, b in enumerate(bs):
        answer(sched, b, owner="ipc:///run/worker-b", offset=100 * k)
        ran(sched, b)
    assert len(host.finished) == 3
    for k, (_, resp, lent) in enumerate(host.finished):
        assert not resp.final and not resp.error
        out, idx = resp.outputs
        assert (out.name, out.offset) == ("OUT", 100 * k)
        assert (idx.name, idx.offset) == ("IDX", 10 * k + 1)  # the same response's
        assert lent == {("ipc:///run/worker-b-seg", 100 * k): "ipc:///run/worker-b",
                        ("ipc:///run/worker-d-seg", 10 * k + 1): "ipc:///run/worker-d"}
    # each T went back once b had read it; nothing lent was released here
    assert sorted(host.released) == [("ipc:///run/worker-d", ("ipc:///run/worker-d-seg",
                                                              10 * k)) for k in range(3)]
    assert sched.active  # d has not sent its final flag yet
    final_flag(sched, d)
    ran(sched, d)
    (_, last, lent) = host.finished[-1]
    assert last.final and last.empty and not last.outputs and lent == {}
    assert len(host.finished) == 4
    assert not sched.active and not sched.runs and not host.routes
    assert sched.stats.success_count == 1


def test_the_last_response_carries_the_final_flag_when_nothing_runs_after_it():
    """Rule (Triton's FinishEnsemble): a response completed when no step request is in
    flight any more is itself final; no empty final follows it."""
    host = FakeHost()
    sched = streaming(host)
    sched.enqueue(client_request(), 5)
    (d,) = host.submitted
    stream_answer(sched, d, 0)
    final_flag(sched, d)
    (b,) = host.running("b")
    answer(sched, b, owner="ipc:///run/worker-b")
    (_, resp, _), = host.finished
    assert resp.final and [o.name for o in resp.outputs] == ["OUT", "IDX"]


def test_a_decoupled_step_with_zero_responses_ends_the_request_with_the_final_flag():
    """Rule: a decoupled step may answer nothing; the ensemble then sends only the
    final flag (no 'unexpected deadlock' error as for a non-decoupled ensemble)."""
    host = FakeHost()
    sched = streaming(host)
    sched.enqueue(client_request(), 5)
    (d,) = host.submitted
    final_flag(sched, d)
    (_, resp, _), = host.finished
    assert resp.final and resp.empty and not resp.error
    assert [r.model for r in host.submitted] == ["d"]
    assert not sched.active and host.released == []


def test_an_error_mid_stream_fails_the_request_once_every_step_is_complete():
    """Rule (Triton): an error response of a decoupled step fails the ensemble
    request: responses completed before it went out, no step starts after it, later
    responses' blocks are given back, and the error (naming the step) is the final
    answer once every step request in flight is complete."""
    host = FakeHost()
    sched = streaming(host)
    sched.enqueue(client_request(), 5)
    (d,) = host.submitted
    stream_answer(sched, d, 0)
    (b0,) = host.running("b")
    answer(sched, b0, owner="ipc:///run/worker-b")
    assert len(host.finished) == 1 and not host.finished[0][1].error
    stream_answer(sched, d, 1)  # b runs for it ...
    sched.on_response(InferResponse(d.id, error=Error(ErrorCode.INVALID_ARG, "element 2 is -1"),
                                    final=False), 10)
    stream_answer(sched, d, 3)  # ... but not for this one: its blocks go back
    assert len(host.running("b")) == 2
    assert ("ipc:///run/worker-d", ("ipc:///run/worker-d-seg", 30)) in host.released
    assert ("ipc:///run/worker-d", ("ipc:///run/worker-d-seg", 31)) in host.released
    final_flag(sched, d)
    assert len(host.finished) == 1  # b still runs for response 1
    answer(sched, host.running("b")[1], owner="ipc:///run/worker-b", offset=50)
    (_, resp, _) = host.finished[-1]
    assert len(host.finished) == 2 and resp.final
    assert resp.error.message == "in ensemble 'ens', step 0 (model 'd'): element 2 is -1"
    assert resp.error.code == ErrorCode.INVALID_ARG
    # everything of response 1 went back (b's output too: never answered)
    for block in [("ipc:///run/worker-d", ("ipc:///run/worker-d-seg", 10)),
                  ("ipc:///run/worker-d", ("ipc:///run/worker-d-seg", 11)),
                  ("ipc:///run/worker-b", ("ipc:///run/worker-b-seg", 50))]:
        assert host.released.count(block) == 1
    assert not sched.active and not host.routes
    assert sched.stats.fail_count == 1


def test_a_client_output_still_read_by_a_step_waits_for_that_step():
    """Rule: an output block goes to the client only once no step reads it any more
    (the client's release hands it straight back to its owner); responses keep the
    order in which their sets completed."""
    ens = ensemble([
        step("d", {"INPUT0": "IN"}, {"OUTPUT0": "T"}),
        step("b", {"INPUT0": "T"}, {"OUTPUT0": "OUT"}),
    ], outputs=("T", "OUT"), mbs=0)
    steps = {"d": model("d", mbs=0, extra=DECOUPLED), "b": model("b", mbs=0)}
    ens.model_transaction_policy.decoupled = check_steps(ens, steps)
    host = FakeHost()
    sched = EnsembleScheduler("ens", 1, ens, host, decoupled_models=frozenset({"d"}))
    sched.enqueue(client_request(outputs=[RequestedOutput("T"), RequestedOutput("OUT")]), 5)
    (d,) = host.submitted
    stream_answer(sched, d, 0)
    stream_answer(sched, d, 1)
    assert host.finished == []  # b still reads T of both
    b0, b1 = host.running("b")
    answer(sched, b1, owner="ipc:///run/worker-b")  # the second set's reader first
    # the second set is complete and T's last step reader is done: it goes first
    assert [r.outputs[0].offset for _, r, _ in host.finished] == [10]
    answer(sched, b0, owner="ipc:///run/worker-b", offset=5)
    assert [r.outputs[0].offset for _, r, _ in host.finished] == [10, 0]
    assert all(not r.final for _, r, _ in host.finished)
    # T and OUT are lent to the client, not released here
    assert not host.released
    final_flag(sched, d)
    assert host.finished[-1][1].final and host.finished[-1][1].empty


def test_a_response_can_set_the_sequence_fields_of_the_steps_after_it():
    """Rule (Triton's ensemble scheduler): a step response's parameters sequence_id,
    sequence_start and sequence_end become the sequence fields of the steps reading
    its outputs (a flag not given is false), so a decoupled step can drive a stateful
    one; a response without them passes on the request's; a wrong type fails the
    request with Triton's message."""
    host = FakeHost()
    sched = streaming(host)
    sched.enqueue(client_request(sequence_id=7, sequence_start=True), 5)
    (d,) = host.submitted
    assert (d.sequence_id, d.sequence_start, d.sequence_end) == (7, True, False)
    params = [{"sequence_id": "s-1", "sequence_start": True}, {}, {"sequence_end": True}]
    for k, p in enumerate(params):
        outs = [TensorRef(o.name, "FP32", [16], segment="seg", offset=10 * k
                          + int(o.name[-1]), nbytes=64) for o in d.outputs]
        sched.on_response(InferResponse(d.id, outputs=outs, owner="w", final=False,
                                        parameters=p), 10)
    b0, b1, b2 = host.running("b")
    for k, b in enumerate((b0, b1, b2)):
        answer(sched, b, owner="ipc:///run/worker-b", offset=100 * k)
    # and each response of the ensemble carries those its outputs came with (Triton)
    assert [r.parameters for _, r, _ in host.finished] == [
        {"sequence_id": "s-1", "sequence_start": True, "sequence_end": False},
        {"sequence_id": 7, "sequence_start": True, "sequence_end": False},
        {"sequence_id": 7, "sequence_start": False, "sequence_end": True}]
    assert (b0.sequence_id, b0.sequence_start, b0.sequence_end) == ("s-1", True, False)
    assert (b1.sequence_id, b1.sequence_start, b1.sequence_end) == (7, True, False)
    assert (b2.sequence_id, b2.sequence_start, b2.sequence_end) == (7, False, True)
    sched.on_response(InferResponse(d.id, outputs=[], final=True,
                                    parameters={"sequence_start": 1}), 10)
    (_, last, _) = host.finished[-1]
    assert last.final and last.error.message == (
        "in ensemble 'ens', step 0 (model 'd'): expect parameter 'sequence_start' to be "
        "TRITONSERVER_PARAMETER_BOOL")


def test_cancel_reaches_the_decoupled_step_and_ends_when_it_is_complete():
    """Rule: cancelling the ensemble request cancels every step request in flight (the
    decoupled step too); its later responses start nothing and their blocks go back;
    the request ends CANCELLED once its step requests are complete."""
    host = FakeHost()
    sched = streaming(host)
    sched.enqueue(client_request(), 5)
    (d,) = host.submitted
    stream_answer(sched, d, 0)
    (b0,) = host.running("b")
    assert sched.cancel("ipc:///run/frontend0", 7, 20)
    assert sorted(host.cancelled) == sorted([d.id, b0.id])
    stream_answer(sched, d, 1)  # the model had not seen the cancel yet
    assert len(host.running("b")) == 1
    assert ("ipc:///run/worker-d", ("ipc:///run/worker-d-seg", 10)) in host.released
    final_flag(sched, d)
    assert host.finished == []  # b0 still runs
    cancelled = Error(ErrorCode.CANCELLED, "request was cancelled")
    sched.on_response(InferResponse(b0.id, error=cancelled), 30)
    (_, resp, _), = host.finished
    assert resp.final and resp.error.code == ErrorCode.CANCELLED
    assert ("ipc:///run/worker-d", ("ipc:///run/worker-d-seg", 0)) in host.released
    assert not sched.active and not host.routes and sched.stats.fail_count == 1
