"""WAGEUBN Table II: accuracy with one data type quantized to 8 bits at a time (ResNet-18, ImageNet).

Each row quantizes only one of W, BN, A, GW, E1, E2 to 8-bit integers and keeps the rest (and the update) in
FP32; the option `quantize_only` names it. The table prints no FP32; WAGEUBN Table I's vanilla ResNet18 is
68.70/88.37. At the embedded profile the stand-in for ImageNet is Fashion-MNIST (docs/data.md says why); its
numbers are not ImageNet numbers. The generated header names the data actually used.
"""

from tables.spec import Spec, row_factory

R = row_factory("WAGEUBN", "Table II", paper_dataset="imagenet", bits=None)


def _row(part: str, top1: float, top5: float):
    return R(
        "resnet18",
        "wageubn",
        f"k{part} = 8",
        int8=top1,
        options={"quantize_only": part},
        bits=f"k{part} = 8, others 32",
        paper_extra={"int8_top5": top5},
    )


SPEC = Spec(
    name="wageubn-table2",
    paper="WAGEUBN",
    table="Table II",
    title="Accuracy sensitivity under WAGEUBN with single data quantization on ResNet18 (WAGEUBN)",
    doc=__doc__,
    # 5 at embedded: its rows differ by tenths of a point, which 3 seeds cannot tell apart (docs/data.md)
    seeds={"embedded": 5},
    rows=(
        _row("W", 67.98, 88.02),
        _row("BN", 68.01, 87.96),
        _row("A", 67.74, 87.89),
        _row("GW", 67.88, 87.89),
        _row("E1", 67.88, 87.92),
        _row("E2", 67.08, 87.44),
    ),
    notes=("kE2 = 8 uses the Flag QE2 function (WAGEUBN eq. 17), as the text says.",),
)
