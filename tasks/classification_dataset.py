"""The image classification task's dataset: one split of ImageNet / CIFAR-10 or a stand-in, as MMEngine
reads it (registered as ``tasks.ClassificationDataset``)."""

from __future__ import annotations

from torch.utils.data import Dataset
from torchvision import transforms as T
from torchvision.datasets import MNIST, FashionMNIST

from tasks import datasets as D
from tasks import package_data as P
from tasks import resized_images
from tasks.bad_data import SkipPolicy
from tasks.registry import DATASETS
from tasks.subsets import balanced_prefix


@DATASETS.register_module()
class ClassificationDataset(Dataset):
    """One split of imagenet / cifar10 (from `root`) or digits / shapes10 (made in the cache `root`).

    Items are dict(inputs=float tensor CxHxW, normalised, labels=int). `limit` keeps a class-balanced
    prefix of that many images (the first ones of each class, in file order). An unreadable image is a
    BadDataError naming it; with `skip_bad` the next readable one is taken instead, and the skip is
    logged and listed (tasks.bad_data.SkipPolicy).
    """

    def __init__(
        self,
        dataset: str,
        split: str,
        root: str | None = None,
        input_size: int = 32,
        augment: bool = False,
        limit: int | None = None,
        skip_bad: bool = False,
    ):
        train = split == "train"
        mean, std = D.normalization(dataset, cache=root)
        steps: list = []
        if dataset == "imagenet":
            if train and augment:
                steps += [T.RandomResizedCrop(input_size), T.RandomHorizontalFlip()]
            else:
                steps += [T.Resize(round(input_size / 0.875)), T.CenterCrop(input_size)]
        elif (
            dataset in P.PACKAGES
        ):  # 28x28 grey: as three channels at the model's input size, no augmentation
            steps += [T.Grayscale(num_output_channels=3), T.Resize((input_size, input_size), antialias=True)]
        else:
            if train and augment:  # CIFAR-10: 4-px padded random crops and flips (He et al. 2016)
                steps += [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()]
            if dataset == D.DIGITS or input_size != 32:
                steps.append(T.Resize((input_size, input_size), antialias=True))
        tensor_steps = [T.ToTensor(), T.Normalize(mean, std)]
        transform = T.Compose([*steps, *tensor_steps])
        self.resized = None  # package sets: (the process's resized images, the PIL steps, the tensor steps)
        if dataset == "imagenet":
            if root is None:
                raise D.DatasetNotFoundError("ImageNet needs a data root (--data-root); none was given")
            self.base = D.image_folder(root, "train" if train else "val", transform)
        elif dataset == "cifar10":
            if root is None:
                raise D.DatasetNotFoundError("CIFAR-10 needs a data root (--data-root); none was given")
            self.base = D.cifar10(root, train, transform)
        elif dataset == D.DIGITS:
            self.base = D.image_folder(D.ensure_digits(root), "train" if train else "val", transform)
        elif dataset == D.SHAPES10:
            self.base = D.cifar10(D.ensure_shapes10(root), train, transform)
        elif dataset in P.PACKAGES:
            reader = FashionMNIST if dataset == P.FASHION_MNIST else MNIST
            self.base = reader(str(P.ensure(dataset, root)), train=train, transform=transform, download=False)
            images = resized_images.kept((dataset, str(self.base.root), train, input_size))
            self.resized = (images, T.Compose(steps), T.Compose(tensor_steps))
        else:
            known = ", ".join(["imagenet", "cifar10", D.DIGITS, D.SHAPES10, *P.PACKAGES])
            raise ValueError(f"unknown dataset {dataset!r}; choose from {known}")
        self.classes = list(self.base.classes)
        self.root = str(getattr(self.base, "root", root))  # where the split is read from, for error lines
        self.metainfo = {"dataset": dataset, "split": split, "classes": tuple(self.classes)}
        self.indices = list(range(len(self.base)))
        if limit is not None:
            self.indices = balanced_prefix(self.base.targets, len(self.classes), limit)
        self.skip_policy = SkipPolicy(skip_bad)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict:
        return self.skip_policy.fetch(self._item, i, len(self))

    def _item(self, i: int) -> dict:
        index = self.indices[i]
        if self.resized is not None:
            images, pil_steps, tensor_steps = self.resized
            image = resized_images.resized(images, index, self.base.data[index], pil_steps)
            return {"inputs": tensor_steps(image), "labels": int(self.base.targets[index])}
        image, label = self.base[index]
        return {"inputs": image, "labels": label}
