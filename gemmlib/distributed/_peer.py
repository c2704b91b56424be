"""Copy-engine transport: buffers every rank of a group can read, and a barrier.

On GPUs this is torch's symmetric memory (``torch.distributed._symmetric_memory``,
CUDA IPC handles exchanged once per group, no NVLink multicast): each rank
owns a workspace that its peers map, ``peer(r, ...)`` is a tensor on *this*
GPU whose bytes live on GPU ``r``, and ``copy_`` from it is a
``cudaMemcpyAsync`` between GPUs, done by a copy engine over NVLink while
every SM keeps computing.  ``barrier()`` is a small kernel on the current
stream that returns once every rank's stream has reached it.

On CPU processes (gloo) :class:`HostWorkspace` keeps the same layout and
offsets; its ``barrier()`` all-gathers the bytes written so far, so the
schedules built on top run, and are tested, without a GPU.

The workspace has two *slots* used by successive calls in turn.  A call
writes its slot only after the previous call's barrier, which every peer
reaches after it has finished reading that slot two calls back (reads and
barriers are ordered on each rank's comm stream), so no call needs a
trailing barrier.
"""

from __future__ import annotations

import warnings

try:
    import torch
    import torch.distributed as dist
except ImportError:  # pragma: no cover - torch is an optional dependency of gemmlib
    torch = dist = None

ALIGN = 256          # bytes: every piece starts on this boundary
MIN_SLOT = 16 << 20  # a first workspace of 2 x 16 MiB; grown (collectively) as needed

_WORKSPACES: dict = {}


def aligned(nbytes: int) -> int:
    return -(-int(nbytes) // ALIGN) * ALIGN


class _Base:
    def __init__(self, slot: int):
        self.slot = slot
        self.calls = 0

    def begin(self) -> int:
        """The byte offset of this call's slot (the two slots alternate)."""
        off = (self.calls % 2) * self.slot
        self.calls += 1
        return off

    def local(self, off: int, shape, dtype):
        """This rank's bytes [off, ...) as a tensor of ``shape`` (contiguous)."""
        n = _numel(shape)
        return self.buf[off:off + n * _size(dtype)].view(dtype).view(shape)


class DeviceWorkspace(_Base):
    """Symmetric memory on the GPUs of a group (one per group and device)."""

    def __init__(self, group, device, slot: int):
        import torch.distributed._symmetric_memory as symm

        super().__init__(slot)
        g = group or dist.group.WORLD
        try:  # older torch needs the group enabled first; newer torch warns that it need not
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                symm.enable_symm_mem_for_group(g.group_name)
        except Exception:  # noqa: BLE001
            pass
        self.buf = symm.empty(2 * slot, dtype=torch.uint8, device=device)
        self.handle = symm.rendezvous(self.buf, g)

    def barrier(self) -> None:
        self.handle.barrier(channel=0)

    def peer(self, r: int, off: int, shape, dtype):
        """Rank ``r``'s bytes [off, ...) as a tensor on this GPU (reads go over NVLink)."""
        return self.handle.get_buffer(r, tuple(shape), dtype, storage_offset=off // _size(dtype))


class HostWorkspace(_Base):
    """The same layout on CPU processes: the barrier all-gathers the slot written so far."""

    def __init__(self, group, P: int, slot: int):
        super().__init__(slot)
        self.group, self.P = group, P
        self.buf = torch.zeros(2 * slot, dtype=torch.uint8)
        self.copies = torch.zeros((P, 2 * slot), dtype=torch.uint8)

    def barrier(self) -> None:
        dist.all_gather_into_tensor(self.copies.view(-1), self.buf, group=self.group)

    def peer(self, r: int, off: int, shape, dtype):
        n = _numel(shape)
        return self.copies[r, off:off + n * _size(dtype)].view(dtype).view(shape)


def workspace(group, device, P: int, nbytes: int):
    """The group's workspace with a slot of at least ``nbytes`` (collective when it grows:
    every rank asks for the same size, as they compute it from the same shard table)."""
    key = (id(group or dist.group.WORLD), str(device))
    ws = _WORKSPACES.get(key)
    if ws is not None and ws.slot >= nbytes:
        return ws
    least = MIN_SLOT if device.type == "cuda" else ALIGN   # CPU tests: tiny shapes
    slot = max(least, aligned(nbytes), 2 * ws.slot if ws is not None else 0)
    if ws is not None:                       # every peer must be done with the old one
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier(group=group)
    if device.type == "cuda":
        ws = DeviceWorkspace(group, device, slot)
    else:
        ws = HostWorkspace(group, P, slot)
    _WORKSPACES[key] = ws
    return ws


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _size(dtype) -> int:
    return dtype.itemsize
