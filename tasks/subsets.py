"""The class-balanced subsets the short profiles train and validate on."""

from __future__ import annotations

from collections.abc import Iterable


def balanced_prefix(labels: Iterable[int], num_classes: int, limit: int) -> list[int]:
    """Indices of the first limit // num_classes items of each class (at least one), in their order."""
    per_class = max(1, limit // num_classes)
    seen: dict[int, int] = {}
    kept = []
    for i, label in enumerate(labels):
        label = int(label)  # a tensor's items (torchvision's MNIST targets) hash by identity, not value
        if seen.get(label, 0) < per_class:
            seen[label] = seen.get(label, 0) + 1
            kept.append(i)
    return kept
