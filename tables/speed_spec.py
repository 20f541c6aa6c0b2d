"""What a speed-table spec is: the paper's timing rows, their printed numbers and where they come from.

Speed tables time training steps instead of training networks (tables.speed runs them). Two kinds:

* `StepTimeSpec` (DAIQ Table 7, UI8 Table 10): one row per precision / method, the paper's forward,
  backward and iteration times converted to milliseconds;
* `PeriodSpec` (UI8 Table 2): seconds per iteration of UI8 at several clip-update periods.
"""

from __future__ import annotations

from dataclasses import dataclass

from tables.spec import PAPERS, Source

# Rows name variants of repro.steptime; "half" is FP16 autocast on CUDA and its stand-in, bf16 autocast,
# on the CPU; "tf32" exists on CUDA only.
HALF = "half"


OPT_IN = (
    "Not in the paper, and not the method's default: opt-in, the layers INT8 does not quantize (BatchNorm, "
    "ReLU, the first convolution and the classifier) under the FP16 row's autocast, and the INT8 products' "
    "outputs and input gradients in its 16 bits; the same int8 products and quantization rules, applied to "
    "16-bit values."
)


def with_half_float_layers(method: str) -> str:
    """The row variant of an INT8 method whose float layers run under the half autocast, the products'
    outputs in 16 bits too: `repro step-time`'s `<method>+bf16` / `+fp16`, an opt-in semantics
    (docs/kernels.md, "Kernel timing"), not the method's default."""
    return f"{method}+{HALF}"


def variant_name(row_variant: str, half: str) -> str:
    """The timed variant a spec row names: HALF is the device's half autocast (`half`: "bf16" or "fp16"),
    and so is the suffix of with_half_float_layers."""
    if row_variant == HALF:
        return half
    method, plus, amp = row_variant.partition("+")
    return f"{method}+{half}" if plus and amp == HALF else row_variant


@dataclass(frozen=True)
class StepTimeRow:
    precision: str  # FP32 / FP16 / INT8, as the table prints it
    variant: str  # a variant of the standard step-time run (tables.speed.step_variants)
    label: str
    source: Source | None = None  # None: a row the paper does not print
    paper_forward_ms: float | None = None
    paper_backward_ms: float | None = None
    paper_iteration_ms: float | None = None
    notes: tuple[str, ...] = ()


class _PaperSpec:
    """What both speed specs share: a paper from tables.spec.PAPERS and its citation."""

    paper: str

    def __post_init__(self):
        if self.paper not in PAPERS:
            raise ValueError(f"unknown paper {self.paper!r}")

    @property
    def citation(self) -> str:
        return PAPERS[self.paper]


@dataclass(frozen=True)
class StepTimeSpec(_PaperSpec):
    name: str
    paper: str
    table: str
    title: str
    rows: tuple[StepTimeRow, ...]
    paper_setting: str  # the paper's device, model and batch, as printed
    paper_unit: str = "ms"  # what the paper prints ("s" is converted to ms in the rows)
    model: str = "resnet50"
    doc: str = ""
    notes: tuple[str, ...] = ()
    kind = "step-time"


@dataclass(frozen=True)
class PeriodRow:
    period: int
    paper_s_per_iter: float
    source: Source


@dataclass(frozen=True)
class PeriodSpec(_PaperSpec):
    name: str
    paper: str
    table: str
    title: str
    rows: tuple[PeriodRow, ...]
    paper_setting: str
    method: str = "ui8"
    model: str = "resnet50"
    doc: str = ""
    notes: tuple[str, ...] = ()
    kind = "period"


def seconds(value: float | None) -> float | None:
    """A time printed in seconds, in milliseconds (rounded to the printed precision)."""
    return None if value is None else round(value * 1000, 6)
