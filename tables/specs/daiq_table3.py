"""DAIQ Table 3: top-1 accuracy on CIFAR-10 (ResNet-20, MobileNetV2, InceptionV3; UI8 vs DAIQ).

The UI8 rows are DAIQ's citation of UI8 Table 6; they agree with UI8's own table. At the embedded profile the
stand-in for CIFAR-10 is Fashion-MNIST (docs/data.md says why); its numbers are not CIFAR-10 numbers. The
generated header names the data actually used.
"""

from tables.spec import Spec, row_factory

R = row_factory("DAIQ", "Table 3", paper_dataset="cifar10")

SPEC = Spec(
    name="table3",
    paper="DAIQ",
    table="Table 3",
    title="The top-1 accuracy on CIFAR-10 dataset (DAIQ)",
    doc=__doc__,
    rows=(
        R("resnet20", "ui8", "ResNet-20 UI8", 92.32, 91.95, -0.37, display="UI8"),
        R("resnet20", "daiq", "ResNet-20 Ours", 92.35, 92.76, 0.41, display="Ours"),
        R("mobilenet_v2", "ui8", "MobileNetV2 UI8", 94.39, 93.38, -1.01, display="UI8"),
        R("mobilenet_v2", "daiq", "MobileNetV2 Ours", 94.73, 94.37, -0.36, display="Ours"),
        R("inception_v3", "ui8", "InceptionV3 UI8", 94.89, 95.00, 0.11, display="UI8"),
        R("inception_v3", "daiq", "InceptionV3 Ours", 95.00, 95.21, 0.21, display="Ours"),
    ),
)
