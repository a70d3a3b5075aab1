"""Which GPUs the server places instances on, and how a worker reaches a client's CUDA
region that lives on another GPU than the instance using it.

Pure logic with no CUDA import, so the scheduler plans with it and tests run it on
machines with one GPU or none. The rule for pinning a process to its GPU is one: a
worker selects its device per call (cupy's `Device(n)`, i.e. cudaSetDevice) and never
narrows CUDA_VISIBLE_DEVICES, because it may have to reach a client's region on any
device (a peer copy), which a narrowed list would hide.
"""

from __future__ import annotations

import os
from typing import Callable, NamedTuple

# Plans the scheduler as if this many GPUs (ids 0..N-1) were visible, whatever the
# machine has: placement tests of several GPUs on machines with one or none. Workers
# cannot run a GPU model on a device that does not exist; python models can.
FAKE_GPUS_ENV = "SHMSERVE_FAKE_GPUS"


def gpu_count() -> int:
    """The GPUs the scheduler places KIND_GPU instances on (ids 0..count-1): the
    injected count when SHMSERVE_FAKE_GPUS is set, else what CUDA shows this process."""
    fake = os.environ.get(FAKE_GPUS_ENV)
    if fake is not None:
        try:
            count = int(fake)
        except ValueError:
            count = -1
        if count < 0:
            raise RuntimeError(f"{FAKE_GPUS_ENV} must be a number of GPUs, got {fake!r}")
        return count
    from shm import cuda
    return cuda.device_count()


def worker_device(kind: str, device_id: int) -> str:
    """The device worker framework instances of this kind and device share: "gpu:N"
    for KIND_GPU, "cpu" for every other kind (KIND_MODEL picks its devices itself)."""
    return f"gpu:{device_id}" if kind == "KIND_GPU" else "cpu"


# How the bytes of a client's CUDA region reach an instance (RegionPlan.copy).
IN_PLACE = "in place"  # the instance's own device: the model reads the region itself
PEER = "peer"  # another device it can reach: one device-to-device copy (NVLink/PCIe)
STAGED = "staged"  # another device it cannot reach: the same copy call, which the
#                    driver stages through host memory (two transfers)
TO_HOST = "to host"  # an instance on the CPU: one device-to-host copy


class RegionPlan(NamedTuple):
    """Where a worker opens a client's CUDA region and how its bytes reach the
    instance (one of IN_PLACE, PEER, STAGED, TO_HOST)."""
    open_on: int
    copy: str


def region_plan(region_device: int, instance_device: int | None,
                can_access_peer: Callable[[int, int], bool]) -> RegionPlan:
    """The plan for an instance on `instance_device` (None: the CPU) that reads or
    writes a region registered on `region_device`.

    The IPC handle is always opened on the region's own device: cudaIpcOpenMemHandle
    maps the allocation into the calling device's context, and only the owning device
    is sure to reach it (another needs peer access to it, which NVIDIA documents as
    optional). The copy then crosses once: in place on the same device, a peer copy to
    another device (`can_access_peer(instance, region)` says whether it goes direct or
    is staged through the host by the driver), a device-to-host copy for the CPU."""
    if instance_device is None:
        return RegionPlan(region_device, TO_HOST)
    if instance_device == region_device:
        return RegionPlan(region_device, IN_PLACE)
    direct = can_access_peer(instance_device, region_device)
    return RegionPlan(region_device, PEER if direct else STAGED)
