"""The official clients, one way to make each, so tests run over both protocols."""

import threading

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

PROTOCOLS = ("http", "grpc")


class HttpClient(httpclient.InferenceServerClient):
    """tritonclient's HTTP client, safe to drop on any thread. Its __del__ joins a
    gevent pool that belongs to the thread that made it; a client made on a worker
    thread and collected later on another one raised there, which pytest reports as
    an unraisable-exception warning. Dropped off its own thread, it is left to the
    garbage collector (its sockets close with it)."""

    def __init__(self, *args, **kwargs):
        self._owner = threading.get_ident()
        super().__init__(*args, **kwargs)

    def __del__(self):
        if threading.get_ident() == self._owner:
            super().__del__()


def module(protocol: str):
    return httpclient if protocol == "http" else grpcclient


def client(server, protocol: str, **kwargs):
    if protocol == "http":
        return HttpClient(server.http_url, **kwargs)
    return grpcclient.InferenceServerClient(server.grpc_url, **kwargs)


def infer_input(protocol: str, name: str, array, datatype: str, binary: bool = True):
    mod = module(protocol)
    inp = mod.InferInput(name, list(array.shape), datatype)
    if protocol == "http":
        inp.set_data_from_numpy(array, binary_data=binary)
    else:
        inp.set_data_from_numpy(array)
    return inp


def requested(protocol: str, name: str, binary: bool = True):
    if protocol == "http":
        return httpclient.InferRequestedOutput(name, binary_data=binary)
    return grpcclient.InferRequestedOutput(name)


class GrpcStream:
    """A tritonclient gRPC stream (ModelStreamInfer) whose responses land in a queue;
    each test module's `send` builds its own inputs."""

    def __init__(self, server, timeout: float = 60):
        import queue
        self.timeout = timeout  # a bound on every wait, never a pace
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.responses: queue.Queue = queue.Queue()
        self.client.start_stream(
            callback=lambda result, error: self.responses.put((result, error)))

    def until_final(self, stop_on_error: bool = False):
        """(result, error) pairs up to the response marked triton_final_response (or,
        with `stop_on_error`, up to an error: an ensemble's error is its last answer;
        a decoupled model's error leaves the request open)."""
        got = []
        while True:
            result, error = self.responses.get(timeout=self.timeout)
            got.append((result, error))
            if error is not None:
                if stop_on_error:
                    return got
            elif is_final(result):
                return got

    def close(self):
        self.client.stop_stream()
        self.client.close()


def is_final(result) -> bool:
    """Whether a stream response carries Triton's triton_final_response flag."""
    p = result.get_response().parameters.get("triton_final_response")
    return p is not None and p.bool_param
