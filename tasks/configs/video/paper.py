"""Video, profile "paper": UCF-101 / Kinetics-400 from --data-root, for GPUs under torchrun.

DAIQ gives no video recipe; this is Hara et al. 2018's ("Can spatiotemporal 3D CNNs retrace the
history of 2D CNNs and ImageNet?", CVPR): 16-frame clips, 112x112 crops of frames with a 128-px short
side (random crop and flip for training, centre for testing), lr 0.1, batch 128, from scratch. 100
epochs is our assumption.
"""

_base_ = ["./_common.py"]

clip_len = 16
frame_interval = 1
input_size = 112
resize = 128
batch_size = 128
lr = 0.1
epochs = 100
augment = True
num_workers = 8
log_interval = 50
