"""DAIQ Table 6: top-1 accuracy of video classification (ResNet3D-18/50 on UCF-101 split 1 and Kinetics-400).

DAIQ's section "Video Classification": the method carries over to 3-D convolution by treating depth
like height and width, with the (k, A) of the 2-D experiments. The paper gives no training recipe and
does not say whether top-1 is clip or video accuracy; tasks.video documents the choices taken. At the
embedded profile the stand-ins are generated clips of moving shapes whose class is the motion (a single
frame cannot tell the classes apart): `motion10` for UCF-101 (written in UCF-101's frame-folder layout
with split-1 lists) and `motion20` for Kinetics-400 (in its raw-frame list format), 8 frames of 32x32;
their numbers are not UCF-101 or Kinetics-400 numbers. The generated header names the data actually
used.
"""

from tables.spec import Spec, row_factory

UCF = row_factory("DAIQ", "Table 6", paper_dataset="ucf101")
K400 = row_factory("DAIQ", "Table 6", paper_dataset="kinetics400")

SPEC = Spec(
    name="table6",
    paper="DAIQ",
    table="Table 6",
    title="The top-1 accuracy of video classification (DAIQ)",
    doc=__doc__,
    task="video",
    rows=(
        UCF("r3d_18", "daiq", "UCF-101 ResNet3D-18", 54.9, 55.1, 0.2, display="UCF-101 ResNet3D-18 Ours"),
        UCF("r3d_50", "daiq", "UCF-101 ResNet3D-50", 57.6, 57.5, -0.1, display="UCF-101 ResNet3D-50 Ours"),
        K400(
            "r3d_18",
            "daiq",
            "Kinetics-400 ResNet3D-18",
            51.0,
            51.4,
            0.4,
            display="Kinetics-400 ResNet3D-18 Ours",
        ),
        K400(
            "r3d_50",
            "daiq",
            "Kinetics-400 ResNet3D-50",
            58.5,
            58.8,
            0.3,
            display="Kinetics-400 ResNet3D-50 Ours",
        ),
    ),
    notes=(
        "DAIQ trains the video models with the (k, A) of its 2-D experiments: k = 1.0, A = 0.8 (the daiq "
        "defaults).",
    ),
)
