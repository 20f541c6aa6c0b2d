"""The table specs, one module per paper table, by make-target name (DAIQ's numbering is bare)."""

from __future__ import annotations

import importlib

from tables.spec import Spec
from tables.speed_spec import PeriodSpec, StepTimeSpec

# One name per spec module, in the order tables are listed (a new table is one line here).
_MODULES = (
    "daiq_table1",
    "daiq_table2",
    "daiq_table3",
    "daiq_table4",
    "daiq_table5",
    "daiq_table6",
    "ui8_table3",
    "ui8_table4",
    "ui8_table5",
    "ui8_table6",
    "ui8_table7",
    "ui8_table8",
    "ui8_table9",
    "wageubn_table1",
    "wageubn_table2",
)

# The speed tables: timings of training steps, not trainings (tables.speed).
_SPEED_MODULES = ("daiq_table7", "ui8_table10", "ui8_table2")


def _load(modules):
    return {spec.name: spec for spec in (importlib.import_module(f"tables.specs.{m}").SPEC for m in modules)}


SPECS: dict[str, Spec] = _load(_MODULES)
SPEED_SPECS: dict[str, StepTimeSpec | PeriodSpec] = _load(_SPEED_MODULES)


def list_tables() -> list[str]:
    return [*SPECS, *SPEED_SPECS]


def get_spec(name: str):
    if name in SPEED_SPECS:
        return SPEED_SPECS[name]
    if name not in SPECS:
        raise KeyError(f"unknown table {name!r}; choose from {', '.join(list_tables())}")
    return SPECS[name]
