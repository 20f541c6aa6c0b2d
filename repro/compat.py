"""Compatibility shims between the pinned libraries.

MMEngine checkpoints under torch's ``weights_only=True`` default
-----------------------------------------------------------------
torch >= 2.6 loads with ``weights_only=True`` unless told otherwise, and mmengine 0.10.7 calls
``torch.load(filename, map_location=map_location)`` without ``weights_only`` (``load_from_local``,
``load_from_http``, ``load_from_mmcls``, ``load_from_openmmlab``, ``load_from_ceph``, ...). So
``Runner(resume=True)``, ``Runner(load_from=...)`` and ``load_checkpoint`` all go through torch's
restricted unpickler, which refuses what an mmengine checkpoint pickles besides tensors:

- the message hub's ``mmengine.logging.history_buffer.HistoryBuffer`` objects (``log_scalars``);
- inside them numpy arrays: ``numpy._core.multiarray._reconstruct``, ``numpy.ndarray``,
  ``numpy.dtype`` and, for the dtype's BUILD step, its class (``numpy.dtypes.Float64DType``, ...);
- numpy scalars from metrics in the runtime info (``val/acc`` ...): ``numpy._core.multiarray.scalar``;
- ``builtins.getattr``: ``HistoryBuffer.__getstate__`` pickles the class-level statistics registry
  ``{'min': HistoryBuffer.min, ...}``, and pickle protocol 2 (torch.save's) writes a method reached
  through a dotted qualname as ``getattr(HistoryBuffer, 'min')``.

``OrderedDict`` (state dicts), ``Counter`` (MultiStepLR's milestones) and builtins are allowed by torch
already. Allowing ``builtins.getattr`` itself would let a checkpoint read any attribute of any object it
can name, so `register_mmengine_safe_globals` registers a restricted stand-in under that name instead:
it only resolves public functions defined on HistoryBuffer and raises UnpicklingError otherwise.

The list was found empirically: checkpoints from Runners with iteration- and epoch-based train loops,
a val loop whose metric returns numpy scalars and arrays, several param schedulers (LinearLR,
MultiStepLR, a momentum scheduler), SGD and AdamW optim wrappers (with clip_grad and accumulation),
LoggerHook, CheckpointHook (save_best, max_keep_ckpts) and EMAHook, through
``torch.serialization.get_unsafe_globals_in_checkpoint`` and ``torch.load(weights_only=True)``;
tests/test_mmengine_checkpoint.py keeps it honest.
"""

from __future__ import annotations

import importlib
import pickle
import types

import torch

__all__ = ["mmengine_safe_globals", "register_mmengine_safe_globals"]

# Classes mmengine pickles into checkpoints, as (module, attribute).
_MMENGINE_CLASSES = (("mmengine.logging.history_buffer", "HistoryBuffer"),)


def _numpy_safe_globals() -> list:
    """numpy arrays, scalars and dtypes, under numpy 2.x names plus numpy 1.x aliases.

    numpy 2.x pickles ``numpy._core.multiarray._reconstruct`` / ``.scalar``; a checkpoint written
    under numpy 1.x names ``numpy.core.multiarray.*`` for the same functions. A dtype is pickled as a
    call to ``numpy.dtype`` followed by BUILD on the instance, and torch checks the instance's type
    (``numpy.dtypes.Float64DType`` ...), so every ``numpy.dtypes`` class is allowed too.
    """
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with torchvision
        return []
    try:
        multiarray = importlib.import_module("numpy._core.multiarray")  # numpy >= 2
    except ImportError:  # pragma: no cover - numpy 1.x
        multiarray = importlib.import_module("numpy.core.multiarray")
    out: list = [np.ndarray, np.dtype]
    for name in ("_reconstruct", "scalar"):
        fn = getattr(multiarray, name)
        out += [(fn, f"numpy._core.multiarray.{name}"), (fn, f"numpy.core.multiarray.{name}")]
    dtypes = getattr(np, "dtypes", None)  # numpy >= 1.25; before that dtypes are plain np.dtype
    for name in dir(dtypes) if dtypes is not None else ():
        cls = getattr(dtypes, name)
        if isinstance(cls, type) and issubclass(cls, np.dtype):
            out.append(cls)
    return out


def _mmengine_classes() -> list:
    out = []
    for module, name in _MMENGINE_CLASSES:
        try:
            out.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):  # mmengine not installed, or moved the class
            continue
    return out


def _make_restricted_getattr(classes: tuple[type, ...]):
    """``getattr`` that resolves only public plain functions defined on ``classes``."""

    def restricted_getattr(obj, name, *default):
        if (
            not default
            and any(obj is cls for cls in classes)
            and isinstance(name, str)
            and not name.startswith("_")
            and isinstance(vars(obj).get(name), types.FunctionType)
        ):
            return vars(obj)[name]
        raise pickle.UnpicklingError(
            f"weights_only load: getattr({obj!r}, {name!r}) is not allowed; repro.compat only allows "
            f"methods of {[c.__qualname__ for c in classes]}"
        )

    restricted_getattr.__qualname__ = restricted_getattr.__name__ = "restricted_getattr"
    return restricted_getattr


_getattr_cache: dict[tuple[type, ...], object] = {}


def mmengine_safe_globals() -> list:
    """Everything `register_mmengine_safe_globals` allowlists: objects or (object, pickled name)."""
    classes = _mmengine_classes()
    out = _numpy_safe_globals() + classes
    if classes:
        key = tuple(classes)
        # one stand-in per class set, so repeated registration adds nothing new to torch's set
        fn = _getattr_cache.setdefault(key, _make_restricted_getattr(key))
        out.append((fn, "builtins.getattr"))
    return out


def register_mmengine_safe_globals() -> list:
    """Allow mmengine checkpoints under ``torch.load(weights_only=True)``; returns what was added.

    Idempotent (torch keeps the allowlist as a set and the entries are the same objects every call)
    and safe without mmengine (only numpy's array/scalar/dtype globals are added then). Call it again
    after ``torch.serialization.clear_safe_globals()``.
    """
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is None:  # pragma: no cover - torch < 2.4 has no allowlist (and does not default to it)
        return []
    safe = mmengine_safe_globals()
    add(safe)
    return safe
