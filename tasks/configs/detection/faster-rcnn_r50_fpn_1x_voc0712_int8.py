"""Faster R-CNN R-50-FPN on PASCAL VOC 07+12, tested on VOC2007 test (mAP@0.5, 11 points).

INT8 training (DAIQ) is switched on by the two keys below.
Everything else is MMDetection's shipped config, unchanged: data under data/ as MMDetection expects
(or `repro train --task detection --data-root ...`), ImageNet-pretrained backbone from torchvision.
Change `method` to "ui8" or "fp32" (same layer classes, no quantization) for the other columns.
"""

_base_ = "mmdet::pascal_voc/faster-rcnn_r50_fpn_1x_voc0712.py"

custom_imports = dict(imports=["tasks.detection"], allow_failed_imports=False)
custom_hooks = [dict(type="Int8TrainingHook", method="daiq")]
