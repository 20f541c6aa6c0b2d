"""What a table spec is: the paper's rows, their numbers and where each number comes from.

A `Spec` is one paper table. Each `Row` is one printed row (model x method): the registry name of
the method and its options, the paper's FP32/INT8/delta exactly as printed (None where the paper
prints none), and its `Source` (paper, table, row label). Where another paper (or another version of
the same paper) prints a different number for the same result, the row carries it in
`also_reported`, and the generated table footnotes it. Nothing here is measured; the generator
(tables.generate) runs the rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PAPERS = {
    "UI8": "Zhu et al., Towards Unified INT8 Training for Convolutional Neural Network, CVPR 2020",
    "UI8 (Dec 2019 preprint)": "Zhu et al., Towards Unified INT8 Training for Convolutional Neural Network, "
    "the preprint of 29 Dec 2019 that preceded CVPR 2020 (papers/ui8-unified-int8-cvpr2020-web.txt)",
    "DAIQ": "Zhao et al., Distribution Adaptive INT8 Quantization for Training CNNs, AAAI 2021",
    "WAGEUBN": "Yang et al., Training high-performance and large-scale deep neural networks with full "
    "8-bit integers, Neural Networks 125 (2020)",
}

# What the paper datasets are called in headers.
PAPER_DATASETS = {
    "imagenet": "ImageNet (ILSVRC2012)",
    "cifar10": "CIFAR-10",
    "ucf101": "UCF-101 (split 1)",
    "kinetics400": "Kinetics-400",
    "coco": "COCO 2017",
    "voc": "PASCAL VOC (07+12, VOC2007 test)",
}

# Two printed numbers that differ by less than this are the same number.
TOLERANCE = 0.005


@dataclass(frozen=True)
class Source:
    """Where a number is printed: paper key (see PAPERS), table, and the row label as printed."""

    paper: str
    table: str
    row: str

    def __post_init__(self):
        if self.paper not in PAPERS:
            raise ValueError(f"unknown paper {self.paper!r}; known: {', '.join(PAPERS)}")

    def __str__(self) -> str:
        return f"{self.paper} {self.table}, row '{self.row}'"


@dataclass(frozen=True)
class Reported:
    """The same cited result as printed somewhere else (another paper, or another version)."""

    source: Source
    fp32: float | None = None
    int8: float | None = None
    delta: float | None = None
    note: str = ""

    def numbers(self) -> str:
        parts = [f"{k} {v:.2f}" for k, v in (("FP32", self.fp32), ("INT8", self.int8)) if v is not None]
        if self.delta is not None:
            parts.append(f"Δ {self.delta:+.2f}")
        return "/".join(parts) if parts else "no number"


@dataclass(frozen=True)
class Row:
    """One printed row of a paper table.

    model, method: names the task and the method registry know (`repro.list_methods()`);
    options: method options (merged over the method's defaults when the cell is run);
    label: the row as the generated table shows it (the source keeps the label as printed);
    paper_fp32/int8/delta: the printed numbers, None where the paper prints none;
    paper_diverged: the paper reports the run as crashed (UI8 Table 3's "NaN");
    bits: the bit-width as printed (e.g. "2/8/8" for W/A/G), None where the paper gives none;
    variant: a configuration the options cannot express (part of what identifies the result);
    not_implemented: why this row cannot run with any method the registry will have, if so;
    paper_extra: further printed numbers (e.g. top-5);
    also_reported: the same result as printed elsewhere, where it differs (footnoted);
    notes: further footnotes (a reading the harness takes, an oddity in the paper).
    """

    model: str
    method: str
    source: Source
    paper_fp32: float | None = None
    paper_int8: float | None = None
    paper_delta: float | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""
    paper_dataset: str = "imagenet"
    paper_diverged: bool = False
    bits: str | None = None
    variant: str | None = None
    not_implemented: str | None = None
    paper_extra: Mapping[str, float] = field(default_factory=dict)
    also_reported: tuple[Reported, ...] = ()
    notes: tuple[str, ...] = ()

    def __post_init__(self):
        if self.paper_dataset not in PAPER_DATASETS:
            raise ValueError(f"unknown paper dataset {self.paper_dataset!r}")
        if not self.label:
            object.__setattr__(self, "label", self.source.row)

    @property
    def paper_delta_computed(self) -> float | None:
        """int8 - fp32 from the printed numbers (None unless both are printed)."""
        if self.paper_fp32 is None or self.paper_int8 is None:
            return None
        return round(self.paper_int8 - self.paper_fp32, 2)

    @property
    def printed_delta_disagrees(self) -> bool:
        """The printed delta is not int8 - fp32 of the printed numbers (flagged, never fixed)."""
        computed = self.paper_delta_computed
        return (
            self.paper_delta is not None
            and computed is not None
            and abs(self.paper_delta - computed) > TOLERANCE
        )

    def options_text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.options.items())


@dataclass(frozen=True)
class Spec:
    """One paper table: its rows and how to present them.

    name: the make target / `repro table` name; task: the tasks module that runs the cells;
    metric: the RunResult field compared with the paper's numbers; doc: the spec's docstring
    (which paper table, and what the stand-in data is at the embedded profile); seeds: this table's
    number of seeds at a profile where it is not the profile's default (tables.generate.DEFAULT_SEEDS),
    so that `make tables` regenerates the kept set as kept; `--seeds` overrides it.
    """

    name: str
    paper: str
    table: str
    title: str
    rows: tuple[Row, ...]
    doc: str = ""
    task: str = "classification"
    metric: str = "top1"
    metric_label: str = "top-1 accuracy (%)"
    notes: tuple[str, ...] = ()
    seeds: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self):
        if self.paper not in PAPERS:
            raise ValueError(f"unknown paper {self.paper!r}")
        if not self.rows:
            raise ValueError(f"spec {self.name} has no rows")

    @property
    def citation(self) -> str:
        return PAPERS[self.paper]

    @property
    def paper_datasets(self) -> list[str]:
        return sorted({r.paper_dataset for r in self.rows})


def row_factory(paper: str, table: str, **common: Any):
    """A shorthand for the specs: `R(model, method, label, fp32, int8, delta, **fields)`."""

    def make(
        model: str,
        method: str,
        label: str,
        fp32: float | None = None,
        int8: float | None = None,
        delta: float | None = None,
        **fields: Any,
    ) -> Row:
        kwargs = {**common, **fields}
        display = kwargs.pop("display", "")
        return Row(
            model=model,
            method=method,
            source=Source(paper, table, label),
            paper_fp32=fp32,
            paper_int8=int8,
            paper_delta=delta,
            label=display,
            **kwargs,
        )

    return make
