"""The registry of training methods: one module per method, each registering itself by name."""

from __future__ import annotations

from typing import Any

from repro.methods.base import GradCodes, LayerQuantizer, Method

METHODS: dict[str, type[Method]] = {}


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


# Importing the modules registers the methods.
from repro.methods import afp, daiq, dorefa, fp8, fp32, gq, ui8, wage, wageubn  # noqa: E402, F401

__all__ = ["GradCodes", "LayerQuantizer", "Method", "METHODS", "build_method", "list_methods", "register"]
