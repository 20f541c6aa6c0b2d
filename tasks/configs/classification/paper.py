"""Classification, profile "paper": the papers' protocol on ImageNet / CIFAR-10 from --data-root, for GPUs.

Neither UI8 nor DAIQ gives epochs or batch sizes for classification; UI8 sec. 4.2 says the ResNets
follow He et al. 2016 and the others use lr 0.1. Where they are silent, the values come from the
network's own paper or torchvision's reference recipe, as noted.
"""

_base_ = ["./_common.py"]

import os  # noqa: E402  (after _base_: MMEngine reads a config that imports first as a lazy-import one)

augment = True  # ImageNet: random resized crops and flips; CIFAR-10: 4-px padded crops and flips
num_workers = min(8, os.cpu_count() or 1)
log_interval = 50
val_interval = 1
lr = 0.1

datasets = dict(
    # torchvision's references: 90 epochs, lr /10 at 30 and 60, batch 256; He et al. 2016 sec. 3.4
    imagenet=dict(
        input_size=224,
        epochs=90,
        milestones=(30, 60),
        batch_size=256,
        networks=dict(
            inception_v3=dict(input_size=299),  # its own resolution
            # cosine, lr 0.1 (UI8 sec. 4.2, DAIQ); 150 epochs is our assumption
            mobilenet_v2=dict(epochs=150),
        ),
    ),
    # 200 epochs, x0.1 at 100 and 150, batch 128 where the papers do not say: our assumption
    cifar10=dict(
        input_size=32,
        epochs=200,
        milestones=(100, 150),
        batch_size=128,
        networks=dict(
            # He et al. 2016 sec. 4.2: lr /10 at 32k and 48k of 64k iterations (391 per epoch on 50k
            # images: epochs 82 and 123 of 164)
            resnet20=dict(epochs=164, milestones=(82, 123)),
            inception_v3=dict(input_size=299),  # CIFAR images upsampled to its own resolution
        ),
    ),
)
networks = dict(
    alexnet=dict(lr=0.01),  # Krizhevsky et al. 2012
    vgg16=dict(lr=0.01),  # Simonyan & Zisserman 2015
)
