"""Classification, profile "embedded": whole tables in minutes on a 2-core CPU.

The stand-in data (tasks.datasets: digits for ImageNet, shapes10 for CIFAR-10) at 32 px, no
augmentation, batch 32, the paper recipe's learning rate scaled linearly to batch 32 (Goyal et al.
2017: 0.1 at 256 -> 0.0125), a few epochs per network, sized so that DAIQ's Table 4 (7 networks x
fp32/ui8/daiq x 2 seeds) takes well under 30 minutes. Two small-scale substitutions: VGG-16 trains with
batch norm, AlexNet and InceptionV3 start from torchvision's ResNet/VGG initialisation (tasks.models).
What each per-network entry was measured against: docs/measurements.md.
"""

_base_ = ["./_common.py"]

batch_size = 32
lr = 0.0125
epochs = 3

networks = dict(
    alexnet=dict(input_size=64, lr=0.02, init="he"),  # 64: its least input (63) made even
    inception_v3=dict(input_size=75, init="he"),  # its least input
    vgg16=dict(arch="vgg16_bn"),  # plain VGG-16 does not train from scratch in this budget
)
datasets = dict(
    imagenet=dict(
        networks=dict(
            alexnet=dict(epochs=4),
            vgg16=dict(epochs=2),
            resnet18=dict(epochs=2),
            resnet34=dict(epochs=2),
            resnet50=dict(epochs=2),
            inception_v3=dict(epochs=2),
        )
    ),
    cifar10=dict(networks=dict(inception_v3=dict(epochs=2))),
)
