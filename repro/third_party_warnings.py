"""Deprecation warnings of other packages that say nothing about a run, filtered at the entry points
(`repro`, `python -m tasks.<task>`, `python -m tables.<...>`), so the lines that matter stand out.

Each entry is a warning we cannot act on: mmengine 0.10.7 imports pkg_resources, which setuptools
deprecates (once per module that reaches it: five lines before a detection run's first iteration), and
mmengine's import scripts functions with torch.jit, which torch 2.13 deprecates. pyproject.toml's pytest
filterwarnings lists the same.
"""

from __future__ import annotations

import warnings

KNOWN = (
    ("pkg_resources is deprecated as an API", UserWarning),
    (r"`torch\.jit\.script` is deprecated", DeprecationWarning),
    (r"`torch\.jit\.interface` is deprecated", DeprecationWarning),
)


def filter_known() -> None:
    for message, category in KNOWN:
        warnings.filterwarnings("ignore", message=message, category=category)
