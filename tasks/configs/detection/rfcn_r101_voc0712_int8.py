"""R-FCN ResNet-101 on PASCAL VOC 07+12, tested on VOC2007 test (mAP@0.5, 11 points): UI8 Table 8's row.

The model is tasks.rfcn's (MMDetection 3 ships none; _rfcn_r101.py says what it is); data, schedule and
runtime are MMDetection's shipped VOC 07+12 files and the schedule of its Faster R-CNN VOC config, so the
table's two detectors train alike: 4 epochs over the 3-times repeated set (12 passes), SGD lr 0.01 at
batch 16 (8 GPUs x 2 images), x0.1 after epoch 3. R-FCN's paper trained 30k iterations of 8 images at
lr 0.001 then 0.0001; UI8 names neither. Data under data/VOCdevkit/ as MMDetection expects (or
`repro train --task detection --data-root ...`), ImageNet-pretrained ResNet-101 from torchvision.
Change `method` to "ui8" or "fp32" (same layer classes, no quantization) for the other columns.
"""

_base_ = ["./_rfcn_r101.py", "mmdet::_base_/datasets/voc0712.py", "mmdet::_base_/default_runtime.py"]

custom_imports = dict(imports=["tasks.detection"], allow_failed_imports=False)
custom_hooks = [dict(type="Int8TrainingHook", method="daiq")]

max_epochs = 4
train_cfg = dict(type="EpochBasedTrainLoop", max_epochs=max_epochs, val_interval=1)
val_cfg = dict(type="ValLoop")
test_cfg = dict(type="TestLoop")
param_scheduler = [
    dict(type="MultiStepLR", begin=0, end=max_epochs, by_epoch=True, milestones=[3], gamma=0.1)
]
optim_wrapper = dict(
    type="OptimWrapper", optimizer=dict(type="SGD", lr=0.01, momentum=0.9, weight_decay=0.0001)
)
auto_scale_lr = dict(enable=False, base_batch_size=16)
