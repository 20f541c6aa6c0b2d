"""The distributed set-up of a run, and how its ranks stop together.

    init_cpu_process_group(cfg)      # under torchrun without CUDA (MMEngine's launcher needs a GPU)
    stop = RankStop.begin()          # once per run, on every rank
    stop.announce("diverged", msg)   # this rank ends the run: tell the others, close the group
    stop.peer()                      # {"kind", "rank", "message"} of a rank that ended it, or None
    close_process_group()            # as the command returns, on every rank

A rank that ends a run early (diverged, out of memory, any error) writes why into the rendezvous store
and closes its process group, so that a rank blocked in a collective with it (DDP's gradient
all-reduce, the loss check) gets an error at once instead of waiting for the timeout; that rank then
reads the store and ends the same way: diverged if a peer diverged, failed naming the peer otherwise. A
rank that dies without a word (SIGKILL) closes its connections with it, which the others' next
collective reports; a rank that hangs is given up after the process group's timeout
(``env_cfg.dist_cfg.timeout``, seconds; torch's default, 30 minutes, unless set).
"""

from __future__ import annotations

import datetime
import gc
import json
import re
from dataclasses import dataclass

import torch
import torch.distributed as dist
from mmengine.config import Config

STOP_KEY = "repro/stop/{}"
# what a collective raises when a peer's connection is gone or the wait timed out (gloo raises a plain
# RuntimeError: "... gloo/transport/tcp/pair.cc ... Connection reset by peer")
_PEER_LOST = ("gloo", "nccl", "connection reset", "connection closed", "timed out", "timeout")


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def init_cpu_process_group(cfg: Config) -> None:
    """Under torchrun without CUDA, start the process group here: mmengine 0.10's pytorch launcher
    calls torch.cuda.set_device unconditionally; it skips its own init when a group exists."""
    if cfg.get("launcher", "none") == "none" or torch.cuda.is_available() or dist.is_initialized():
        return
    dist_cfg = cfg.get("env_cfg", {}).get("dist_cfg", {})
    backend = dist_cfg.get("backend", "gloo")
    timeout = dist_cfg.get("timeout")
    extra = {} if timeout is None else {"timeout": datetime.timedelta(seconds=float(timeout))}
    dist.init_process_group(backend="gloo" if backend == "nccl" else backend, **extra)


def close_process_group() -> None:
    """End the process group's worker threads before the interpreter exits. A gloo worker left running
    into finalization may drop a finished collective's tensors there, which needs the GIL: the process
    aborts ("terminate called without an active exception") after a run that succeeded. The finished
    run's DDP wrapper still holds the group through reference cycles only the collector breaks, also
    when RankStop.announce destroyed the group already: destroying it alone leaves the threads running."""
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_peer_failure(err: BaseException) -> bool:
    """Whether `err` is a collective that failed because another rank died, left or stopped answering."""
    if isinstance(err, dist.DistError):
        return True
    text = str(err).lower()
    return is_distributed() and isinstance(err, RuntimeError) and any(m in text for m in _PEER_LOST)


def peer_failure_reason(err: BaseException) -> str:
    """The collective's error without its source location and advice: "Connection reset by peer"."""
    text = re.sub(
        r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", str(err).strip().splitlines()[0] if str(err).strip() else ""
    )
    return text.split(". ")[0].rstrip(".") or type(err).__name__


@dataclass
class RankStop:
    """The stop signal of one run: a key in the rendezvous store, the same on every rank because every
    rank starts the same runs in the same order."""

    key: str
    _runs = 0

    @classmethod
    def begin(cls) -> RankStop:
        cls._runs += 1
        return cls(STOP_KEY.format(cls._runs))

    @staticmethod
    def _store():
        if not is_distributed():
            return None
        return dist.distributed_c10d._get_default_store()

    def announce(self, kind: str, message: str) -> None:
        """This rank ends the run (kind "diverged" or "failed"): say why, unless a peer already has, and
        close this rank's process group so that no peer waits on it."""
        store = self._store()
        if store is None:
            return
        if not store.check([self.key]):
            store.set(self.key, json.dumps({"kind": kind, "rank": dist.get_rank(), "message": message}))
        dist.destroy_process_group()

    def peer(self) -> dict | None:
        store = self._store()
        if store is None or not store.check([self.key]):
            return None
        entry = json.loads(store.get(self.key))
        return None if entry["rank"] == dist.get_rank() else entry
