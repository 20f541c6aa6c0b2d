"""What the backends raise: a NaN or an Inf met by a quantizer means the training run has diverged.

The CPU backend raises at once. A GPU backend must not wait for the device inside a training step, so its
quantizers set a flag on the device instead (``device_flag``), and ``raise_if_nonfinite`` reads the flags
once per iteration (Int8TrainingHook after every step, LayerLrScaling before every optimizer step): the
run is still recorded as diverged at the iteration it happened, on every rank of a data-parallel run.
"""

from __future__ import annotations

import torch


class NonFiniteError(FloatingPointError):
    """A NaN or Inf reached a quantizer: the run has diverged (UI8 Table 3 reports such a NaN)."""


_FLAGS: dict[torch.device, torch.Tensor] = {}


def device_flag(device: torch.device) -> torch.Tensor:
    """The device's int32 flag (one element), OR-ed to 1 by a quantizer that met a NaN or an Inf."""
    flag = _FLAGS.get(device)
    if flag is None:
        flag = _FLAGS[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return flag


def drop_flag(device: torch.device) -> None:
    """Forget a device's flag (the dry run's meta device, whose flag cannot be read)."""
    _FLAGS.pop(device, None)


def raise_if_nonfinite() -> None:
    """Read (one synchronisation per device that has a flag) and clear the flags; raise NonFiniteError if
    any was set since the last call, on this rank or, in a data-parallel run, on any other."""
    hit = [dev for dev, flag in _FLAGS.items() if int(flag.item())]
    for dev in hit:
        _FLAGS[dev].zero_()
    anywhere = _any_rank(bool(hit))
    if hit:
        raise NonFiniteError(f"non-finite values reached a quantizer on {', '.join(str(d) for d in hit)}")
    if anywhere:
        raise NonFiniteError("non-finite values reached a quantizer on another rank")


def _any_rank(hit: bool) -> bool:
    """Whether any rank hit. In a data-parallel run every rank reads its flags at the same step (before the
    optimizer's), so they agree here and all stop at the same iteration: a rank that stopped alone would
    leave the others waiting in their next collective."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return hit
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([int(hit)], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def clear_nonfinite() -> None:
    """Forget set flags (a skipped mixed-precision step: GradScaler handles its overflows itself)."""
    for flag in _FLAGS.values():
        flag.zero_()
