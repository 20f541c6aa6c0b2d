"""The registry of training methods: one module, or one folder when it has helpers, per method.

Every module and folder here but `base` and `options` is a method: it is imported below and registers
its classes by name (`@register`), so adding a method is adding its file or its folder, nothing else.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from repro.methods.base import GradCodes, LayerQuantizer, Method

METHODS: dict[str, type[Method]] = {}
NOT_METHODS = ("base", "options")  # what every method shares


def register(cls: type[Method]) -> type[Method]:
    if cls.name in METHODS:
        raise ValueError(f"method {cls.name!r} is registered twice")
    METHODS[cls.name] = cls
    return cls


def list_methods() -> list[str]:
    return sorted(METHODS)


def build_method(method: str | Method, **options: Any) -> Method:
    """A Method instance from a registered name (or an instance, returned as it is)."""
    if isinstance(method, Method):
        if options:
            raise ValueError("pass options by name together with a method name, not with a Method instance")
        return method
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; known methods: {', '.join(list_methods())}")
    return METHODS[method](**options)


for _found in pkgutil.iter_modules(__path__):
    if _found.name not in NOT_METHODS:
        importlib.import_module(f"{__name__}.{_found.name}")

__all__ = ["GradCodes", "LayerQuantizer", "Method", "METHODS", "build_method", "list_methods", "register"]
