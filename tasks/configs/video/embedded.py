"""Video, profile "embedded": the generated motion10 / motion20 clips (tasks.motion_sets).

The full ResNet3D-18/50 on 8-frame clips seen at 16x16 (the generated 32x32 frames resized: at 32x32 a
step costs 3x more), batch 16, no augmentation, one epoch (about 200 iterations; no clip is seen
twice), sized so that `make table6` with one seed stays within about 20 minutes on 2 cores. Hara et
al.'s lr 0.1 at batch 128 scaled linearly to batch 16 is 0.0125: R3D-18 learned unstably at it (seeds
30-54%) and trains at 0.005; R3D-50 diverges at it and trains at 0.0015 (docs/measurements.md).
"""

_base_ = ["./_common.py"]

clip_len = 8  # the generated clips' length
frame_interval = 1
input_size = 16
resize = None
batch_size = 16
epochs = 1

networks = dict(r3d_18=dict(lr=0.005), r3d_50=dict(lr=0.0015))
