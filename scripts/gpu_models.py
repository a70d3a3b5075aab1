"""The model repositories of scripts/gpu_compare.py, built at run time.

Both servers get the python models: `identity_torch_gpu` (torch on the instance's
device through DLPack, inputs where the client put them: FORCE_CPU_ONLY_INPUT_TENSORS
"no") and `identity_fp32` (the anchor's CPU identity, for the C clients and [1,16]).
shmserve alone gets the framework models, since the real Triton travels with its
python backend only: a TorchScript identity and MLP, and an ONNX MLP when onnxruntime
has its CUDA provider. With device "cpu" (the dry run on a machine without a GPU)
every model has a KIND_CPU instance instead; names stay the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import benchkit

TORCH_IDENTITY = "identity_torch_gpu"
CPU_IDENTITY = "identity_fp32"
TS_IDENTITY = "ts_identity_gpu"
TS_MLP = "ts_mlp_gpu"
ONNX_MLP = "onnx_mlp_gpu"
MLP_WIDTH = 512  # the MLPs' input and output: 512 -> 2048 -> 512

# max_batch_size 0 and dims [-1]: a request is one flat tensor, the same to both
# servers (the python backend's batching would only add a dimension)
TORCH_IDENTITY_CONFIG = """name: "identity_torch_gpu"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 {group} }} ]
parameters {{ key: "FORCE_CPU_ONLY_INPUT_TENSORS" value {{ string_value: "no" }} }}
"""

TORCH_IDENTITY_PY = '''
import torch
from torch.utils.dlpack import from_dlpack, to_dlpack

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0, by torch on the instance's device. The input arrives through
    DLPack where the server put it (the client's CUDA region, no copy); the output is a
    fresh tensor there, as a real model's would be: one that aliased the input would
    ask the server to export memory it only imported."""

    def initialize(self, args):
        gpu = args["model_instance_kind"] == "GPU"
        self.device = torch.device(
            f"cuda:{args['model_instance_device_id']}" if gpu else "cpu")
        self.stream = torch.cuda.current_stream(self.device) if gpu else None
        torch.zeros(1, device=self.device)  # CUDA's context at load, not in a request

    def execute(self, requests):
        responses = []
        for request in requests:
            x = from_dlpack(pb_utils.get_input_tensor_by_name(request, "INPUT0").to_dlpack())
            y = x.to(self.device, copy=True)
            if self.stream is not None:
                # the server reads OUTPUT0 on a stream of its own: the copy must be done
                self.stream.synchronize()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor.from_dlpack("OUTPUT0", to_dlpack(y))]))
        return responses
'''

ONNX_MLP_CONFIG = """name: "onnx_mlp_gpu"
platform: "onnxruntime_onnx"
max_batch_size: 64
dynamic_batching {{ max_queue_delay_microseconds: 100 }}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 512 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 512 ] }} ]
instance_group [ {{ count: 1 {group} }} ]
"""

MLP_BATCHING = "dynamic_batching { max_queue_delay_microseconds: 100 }"


def instance_group(device: str) -> str:
    """What goes inside instance_group's braces after the count."""
    return "kind: KIND_GPU gpus: [ 0 ]" if device == "gpu" else "kind: KIND_CPU"


@dataclass
class Repos:
    """Where each server's repository lies, and the models left out, with why."""

    paths: dict[str, Path]  # server name -> its repository
    skipped: dict[str, str] = field(default_factory=dict)  # model -> why it is not there

    def models(self, server: str) -> list[str]:
        return sorted(p.name for p in self.paths[server].iterdir()
                      if (p / "config.pbtxt").exists())


def _kind(text: str, device: str) -> str:
    """A framework builder's config with its KIND_CPU group turned into `device`'s
    (in place, not beside it: a second group would add a CPU instance)."""
    out = text.replace("kind: KIND_CPU", instance_group(device))
    assert out.count("instance_group") == 1 and (device == "cpu" or "KIND_CPU" not in out)
    return out


def build(root: Path, device: str, onnx_cuda: bool | str) -> Repos:
    """Write `root`/triton and `root`/shmserve. onnx_cuda: True to add the ONNX MLP, or
    the reason it is left out (on "cpu" it is built whatever onnx_cuda says, on a CPU
    instance, when onnx is importable)."""
    if device not in ("gpu", "cpu"):
        raise ValueError(f"device must be gpu or cpu, not {device!r}")
    repos = Repos({"triton": root / "triton", "shmserve": root / "shmserve"})
    for repo in repos.paths.values():
        repo.mkdir(parents=True)
        benchkit.write_model(repo, TORCH_IDENTITY,
                             TORCH_IDENTITY_CONFIG.format(group=instance_group(device)),
                             TORCH_IDENTITY_PY)
        benchkit.write_model(repo, CPU_IDENTITY, benchkit.ANCHOR_IDENTITY_CONFIG,
                             benchkit.IDENTITY_PY)
    repo = repos.paths["shmserve"]
    try:
        from tests import torch_models as tm
    except ImportError as exc:
        repos.skipped[TS_IDENTITY] = repos.skipped[TS_MLP] = f"no torch here: {exc}"
    else:
        tm.identity(repo / TS_IDENTITY, dims=(-1,), max_batch_size=8)
        tm.mlp(repo / TS_MLP, (MLP_WIDTH, 2048, MLP_WIDTH), max_batch_size=64,
               extra=MLP_BATCHING)
        for name in (TS_IDENTITY, TS_MLP):
            cfg = repo / name / "config.pbtxt"
            cfg.write_text(_kind(cfg.read_text(), device))
    if device == "gpu" and onnx_cuda is not True:
        repos.skipped[ONNX_MLP] = str(onnx_cuda) or "onnxruntime has no CUDA provider"
        return repos
    try:
        from tests import onnx_models
    except ImportError as exc:
        repos.skipped[ONNX_MLP] = f"no onnx here: {exc}"
        return repos
    onnx_models.mlp(repo / ONNX_MLP, (MLP_WIDTH, 2048, MLP_WIDTH),
                    config=ONNX_MLP_CONFIG.format(group=instance_group(device)))
    return repos


def onnx_cuda() -> bool | str:
    """True when onnxruntime here has the CUDA provider, else why not."""
    try:
        import onnxruntime
    except ImportError as exc:
        return f"no onnxruntime: {exc}"
    providers = onnxruntime.get_available_providers()
    if "CUDAExecutionProvider" in providers:
        return True
    return (f"onnxruntime {onnxruntime.__version__} has no CUDAExecutionProvider "
            f"({', '.join(providers)}): onnxruntime-gpu did not travel")
