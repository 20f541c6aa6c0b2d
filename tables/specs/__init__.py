"""The table specs, one module per paper table, by make-target name (DAIQ's numbering is bare)."""

from __future__ import annotations

import importlib

from tables.spec import Spec

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

SPECS: dict[str, Spec] = {
    spec.name: spec for spec in (importlib.import_module(f"tables.specs.{m}").SPEC for m in _MODULES)
}


def list_tables() -> list[str]:
    return list(SPECS)


def get_spec(name: str) -> Spec:
    if name not in SPECS:
        raise KeyError(f"unknown table {name!r}; choose from {', '.join(SPECS)}")
    return SPECS[name]
