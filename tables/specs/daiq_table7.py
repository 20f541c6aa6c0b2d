"""DAIQ Table 7: running time of ResNet-50 training (forward, backward, iteration), FP32 / FP16 / INT8.

The paper times its own tensor-core INT8 kernels against cuDNN 7.6.5 FP32 and FP16 on a GeForce RTX
2080 Ti at batch 64. Here every row is timed on the device at hand (tables.speed), side by side in one
run: FP32, FP16 as a user runs it (autocast + GradScaler, channels-last; on the CPU bf16 autocast
stands in), and INT8 training with DAIQ ("Ours") and, for comparison, UI8 and plain GQ; then each INT8
method again with its float layers in 16 bits (opt-in: the paper does not say in what precision its INT8
run keeps the layers it does not quantize).
"""

from tables.spec import Source
from tables.speed_spec import HALF, OPT_IN, StepTimeRow, StepTimeSpec, with_half_float_layers


def _src(column: str) -> Source:
    return Source("DAIQ", "Table 7", column)


SPEC = StepTimeSpec(
    name="table7",
    paper="DAIQ",
    table="Table 7",
    title="Running time of ResNet-50 training",
    paper_setting="GeForce RTX 2080 Ti, ResNet-50, batch 64 (224x224 ImageNet input), cuDNN 7.6.5",
    doc=__doc__,
    rows=(
        StepTimeRow("FP32", "fp32", "FP32", _src("FP32"), 71.1, 151.3, 237.8),
        StepTimeRow(
            "FP32",
            "tf32",
            "FP32 (TF32 tensor cores)",
            notes=(
                "Not in the paper (a 2080 Ti has no TF32); CUDA only: what torch's FP32 runs on Ampere+.",
            ),
        ),
        StepTimeRow("FP16", HALF, "FP16", _src("FP16"), 38.3, 87.4, 136.4),
        StepTimeRow("INT8", "daiq", "INT8 Ours (DAIQ)", _src("INT8"), 33.7, 72.6, 115.6),
        StepTimeRow("INT8", "ui8", "INT8 UI8", notes=("Not in DAIQ Table 7; UI8 Table 10 times it.",)),
        StepTimeRow(
            "INT8", "gq", "INT8 GQ", notes=("Not in DAIQ Table 7: DAIQ's per-tensor ablation baseline.",)
        ),
        *(
            StepTimeRow(
                "INT8", with_half_float_layers(method), f"{label} + 16-bit float layers", notes=(OPT_IN,)
            )
            for method, label in (("daiq", "INT8 Ours (DAIQ)"), ("ui8", "INT8 UI8"), ("gq", "INT8 GQ"))
        ),
    ),
)
