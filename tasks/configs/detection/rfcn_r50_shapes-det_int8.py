"""R-FCN ResNet-50 on the embedded shapes-det set: rfcn_r101_shapes-det_int8.py with a 50-layer backbone
(R-FCN's paper reports both depths), at the budget of the R-50 Faster R-CNN and RetinaNet configs.
"""

_base_ = ["./rfcn_r101_shapes-det_int8.py"]

model = dict(backbone=dict(depth=50))
