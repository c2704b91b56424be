"""Checks: local ones first, then every rank checks every rank (one small all-gather)."""

from __future__ import annotations

try:  # the layout helpers need no torch; the algorithms do
    import torch
    import torch.distributed as dist
except ImportError:  # pragma: no cover - torch is an optional dependency of gemmlib
    torch = dist = None

#: dtypes the local products take (gemmlib.matmul's precisions), by torch's name
DTYPES = {"torch.float32": 1, "torch.float16": 2, "torch.bfloat16": 3}
_DTYPE_NAMES = {1: "float32", 2: "float16", 3: "bfloat16"}
_MAGIC = 0x6D6D  # first field of every rank's metadata: the same call on every rank
_ALLGATHER, _SUMMA, _REDUCE_SCATTER = 1, 2, 3
_NFIELDS = 14


def _group_info(group):
    if torch is None:
        raise ImportError("gemmlib.distributed needs torch (with torch.distributed): "
                          "pip install torch")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialised: launch with torchrun and call "
            "torch.distributed.init_process_group('nccl') (or 'gloo' for CPU tensors) first")
    if group is not None and group == dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError("this process is not a member of the group it passed")
    try:
        rank = dist.get_rank(group)
    except Exception as e:  # pragma: no cover - torch versions word this differently
        raise ValueError(f"this process is not a member of the group it passed ({e})") from e
    if rank < 0:
        raise ValueError("this process is not a member of the group it passed")
    return rank, dist.get_world_size(group), str(dist.get_backend(group)).lower()


def _local_problem(name, x, backend) -> str | None:
    """Why ``x`` cannot be a local operand (None when it can)."""
    if not isinstance(x, torch.Tensor):
        return f"TypeError:{name} must be a torch tensor, not {type(x).__name__}"
    if x.dim() != 2:
        return f"ValueError:{name} must be a 2-D matrix; got shape {tuple(x.shape)}"
    if str(x.dtype) not in DTYPES:
        return (f"TypeError:{name} has dtype {x.dtype}; the local products take float32, "
                f"float16 or bfloat16: convert it first ({name}.float() or {name}.half())")
    if x.requires_grad:
        return (f"TypeError:{name} requires grad; gemmlib.distributed has no autograd: "
                f"pass {name}.detach()")
    if not x.is_contiguous():
        return (f"ValueError:{name} is not contiguous (a transposed or strided view?): "
                f"pass {name}.contiguous()")
    if x.is_cuda and "nccl" not in backend:
        return (f"TypeError:{name} is a CUDA tensor but the process group uses {backend}: "
                f"initialise it with init_process_group('nccl')")
    if not x.is_cuda and "gloo" not in backend:
        return (f"TypeError:{name} is a CPU tensor but the process group uses {backend}, "
                f"which moves GPU memory only: move it to the GPU (.cuda()) or use 'gloo'")
    if x.is_cuda and x.device.index != torch.cuda.current_device():
        return (f"ValueError:{name} lives on cuda:{x.device.index} but the current device is "
                f"cuda:{torch.cuda.current_device()}: call torch.cuda.set_device(local_rank) "
                f"once per process")
    return None


def _local_checks(A, B, backend) -> str | None:
    why = _local_problem("A", A, backend) or _local_problem("B", B, backend)
    if why:
        return why
    if A.dtype != B.dtype:
        return (f"TypeError:A is {A.dtype} but B is {B.dtype}: give both operands the same "
                f"dtype")
    if A.device != B.device:
        return f"TypeError:A is on {A.device} but B is on {B.device}: put both on one device"
    return None


def _raise(why: str):
    kind, _, msg = why.partition(":")
    raise (TypeError if kind == "TypeError" else ValueError)(msg)


def _meta_device(backend):
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_gather_flat(out, inp, group, async_op=False):
    """All-gather of equal-sized flat pieces (torch 2.13 renamed all_gather_into_tensor)."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=async_op)


def _exchange(fields, group, backend, P) -> list[list[int]]:
    """Every rank's metadata (one small all-gather, and a wait for it on the host)."""
    dev = _meta_device(backend)
    mine = torch.tensor(fields, dtype=torch.int64, device=dev)
    every = torch.empty(P * _NFIELDS, dtype=torch.int64, device=dev)
    _all_gather_flat(every, mine, group)
    return every.view(P, _NFIELDS).tolist()


def _fields(algo, opts, A, B, why) -> list[int]:
    """One rank's metadata: [magic, algorithm, 4 options, A's shape, B's shape, dtype,
    device (0 CPU, 1 GPU), refused (0/1), 0]."""
    ok = why is None
    a = list(A.shape) if ok else [-1, -1]
    b = list(B.shape) if ok else [-1, -1]
    dt = DTYPES.get(str(A.dtype), 0) if ok else 0
    dev = (1 if A.is_cuda else 0) if ok else -1
    opts = list(opts) + [0] * (4 - len(opts))
    return [_MAGIC, algo, *opts, *a, *b, dt, dev, 0 if ok else 1, 0]


def _check_table(table, rank, why, opt_names, call):
    """Refuse on every rank when any rank refused, or the ranks called different things."""
    if why is not None:
        _raise(why)
    bad = [r for r, t in enumerate(table) if t[12] != 0]
    if bad:
        raise ValueError(f"{call}: rank {bad[0]} refused its operands (its own error says why); "
                         f"every rank stops")
    if any(t[0] != _MAGIC or t[1] != table[0][1] for t in table):
        raise ValueError(f"the ranks called different functions: every rank must call {call}")
    for k, name in enumerate(opt_names):
        vals = [t[2 + k] for t in table]
        if any(v != vals[0] for v in vals):
            r = next(r for r, v in enumerate(vals) if v != vals[0])
            raise ValueError(f"{call}: rank {r} passed {name}={_opt(name, vals[r])} but rank 0 "
                             f"passed {name}={_opt(name, vals[0])}; every rank must pass the same")
    dts = [t[10] for t in table]
    if any(d != dts[0] for d in dts):
        r = next(r for r, d in enumerate(dts) if d != dts[0])
        raise TypeError(f"{call}: rank {r}'s operands are {_DTYPE_NAMES[dts[r]]} but rank 0's are "
                        f"{_DTYPE_NAMES[dts[0]]}; convert them to one dtype on every rank")
    devs = [t[11] for t in table]
    if any(d != devs[0] for d in devs):
        r = next(r for r, d in enumerate(devs) if d != devs[0])
        where = lambda d: "a GPU" if d else "the CPU"  # noqa: E731
        raise TypeError(f"{call}: rank {r}'s operands are on {where(devs[r])} but rank 0's are on "
                        f"{where(devs[0])}; put every rank's operands on its GPU")


def _opt(name, v):
    return {"gather": {0: "'A'", 1: "'B'"}}.get(name, {}).get(v, v)
