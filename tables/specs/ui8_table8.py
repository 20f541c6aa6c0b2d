"""UI8 Table 8: detection mAP on PASCAL VOC (Faster R-CNN ResNet-50, R-FCN ResNet-101), FP vs Ours 8/8/8.

UI8 sec. 4.3 follows the hyper-parameters of Li et al. 2019 (FQN) and uses the classification alpha and
beta. Faster R-CNN runs as MMDetection 3's shipped R-50-FPN VOC 07+12 config (tasks/configs/detection/),
scored AP@0.5 on VOC2007 test. MMDetection 3 ships no R-FCN: tasks.rfcn builds it from MMDetection's
parts and torchvision's ps_roi_align (config rfcn_r101_voc0712_int8.py, the schedule of Faster R-CNN's). At
the embedded profile VOC is stood in for by `shapes-det` (tasks.detection_data: generated shapes in COCO
format, read by MMDetection's CocoDataset, scored AP@0.5 by its CocoMetric), trained from scratch at 96 px;
its numbers are not VOC numbers. The generated header names the data actually used.
"""

from tables.spec import Spec, row_factory
from tables.specs.ui8_detection_note import UI8_DETECTION

R = row_factory("UI8", "Table 8", paper_dataset="voc", bits="8/8/8")

SPEC = Spec(
    name="ui8-table8",
    paper="UI8",
    table="Table 8",
    title="Results on PASCAL VOC dataset (UI8)",
    doc=__doc__,
    seeds={"embedded": 1},  # a detection seed costs what a classification table does on a CPU
    task="detection",
    metric="map",
    metric_label="mAP (%): VOC AP@0.5",
    rows=(
        R(
            "faster_rcnn_r50_fpn",
            "ui8",
            "Faster R-CNN ResNet-50 FP / Ours",
            82.0,
            81.9,
            display="Faster R-CNN Ours",
        ),
        R(
            "rfcn_r101",
            "ui8",
            "RFCN ResNet-101 FP / Ours",
            80.8,
            79.1,
            display="R-FCN (ResNet-101) Ours",
        ),
    ),
    notes=(
        "UI8 does not name the neck; MMDetection's default ResNet-50 Faster R-CNN (R-50-FPN) is run.",
        "UI8 prints no deltas; Δ is computed from its FP and INT8 numbers.",
        UI8_DETECTION,
    ),
)
