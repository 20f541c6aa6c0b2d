"""Faster R-CNN R-50-FPN on the embedded shapes-det set (COCO format), from scratch, INT8 by the hook.

MMDetection's shipped 1x COCO config with its dataset, schedule and runtime files replaced by
_shapes-det_recipe.py (the generated set and a short from-scratch recipe, shared with RetinaNet): no
ImageNet weights can be downloaded, so the backbone starts from its own initialisation with all stages
trainable and batch norm in training mode. The network is unchanged (ResNet-50, FPN, RPN, the two-FC RoI
head); only the input size, the number of sampled proposals/RoIs per image (512 -> 128 RoIs, 2000 -> 500
RPN proposals: cost, not capacity) and the schedule are small.
"""

# the shipped faster-rcnn_r50_fpn_1x_coco.py is this model file + the three files the recipe replaces
_base_ = ["mmdet::_base_/models/faster-rcnn_r50_fpn.py", "./_shapes-det_recipe.py"]

custom_imports = dict(imports=["tasks.detection"], allow_failed_imports=False)
custom_hooks = [dict(type="Int8TrainingHook", method="daiq")]

model = dict(
    backbone=dict(init_cfg=None, frozen_stages=-1, norm_eval=False),
    roi_head=dict(bbox_head=dict(num_classes=4)),
    train_cfg=dict(rpn_proposal=dict(nms_pre=500, max_per_img=300), rcnn=dict(sampler=dict(num=128))),
    test_cfg=dict(rpn=dict(nms_pre=300, max_per_img=300)),
)
