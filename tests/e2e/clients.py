"""The official clients, one way to make each, so tests run over both protocols."""

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

PROTOCOLS = ("http", "grpc")


def module(protocol: str):
    return httpclient if protocol == "http" else grpcclient


def client(server, protocol: str, **kwargs):
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url, **kwargs)
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
