"""The python worker's response streams (workers/python_backend/runner.py), without
processes: a decoupled model's responses go to the responder one by one as it sends
them (from execute or from a thread afterwards), the empty final as `empty`; a
non-decoupled model's one response goes out final; execute() failures answer the
requests not answered yet; per-response timings are reported once a request is done."""

import json
import textwrap
import numpy as np
from shm.errors import InferError
from shm.messages.frontend import InferRequest
from shm.messages.worker import LoadInstance
from shm.tensor import TensorRef
from workers.python_backend.runner import PythonInstance
from workers.tensors import ANSWERED, ANSWERED_FAILED

MODEL = textwrap.dedent('''
    import json, threading
    import numpy as np
    import triton_python_backend_utils as pb_utils
    FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

    class TritonPythonModel:
        def execute(self, requests):
            self.threads = []
            out = []
            for r in requests:
                p = json.loads(r.parameters())
                x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                s = r.get_response_sender()
                if p.get("raise"):
                    if p.get("sent_first"):
                        s.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
                    raise RuntimeError("boom")
                if p.get("return_list"):
                    out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
                    continue
                def go(s=s, x=x, p=p):
                    for v in x:
                        s.send(pb_utils.InferenceResponse(
                            [pb_utils.Tensor("OUT", np.array([v], np.int32))]))
                    s.send(flags=FINAL)
                    if p.get("again"):
                        try:
                            s.send(pb_utils.InferenceResponse([]))
                        except Exception as exc:
                            self.error = str(exc)
                if p.get("thread"):
                    t = threading.Thread(target=go)
                    t.start()
                    self.threads.append(t)
                else:
                    go()
            return out or None
''')


def instance(tmp_path, decoupled: bool):
    (tmp_path / "1").mkdir(exist_ok=True)
    (tmp_path / "1" / "model.py").write_text(MODEL)
    config = {"name": "m", "output": [{"name": "OUT", "data_type": "TYPE_INT32"}]}
    if decoupled:
        config["model_transaction_policy"] = {"decoupled": True}
    msg = LoadInstance(f"m{decoupled}", "m_0", "m", 1, str(tmp_path),
                       json.dumps(config).encode())
    inst = PythonInstance(msg, config)
    sent, reports = [], []
    inst.responder = lambda req, result, final, empty, params: sent.append(
        (req.id, result, final, empty))
    inst.report_responses = lambda req, timings: reports.append(list(timings))
    return inst, sent, reports


class HostIO:
    def host_input(self, ref, copies):
        return np.frombuffer(ref.data, np.int32).reshape(ref.shape)


def request(rid, values, **params):
    x = np.asarray(values, np.int32)
    return InferRequest(rid, "frontend", "m", 1,
                        [TensorRef("IN", "INT32", list(x.shape), data=x.tobytes())],
                        parameters=params)


def values(result):
    return [int(a[0]) for _, _, a in result]


def test_decoupled_responses_go_out_one_by_one_then_empty_final(tmp_path):
    inst, sent, reports = instance(tmp_path, decoupled=True)
    assert inst.execute([request(1, [4, 5]), request(2, [])], HostIO()) == [ANSWERED] * 2
    assert [(rid, values(r) if r else None, final, empty)
            for rid, r, final, empty in sent] == [
        (1, [4], False, False), (1, [5], False, False), (1, None, True, True),
        (2, None, True, True)]
    # per-response timings, by index: two successes and an empty final
    assert [[(i, kind) for i, kind, *_ in r] for r in reports] == [
        [(0, 0), (1, 0), (2, 2)], [(0, 2)]]
    for report in reports:
        for _, _, start, out_start, end in report:
            assert start <= out_start <= end


def test_decoupled_sends_from_a_thread_after_execute_returned(tmp_path):
    inst, sent, _ = instance(tmp_path, decoupled=True)
    assert inst.execute([request(1, [7, 8, 9], thread=True, again=True)],
                        HostIO()) == [ANSWERED]
    for t in inst.model.threads:
        t.join(10)
    assert [values(r) for _, r, _, empty in sent if not empty] == [[7], [8], [9]]
    assert sent[-1][2:] == (True, True)
    assert inst.model.error == "Unable to send response. Response sender has been closed."


def test_decoupled_execute_must_return_none(tmp_path):
    inst, sent, _ = instance(tmp_path, decoupled=True)
    (result,) = inst.execute([request(1, [1], return_list=True)], HostIO())
    assert isinstance(result, InferError)
    assert "is using the decoupled mode and the execute function must return None" \
        in result.message


def test_execute_failure_answers_requests_not_answered_yet(tmp_path):
    inst, sent, _ = instance(tmp_path, decoupled=True)
    # nothing sent yet: run_batch answers it with the error
    (result,) = inst.execute([request(1, [1], **{"raise": True})], HostIO())
    assert isinstance(result, InferError) and "boom" in result.message
    # a response already out: the error goes out as the final response
    (result,) = inst.execute([request(2, [1], sent_first=True, **{"raise": True})],
                             HostIO())
    assert result is ANSWERED_FAILED
    assert [(rid, final) for rid, _, final, _ in sent] == [(2, False), (2, True)]
    assert isinstance(sent[-1][1], InferError)


def test_non_decoupled_sender_response_goes_out_final(tmp_path):
    inst, sent, reports = instance(tmp_path, decoupled=False)
    # one response, then the final flag alone: one final response, nothing else
    assert inst.execute([request(1, [3])], HostIO()) == [ANSWERED]
    assert [(rid, values(r), final) for rid, r, final, _ in sent] == [(1, [3], True)]
    assert reports == []  # response statistics are for decoupled models
    # a returned list still works for non-decoupled models
    sent.clear()
    (result,) = inst.execute([request(2, [6], return_list=True)], HostIO())
    assert values(result) == [6] and sent == []


def test_non_decoupled_second_response_is_refused(tmp_path):
    inst, sent, _ = instance(tmp_path, decoupled=False)
    (result,) = inst.execute([request(1, [1, 2])], HostIO())
    # the second send raised Triton's error out of execute(); as in Triton (qa
    # response_sender test_non_decoupled_two_response_pre_return) the client gets the
    # first response, final, and nothing after it
    assert result is ANSWERED
    ((rid, first, final, _),) = sent
    assert rid == 1 and final and values(first) == [1]


def test_per_response_timings_cover_the_first_indices_only(tmp_path, monkeypatch):
    """A request answered with more responses than RESPONSE_STATS_INDICES reports
    timings for that many (the worker holds no more until the request ends, and the
    scheduler's per-index statistics stay bounded); every response still goes out."""
    from workers.python_backend import runner
    monkeypatch.setattr(runner, "RESPONSE_STATS_INDICES", 3)
    inst, sent, reports = instance(tmp_path, decoupled=True)
    assert inst.execute([request(1, [4, 5, 6, 7, 8])], HostIO()) == [ANSWERED]
    assert len(sent) == 6  # five responses and the empty final
    assert [[(i, kind) for i, kind, *_ in r] for r in reports] == [[(0, 0), (1, 0), (2, 0)]]
