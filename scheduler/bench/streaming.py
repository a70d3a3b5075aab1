"""--streaming: requests over gRPC's bidirectional stream, as perf_analyzer's
--streaming. Each concurrent stream of the bench has its own gRPC stream (its own
client and channel) and runs a closed loop: send a request, read its responses until
the one flagged final (enable_empty_final_response, so a decoupled model's end is seen
even when its last response is empty), then send the next. Per request it records the
time to the first response that carries outputs, the end-to-end time to the final
flag, and how many responses came. A client module, never imported by the server.
"""

from __future__ import annotations

import queue
import threading
import time


def _is_final(result) -> bool:
    params = result.get_response().parameters
    return "triton_final_response" in params and \
        params["triton_final_response"].bool_param


def _has_outputs(result) -> bool:
    return len(result.get_response().outputs) > 0


def stream_kwargs(kw: dict) -> dict:
    """The unary call's keywords that async_stream_infer also takes."""
    return {k: v for k, v in kw.items()
            if k not in ("client_timeout", "headers", "compression_algorithm")}


def _one_stream(stream, spec, rec, grpcclient):
    client = grpcclient.InferenceServerClient(spec.url)
    box: queue.SimpleQueue = queue.SimpleQueue()
    client.start_stream(callback=lambda result, error: box.put(
        (time.perf_counter(), result, error)), compression_algorithm=spec.compression)
    base = stream_kwargs(stream.base_kwargs())
    n = 0
    try:
        while rec.next():
            stream.prepare()
            kw, ended = stream.request(base)
            n += 1
            rid = f"{spec.tag}-{id(stream)}-{n}"
            t = time.perf_counter()
            client.async_stream_infer(spec.model, enable_empty_final_response=True,
                                      request_id=rid, **kw)
            if not _await_final(stream, rec, box, t, spec.timeout, ended, rid):
                break  # the stream is stuck: its late responses would confuse the next
        closing = stream.closing(base)
        if closing is not None:
            rid = f"{spec.tag}-{id(stream)}-close"
            client.async_stream_infer(spec.model, enable_empty_final_response=True,
                                      request_id=rid, **closing)
            _await_final(stream, None, box, time.perf_counter(), spec.timeout, False, rid)
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def _await_final(stream, rec, box, t_send, timeout, ended, rid) -> bool:
    """Read request `rid`'s responses up to its final flag; record them in `rec` (None:
    an unmeasured request). False when no final came within `timeout`. Responses of an
    earlier request (one that failed early) are skipped by their id."""
    first, count, ok, error = None, 0, True, None
    deadline = time.perf_counter() + timeout
    while True:
        try:
            t, result, err = box.get(timeout=max(deadline - time.perf_counter(), 0.001))
        except queue.Empty:
            if rec is not None:
                rec.error(TimeoutError(f"no final response within {timeout:g}s"))
            return False
        if err is not None:
            # an error response of a decoupled model need not be its last: Triton's
            # stream carries it without the final flag, so keep reading to the final
            # (an error before any response is a refusal: nothing follows it)
            error = error or err
            if count == 0 or _final_error(err):
                break
            continue
        if result.get_response().id != rid:
            continue
        if _has_outputs(result):
            count += 1
            if first is None:
                first = t
            ok = ok and stream.check(result)
        if _is_final(result):
            break
    if rec is None:
        return True
    if error is not None:
        rec.error(error)
        stream.failed()
        time.sleep(0.01)  # a server refusing everything must not turn this into a spin
        return True
    rec.done_stream(t_send, first, count, ok, ended)
    return True


def _final_error(err) -> bool:
    """An error the server ends the request with (not one response among others): the
    stream itself broke, or the request was refused before it ran."""
    status = getattr(err, "status", lambda: None)()
    return status is not None and "StatusCode" in str(status)


def run_stream(streams, spec, rec):
    """One thread and one gRPC stream per concurrent stream."""
    import tritonclient.grpc as grpcclient
    failures = []

    def body(s):
        try:
            _one_stream(s, spec, rec, grpcclient)
        except Exception as e:  # the server went away, the stream broke: say so
            rec.error(e)
            failures.append(e)

    threads = [threading.Thread(target=body, args=(s,), daemon=True) for s in streams]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
