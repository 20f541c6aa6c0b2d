"""UI8 Table 6: results on CIFAR-10 (ResNet-20, MobileNetV2, InceptionV3).

The paper prints one FP row per model (UI8's own FP32 baseline); it is the paper FP32 of that model's "Ours"
row. The cited FP8 training row has no FP32 of its own in this table. UI8 prints no deltas. At the embedded
profile the stand-in for CIFAR-10 is Fashion-MNIST (docs/data.md says why); its numbers are not CIFAR-10
numbers. The generated header names the data actually used.
"""

from tables.spec import Spec, row_factory

R = row_factory("UI8", "Table 6", paper_dataset="cifar10", bits="8/8/8")

SPEC = Spec(
    name="ui8-table6",
    paper="UI8",
    table="Table 6",
    title="Results on CIFAR-10 dataset (UI8)",
    doc=__doc__,
    rows=(
        R("resnet20", "fp8", "ResNet-20 FP8 training [53] 8/8/8", int8=92.21, display="FP8 training"),
        R("resnet20", "ui8", "ResNet-20 FP 32/32/32 + Ours 8/8/8", 92.32, 91.95, display="Ours"),
        R("mobilenet_v2", "ui8", "MobileNetV2 FP 32/32/32 + Ours 8/8/8", 94.39, 93.38, display="Ours"),
        R("inception_v3", "ui8", "InceptionV3 FP 32/32/32 + Ours 8/8/8", 94.89, 95.00, display="Ours"),
    ),
    notes=("Bit-widths are W/A/G as printed; the FP rows are 32/32/32.",),
)
