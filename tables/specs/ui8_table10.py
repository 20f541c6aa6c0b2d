"""UI8 Table 10: end-to-end time of one round of ResNet-50 training, FP32 (cuDNN) against UI8's INT8.

The paper times its DP4A INT8 implementation on a GeForce GTX 1080 Ti at batch 64 and prints seconds;
the rows carry them in milliseconds. The measured rows come from the same side-by-side run as DAIQ
Table 7 (tables.speed), so the two tables share their cell.
"""

from tables.spec import Source
from tables.speed_spec import HALF, OPT_IN, StepTimeRow, StepTimeSpec, seconds, with_half_float_layers


def _src(row: str) -> Source:
    return Source("UI8", "Table 10", row)


SPEC = StepTimeSpec(
    name="ui8-table10",
    paper="UI8",
    table="Table 10",
    title="End-to-end average time for a round of INT8 training (ResNet-50)",
    paper_setting="GeForce GTX 1080 Ti, ResNet-50, batch 64; printed in seconds (converted to ms here)",
    paper_unit="s",
    doc=__doc__,
    rows=(
        StepTimeRow(
            "FP32",
            "fp32",
            "FP32 (cuDNN)",
            _src("FP32 (cuDNN)"),
            seconds(0.117),
            seconds(0.221),
            seconds(0.360),
        ),
        StepTimeRow(
            "FP16", HALF, "FP16", notes=("Not in UI8 Table 10; timed in the same run for comparison.",)
        ),
        StepTimeRow(
            "INT8", "ui8", "INT8 (ours)", _src("INT8 (ours)"), seconds(0.101), seconds(0.171), seconds(0.293)
        ),
        StepTimeRow(
            "INT8", with_half_float_layers("ui8"), "INT8 (ours) + 16-bit float layers", notes=(OPT_IN,)
        ),
    ),
)
