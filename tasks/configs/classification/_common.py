"""Classification recipe entries every profile shares (tasks.recipes explains the layout).

The paper recipe's optimizer (SGD, momentum 0.9) and weight decay at every profile, and its scheduler
type: DAIQ ("Experiments") uses cosine for MobileNetV2 and multistep for all the other networks. UI8
(sec. 4.2) uses cosine for every non-ResNet; the tables reproduced are DAIQ's (its Tables 3 and 4 carry
UI8's rows too), so DAIQ's rule is used. Where the papers give no weight decay, the network's own
paper's or torchvision's reference recipe is used, as noted.
"""

momentum = 0.9
weight_decay = 1e-4  # He et al. 2016; torchvision's reference recipe
scheduler = "multistep"
milestones = (0.5, 0.75)  # multistep x0.1 at these fractions of the run (He et al.'s CIFAR proportions)
val_interval = None  # validate once, after the last epoch
arch = None  # the network the table names; a profile may train a stand-in architecture for it
init = None  # the network's own initialisation
input_size = 32
stand_in = None  # embedded / smoke: the dataset trained on in place of the paper's (paper: unused)
augment = False
train_limit = None  # all the training images
val_limit = None
num_workers = 0
warmup = 3  # iterations left out of ms_per_iter
log_interval = 10

networks = dict(
    mobilenet_v2=dict(scheduler="cosine"),
    alexnet=dict(weight_decay=5e-4),  # Krizhevsky et al. 2012 (torchvision's recipe too)
    vgg16=dict(weight_decay=5e-4),  # Simonyan & Zisserman 2015
)
datasets = dict(
    imagenet=dict(networks=dict(mobilenet_v2=dict(weight_decay=4e-5))),  # Sandler et al. 2018
    cifar10=dict(
        networks=dict(
            mobilenet_v2=dict(weight_decay=5e-4),  # our assumption: the papers do not say
            inception_v3=dict(weight_decay=5e-4),  # our assumption
        )
    ),
)
