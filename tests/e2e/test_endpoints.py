"""Health, metadata, readiness and config endpoints over HTTP and gRPC."""

import json
import urllib.request

import pytest

from tests.e2e.clients import PROTOCOLS, client

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_health(server, protocol):
    c = client(server, protocol)
    assert c.is_server_live()
    assert c.is_server_ready()
    assert c.is_model_ready("identity_fp32")
    assert c.is_model_ready("identity_fp32", "1")
    assert not c.is_model_ready("identity_fp32", "7")
    assert not c.is_model_ready("no_such_model")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_server_metadata(server, protocol):
    md = client(server, protocol).get_server_metadata()
    if protocol == "grpc":
        md = {"name": md.name, "version": md.version, "extensions": list(md.extensions)}
    assert md["name"] == "shmserve"
    assert md["version"]
    # Rule: exactly the extensions served, spelled and ordered as Triton 2.51 lists
    # them (the real 2.51 answers this very list)
    assert md["extensions"] == [
        "classification", "sequence", "model_repository", "model_repository(unload_dependents)",
        "schedule_policy", "model_configuration", "system_shared_memory",
        "cuda_shared_memory", "binary_tensor_data", "parameters", "statistics", "trace",
        "logging"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_model_metadata(server, protocol):
    c = client(server, protocol)
    md = c.get_model_metadata("add_sub")
    md2 = c.get_model_metadata("identity_fp32", "1")
    if protocol == "grpc":
        from google.protobuf import json_format
        md = json_format.MessageToDict(md, preserving_proto_field_name=True)
        md2 = json_format.MessageToDict(md2, preserving_proto_field_name=True)
        for m in (md, md2):
            for t in m["inputs"] + m["outputs"]:
                t["shape"] = [int(d) for d in t["shape"]]
    assert md["name"] == "add_sub"
    assert md["versions"] == ["1"]
    assert [(t["name"], t["datatype"], t["shape"]) for t in md["inputs"]] == [
        ("INPUT0", "FP32", [16]), ("INPUT1", "FP32", [16])]
    assert [t["name"] for t in md["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    # a batching model's shapes start with the batch dimension, -1
    assert md2["inputs"][0]["shape"] == [-1, -1]


def test_model_config_http_is_triton_json(server):
    cfg = client(server, "http").get_model_config("identity_fp32")
    assert cfg["name"] == "identity_fp32"
    assert cfg["backend"] == "python"
    assert cfg["max_batch_size"] == 64
    assert cfg["input"][0]["data_type"] == "TYPE_FP32"
    assert cfg["input"][0]["dims"] == [-1]
    # Triton's normalization: preferred sizes default to [max_batch_size]
    assert cfg["dynamic_batching"]["preferred_batch_size"] == [64]
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert cfg["instance_group"][0]["count"] == 2
    assert cfg["instance_group"][0]["kind"] == "KIND_CPU"
    assert cfg["instance_group"][0]["name"] == "identity_fp32_0"
    assert cfg["version_policy"] == {"latest": {"num_versions": 1}}


def test_model_config_grpc(server):
    resp = client(server, "grpc").get_model_config("identity_fp32")
    cfg = resp.config
    assert cfg.name == "identity_fp32"
    assert cfg.max_batch_size == 64
    assert list(cfg.dynamic_batching.preferred_batch_size) == [64]
    assert cfg.instance_group[0].count == 2


@pytest.mark.parametrize("path,status", [
    ("/v2/models/no_such_model", 404),
    ("/v2/models/no_such_model/config", 404),
    ("/v2/models/identity_fp32/versions/9", 404),
])
def test_metadata_errors_http(server, path, status):
    try:
        urllib.request.urlopen(f"http://{server.http_url}{path}", timeout=10)
        raise AssertionError("expected an error status")
    except urllib.error.HTTPError as err:
        assert err.code == status
        body = json.loads(err.read())
        assert "error" in body and body["error"]


def test_metadata_errors_grpc(server):
    import tritonclient.utils as tu
    c = client(server, "grpc")
    with pytest.raises(tu.InferenceServerException) as exc:
        c.get_model_metadata("no_such_model")
    assert exc.value.status() == "StatusCode.NOT_FOUND"
    assert "no_such_model" in exc.value.message()
