"""R-FCN ResNet-101 on the embedded shapes-det set, from scratch, INT8 by the hook.

The model of _rfcn_r101.py (tasks.rfcn) with the data and from-scratch recipe the other detectors use
(_shapes-det_recipe.py: 4 epochs, lr 0.0025 at batch 4): no ImageNet weights, all stages trainable, batch
norm in training mode. Changed for the small images, as the Faster R-CNN embedded config changes its
proposal counts: the images at their generated 128 px, not resized to the FPN detectors' 96 px, and
anchors of 24-96 px (scales 1.5, 3, 6 at stride 16) where R-FCN's 128-512 px would not fit (objects here
are 24-64 px); 300 training proposals per image (cost). The score maps (k = 7), OHEM with 128 RoIs and the
test settings are the paper's.

The input size: R-FCN reads one stride-16 map. At 96 px that map is 6x6 and an object covers one to
three cells, so a RoI's 7x7 bins sample nearly one place (R-50 FP32 AP@0.5 19.9, under RetinaNet's 24.8
on the same data); at 128 px, 8x8 and 1.5-4 cells: 28.2 (docs/tasks.md). R-FCN's paper resizes VOC
images to a 600 px short side, where an object spans many cells.

The position-sensitive maps learn at k*k = 49 times the base rate. Voting by average hands each of a
score's k*k filters 1/k^2 of its gradient, and each filter moves only that score's bin, so a class score
moves k^2 times slower than a plain linear classifier's at the same rate. R-FCN's paper trains 20k-110k
iterations from an ImageNet-pretrained backbone; here 480 from scratch left the RoI classifier at the
background prior (R-50 FP32: mAP@.5 0.8; with the maps at 49x: 19.9; docs/tasks.md).
"""

_base_ = ["./_rfcn_r101.py", "./_shapes-det_recipe.py"]

custom_imports = dict(imports=["tasks.detection"], allow_failed_imports=False)
custom_hooks = [dict(type="Int8TrainingHook", method="daiq")]

image_scale = (128, 128)  # the generated size: no resampling
# the recipe's pipelines with their Resize at this scale (`_base_` is the merged base config here)
train_pipeline = [{**t, "scale": image_scale} if t["type"] == "Resize" else t for t in _base_.train_pipeline]
test_pipeline = [{**t, "scale": image_scale} if t["type"] == "Resize" else t for t in _base_.test_pipeline]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

model = dict(
    backbone=dict(init_cfg=None, frozen_stages=-1, norm_eval=False),
    rpn_head=dict(anchor_generator=dict(scales=[1.5, 3, 6])),
    roi_head=dict(bbox_head=dict(num_classes=4)),
    train_cfg=dict(rpn_proposal=dict(nms_pre=500, max_per_img=300)),
    test_cfg=dict(rpn=dict(nms_pre=300, max_per_img=300)),
)
k_squared = 7 * 7  # the bins per RoI (roi_feat_size 7)
optim_wrapper = dict(
    paramwise_cfg=dict(
        custom_keys={
            "roi_head.bbox_head.ps_cls": dict(lr_mult=k_squared),
            "roi_head.bbox_head.ps_reg": dict(lr_mult=k_squared),
        }
    )
)
