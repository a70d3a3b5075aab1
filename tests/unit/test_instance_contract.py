"""The worker's instance contract (workers/instance.py): both backends' instance
classes declare every member the worker loop reads, with the defaults that mean "not
this one", and a python instance takes the worker's services through connect()."""

import json

import pytest

from shm.messages.worker import LoadInstance
from workers.framework import FrameworkInstance
from workers.instance import Instance, WorkerLinks
from workers.python_backend.runner import PythonInstance

MEMBERS = ("config", "copies", "input_end_ns", "output_start_ns", "threaded", "inline",
           "stream", "execute", "finalize", "connect")


@pytest.mark.parametrize("cls", [FrameworkInstance, PythonInstance])
def test_the_backends_instance_classes_implement_the_contract(cls):
    assert Instance in cls.__mro__  # its defaults are inherited, not restated
    declared = {name for klass in cls.__mro__ for name in
                (*vars(klass), *getattr(klass, "__annotations__", {}))}
    assert set(MEMBERS) <= declared


def test_a_framework_instance_runs_on_its_thread_and_needs_no_links():
    assert FrameworkInstance.threaded is True and FrameworkInstance.inline is False
    assert FrameworkInstance.connect is Instance.connect  # the default: takes nothing
    assert FrameworkInstance.input_end_ns == FrameworkInstance.output_start_ns == 0


def python_instance(tmp_path, decoupled=False) -> PythonInstance:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.py").write_text(
        "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n")
    config = {"name": "m"}
    if decoupled:
        config["model_transaction_policy"] = {"decoupled": True}
    return PythonInstance(LoadInstance("m/1/m_0", "m_0", "m", 1, str(tmp_path),
                                       json.dumps(config).encode()), config)


def test_a_python_instance_takes_the_workers_links_through_connect(tmp_path):
    inst = python_instance(tmp_path)
    assert (inst.bls, inst.responder, inst.report_responses) == (None, None, None)
    assert inst.stream is None and inst.threaded and inst.inline
    links = WorkerLinks(object(), lambda *a: None, lambda *a: None)
    inst.connect(links)
    assert (inst.bls, inst.responder, inst.report_responses) == links


def test_a_decoupled_python_model_never_runs_inline(tmp_path):
    assert python_instance(tmp_path, decoupled=True).inline is False
