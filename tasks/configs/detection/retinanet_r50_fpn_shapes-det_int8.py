"""RetinaNet R-50-FPN on the embedded shapes-det set (COCO format), from scratch, INT8 by the hook.

MMDetection's shipped 1x COCO config with its dataset, schedule and runtime files replaced by
_shapes-det_recipe.py (the generated set and a short from-scratch recipe, shared with Faster R-CNN): no
ImageNet weights can be downloaded, so the backbone starts from its own initialisation with all stages
trainable and batch norm in training mode. The network is unchanged (ResNet-50, FPN, the RetinaNet head
with focal loss); only the input size and the schedule are small.
"""

# the shipped retinanet/retinanet_r50_fpn_1x_coco.py is this model file + the three files the recipe replaces
# + its test-time augmentation file (its lr 0.01 at batch 16 the recipe sets for batch 4)
_base_ = [
    "mmdet::_base_/models/retinanet_r50_fpn.py",
    "./_shapes-det_recipe.py",
    "mmdet::retinanet/retinanet_tta.py",
]

custom_imports = dict(imports=["tasks.detection"], allow_failed_imports=False)
custom_hooks = [dict(type="Int8TrainingHook", method="daiq")]

model = dict(backbone=dict(init_cfg=None, frozen_stages=-1, norm_eval=False), bbox_head=dict(num_classes=4))
