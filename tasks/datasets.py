"""Classification data: CIFAR-10 and ImageNet from a data root, and two generated stand-ins.

Real data (profile ``paper``) is read from ``--data-root`` and never downloaded:

- CIFAR-10 in torchvision's on-disk format: ``<root>/cifar-10-batches-py/data_batch_1..5, test_batch,
  batches.meta``, read by ``torchvision.datasets.CIFAR10(root, download=False)`` (checksums included);
- ImageNet (ILSVRC2012) as two ImageFolders: ``<root>/train/<class>/*.JPEG`` and
  ``<root>/val/<class>/*.JPEG`` (the validation images sorted into their class folders).

A missing root is one error line (DatasetNotFoundError) naming the expected layout.

The generated stand-ins (profile ``smoke``; ``embedded`` trains on Fashion-MNIST, tasks.package_data)
need no download. Each is made once, on first use, in the data cache (tasks.data_cache: atomically, so a
killed run never leaves half a dataset). Each is written in a real on-disk format and read back by the
same loader code as the dataset it stands in for:

- ``digits`` (stands in for ImageNet): scikit-learn's handwritten digits (``load_digits``: 1,797 real
  8x8 grey-level scans of handwritten 0-9 from 43 writers, UCI), split 1,437 train / 360 val,
  stratified and seeded, written as 8x8 PNGs into ``digits-v1/train/<digit>/`` and ``val/<digit>/``
  and read back through the ImageNet ImageFolder code path (the transforms resize them to the model's
  input size). Real data, small and fast: what the models learn from it is real handwriting.
- ``shapes10`` (stands in for CIFAR-10): a generated, seeded 10-class set of 32x32 RGB images, 5,000
  train (five batches of 1,000) / 1,000 test, exactly balanced, written in CIFAR-10's python-pickle
  batch format into ``shapes10-v3/cifar-10-batches-py/`` and read back by torchvision's CIFAR10 class
  (with the checksums of the written files). The classes are disc, ellipse, ring, triangle, square,
  hexagon, star, cross, stripes and checkerboard. Each image (drawn at 64x64, averaged down to 32x32)
  has a random dark background colour with a gradient; one large object of its class (radius 30-45% of
  the side) in a random colour at least 0.25 grey levels lighter than the background, off-centre by up
  to half the free room, rotated by up to +-20 degrees; at most one smaller distractor object of any
  class and one random line, in front or behind; and Gaussian pixel noise (sigma 2-8 of 255). The label
  is the largest object. Disc / hexagon / ellipse and square / cross overlap at this resolution, so FP32
  models do not reach 100%. SHAPES10_DIFFICULTY holds these settings and says why they are not harder.

Both are for exercising the whole pipeline (data, INT8 layers, schedules, evaluation, timing) in
minutes on a CPU; their accuracies are not ImageNet or CIFAR-10 numbers and are never presented as such.
"""

from __future__ import annotations

import hashlib
import math
import pickle
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from tasks import package_data
from tasks.bad_data import BadDataError, read_image
from tasks.data_cache import ensure_set, read_manifest

DIGITS = "digits"
SHAPES10 = "shapes10"
VERSIONS = {DIGITS: 1, SHAPES10: 3}
SHAPES10_CLASSES = (
    "disc",
    "ellipse",
    "ring",
    "triangle",
    "square",
    "hexagon",
    "star",
    "cross",
    "stripes",
    "checkerboard",
)
CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR_TRAIN = [f"data_batch_{i}" for i in range(1, 6)]
CIFAR_TEST = "test_batch"
CIFAR_META = "batches.meta"

# Normalisation of the real datasets (the usual published per-channel values).
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


class DatasetNotFoundError(FileNotFoundError):
    """A data root is missing or not in the expected layout; the message is one line naming it."""


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------------------------- digits
def _write_digits(out: Path, seed: int = 0) -> dict:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # 0..16 grey levels -> 0..255
    idx = np.arange(len(images))
    train_idx, val_idx = train_test_split(idx, test_size=360, stratify=digits.target, random_state=seed)
    counts = {}
    for split, chosen in (("train", np.sort(train_idx)), ("val", np.sort(val_idx))):
        for i in chosen:
            label = int(digits.target[i])
            folder = out / split / str(label)
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(images[i], mode="L").save(folder / f"{i:04d}.png")
        counts[split] = len(chosen)
    train = images[np.sort(train_idx)].astype(np.float64) / 255.0
    return {
        "name": DIGITS,
        "version": VERSIONS[DIGITS],
        "format": "ImageFolder PNG: train/<digit>/NNNN.png, val/<digit>/NNNN.png (8x8 grey)",
        "source": "sklearn.datasets.load_digits (UCI optical recognition of handwritten digits)",
        "seed": seed,
        "classes": [str(c) for c in range(10)],
        "num_train": counts["train"],
        "num_val": counts["val"],
        "mean": [float(train.mean())] * 3,
        "std": [float(train.std())] * 3,
    }


def ensure_digits(cache=None) -> Path:
    """The digits ImageFolder root (with train/ and val/), made on first use."""
    return ensure_set(DIGITS, VERSIONS[DIGITS], _write_digits, cache)


# --------------------------------------------------------------------------------------------- shapes10
_SS = 2  # supersampling: draw at 64x64, average 2x2 blocks down to 32x32
_SIZE = 32


def _polygon(n: int, r: float, cx: float, cy: float, theta: float, inner: float | None = None):
    """Regular n-gon (or n-pointed star with inner radius ratio `inner`) vertices."""
    pts = []
    steps = 2 * n if inner else n
    for k in range(steps):
        rad = r * (inner if inner and k % 2 else 1.0)
        a = theta + 2 * math.pi * k / steps
        pts.append((cx + rad * math.cos(a), cy + rad * math.sin(a)))
    return pts


def _cross(r: float, cx: float, cy: float, theta: float, arm: float):
    w = r * arm
    base = [(-w, -r), (w, -r), (w, -w), (r, -w), (r, w), (w, w), (w, r), (-w, r), (-w, w), (-r, w)]
    base += [(-r, -w), (-w, -w)]
    c, s = math.cos(theta), math.sin(theta)
    return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in base]


def _shape_mask(cls: int, r: float, cx: float, cy: float, theta: float, rng: np.random.Generator):
    """A float mask (H, W) in [0, 1] of one object of class `cls` at supersampled resolution."""
    n = _SIZE * _SS
    img = Image.new("L", (n, n), 0)
    draw = ImageDraw.Draw(img)
    if cls in (0, 1, 2):  # disc, ellipse, ring: drawn as a rotated polygon of many vertices
        aspect = 1.0 if cls != 1 else rng.uniform(0.4, 0.7)
        t = np.linspace(0, 2 * np.pi, 48, endpoint=False)
        x, y = r * np.cos(t), r * aspect * np.sin(t)
        c, s = math.cos(theta), math.sin(theta)
        draw.polygon(list(zip(cx + x * c - y * s, cy + x * s + y * c, strict=True)), fill=255)
        if cls == 2:
            ri = r * rng.uniform(0.45, 0.65)
            draw.ellipse((cx - ri, cy - ri, cx + ri, cy + ri), fill=0)
    elif cls == 3:
        draw.polygon(_polygon(3, r * 1.1, cx, cy, theta), fill=255)
    elif cls == 4:
        draw.polygon(_polygon(4, r, cx, cy, theta), fill=255)
    elif cls == 5:
        draw.polygon(_polygon(6, r, cx, cy, theta), fill=255)
    elif cls == 6:
        draw.polygon(_polygon(5, r * 1.1, cx, cy, theta, inner=rng.uniform(0.38, 0.5)), fill=255)
    elif cls == 7:
        draw.polygon(_cross(r, cx, cy, theta, arm=rng.uniform(0.28, 0.42)), fill=255)
    else:  # 8 stripes, 9 checkerboard: a textured disc
        yy, xx = np.mgrid[0:n, 0:n].astype(np.float64) + 0.5
        u = (xx - cx) * math.cos(theta) + (yy - cy) * math.sin(theta)
        v = -(xx - cx) * math.sin(theta) + (yy - cy) * math.cos(theta)
        period = r * rng.uniform(0.45, 0.7)
        phase = rng.uniform(0, 2 * np.pi)
        su = np.sin(2 * np.pi * u / period + phase)
        tex = su > 0 if cls == 8 else (su * np.sin(2 * np.pi * v / period + phase)) > 0
        disc = (u**2 + v**2) <= r**2
        return (tex & disc).astype(np.float64)
    return np.asarray(img, dtype=np.float64) / 255.0


_GREY = np.array([0.299, 0.587, 0.114])


def _colour(rng, avoid=None, min_dist=0.0, min_grey=0.0, lighter=None):
    """A random RGB colour at least min_dist (RGB distance) and min_grey (grey level) away from `avoid`,
    lighter (True) or darker (False) than it when `lighter` is given."""
    for _ in range(100):
        c = rng.uniform(0, 1, size=3)
        if avoid is None:
            return c
        grey = float(_GREY @ (c - avoid))
        if lighter is not None and (grey > 0) != lighter:
            continue
        if np.linalg.norm(c - avoid) >= min_dist and abs(grey) >= min_grey:
            return c
    return c


# How hard shapes10 is (version 3): sizes are fractions of the image side, colours RGB in [0, 1]. Chosen
# so that every DAIQ Table 3 network learns it in the embedded budget (docs/measurements.md).
SHAPES10_DIFFICULTY = dict(
    size=(0.3, 0.45),  # the labelled object's radius
    shift=0.5,  # its centre moves up to this fraction of the way from the image centre to 0.7 r off the edge
    rotation=20.0,  # it is rotated by up to +- this many degrees
    background=(0.0, 0.45),  # the range of each background colour channel (darkish backgrounds)
    lighter=1.0,  # the share of images whose labelled object is lighter (not darker) than the background
    luminance=0.25,  # the least grey-level difference between the labelled object and the background
    low_contrast=0.1,  # the share of objects only 0.25 (not 0.5) away from the background in RGB
    gradient=0.15,  # background gradient amplitude per channel
    distractors=1,  # at most this many smaller objects of any class (radius below)
    distractor_size=(0.06, 0.11),
    lines=1,  # at most this many random lines
    noise=(2.0, 8.0),  # Gaussian pixel noise sigma on 0..255, drawn per image
)


def render_shape(cls: int, rng: np.random.Generator) -> np.ndarray:
    """One 32x32x3 uint8 image whose largest object is of class `cls`."""
    k = SHAPES10_DIFFICULTY
    n = _SIZE * _SS
    yy, xx = np.mgrid[0:n, 0:n] / n
    bg = rng.uniform(*k["background"], size=3)
    direction = rng.uniform(0, 2 * np.pi)
    ramp = (xx * math.cos(direction) + yy * math.sin(direction))[..., None]
    canvas = np.clip(bg + rng.uniform(-k["gradient"], k["gradient"], size=3) * (ramp - 0.5), 0, 1)

    def paint(mask, colour):
        nonlocal canvas
        canvas = canvas * (1 - mask[..., None]) + colour * mask[..., None]

    def distractor():
        r = n * rng.uniform(*k["distractor_size"])
        cx, cy = rng.uniform(0, n, size=2)
        paint(_shape_mask(int(rng.integers(10)), r, cx, cy, rng.uniform(0, 2 * np.pi), rng), _colour(rng))

    n_distractors = int(rng.integers(0, k["distractors"] + 1))
    behind = int(rng.integers(0, n_distractors + 1))
    for _ in range(behind):
        distractor()
    r = n * rng.uniform(*k["size"])
    cx, cy = n / 2 + rng.uniform(-1, 1, size=2) * k["shift"] * (n / 2 - 0.7 * r)
    min_dist = 0.25 if rng.uniform() < k["low_contrast"] else 0.5
    colour = _colour(rng, bg, min_dist, k["luminance"], lighter=bool(rng.uniform() < k["lighter"]))
    theta = math.radians(rng.uniform(-k["rotation"], k["rotation"]))
    paint(_shape_mask(cls, r, cx, cy, theta, rng), colour)
    for _ in range(n_distractors - behind):
        distractor()
    lines = Image.new("L", (n, n), 0)
    draw = ImageDraw.Draw(lines)
    for _ in range(int(rng.integers(0, k["lines"] + 1))):
        draw.line(tuple(rng.uniform(0, n, size=4)), fill=255, width=int(rng.integers(1, 3)))
        paint(np.asarray(lines, dtype=np.float64) / 255.0, _colour(rng))
        draw.rectangle((0, 0, n, n), fill=0)
    small = canvas.reshape(_SIZE, _SS, _SIZE, _SS, 3).mean(axis=(1, 3)) * 255.0
    small += rng.normal(0, rng.uniform(*k["noise"]), size=small.shape)
    return np.clip(np.round(small), 0, 255).astype(np.uint8)


def make_shapes10(num: int, seed: int) -> tuple[np.ndarray, list[int]]:
    """`num` images (a multiple of 10), class-balanced, in a seeded shuffled order: (N, 32, 32, 3), labels."""
    rng = np.random.default_rng(seed)
    labels = np.tile(np.arange(10), num // 10)
    rng.shuffle(labels)
    images = np.stack([render_shape(int(c), rng) for c in labels])
    return images, [int(c) for c in labels]


def _cifar_batch(images: np.ndarray, labels: list[int], name: str) -> dict:
    # CIFAR-10's python format: "data" is N x 3072 uint8, the R, G and B planes of each 32x32 image.
    return {
        "batch_label": name,
        "labels": labels,
        "data": images.transpose(0, 3, 1, 2).reshape(len(images), -1).copy(),
        "filenames": [f"shapes10_{name.replace(' ', '_')}_{i:05d}.png" for i in range(len(images))],
    }


def _write_shapes10(out: Path, seed: int = 0, per_batch: int = 1000, test: int = 1000) -> dict:
    folder = out / CIFAR_FOLDER
    folder.mkdir(parents=True)
    sums = np.zeros(3)
    sq = np.zeros(3)
    count = 0
    for i, name in enumerate(CIFAR_TRAIN):
        images, labels = make_shapes10(per_batch, seed=seed * 1000 + i + 1)
        x = images.reshape(-1, 3).astype(np.float64) / 255.0
        sums, sq, count = sums + x.sum(0), sq + (x**2).sum(0), count + len(x)
        with open(folder / name, "wb") as f:
            pickle.dump(_cifar_batch(images, labels, f"training batch {i + 1} of 5"), f, protocol=2)
    images, labels = make_shapes10(test, seed=seed * 1000 + 999)
    with open(folder / CIFAR_TEST, "wb") as f:
        pickle.dump(_cifar_batch(images, labels, "testing batch 1 of 1"), f, protocol=2)
    with open(folder / CIFAR_META, "wb") as f:
        meta = {"label_names": list(SHAPES10_CLASSES), "num_cases_per_batch": per_batch, "num_vis": 3072}
        pickle.dump(meta, f, protocol=2)
    mean = sums / count
    return {
        "name": SHAPES10,
        "version": VERSIONS[SHAPES10],
        "format": "CIFAR-10 python pickle batches: cifar-10-batches-py/data_batch_1..5, test_batch",
        "source": "generated by tasks.datasets.render_shape",
        "seed": seed,
        "classes": list(SHAPES10_CLASSES),
        "num_train": per_batch * len(CIFAR_TRAIN),
        "num_val": test,
        "mean": mean.tolist(),
        "std": np.sqrt(sq / count - mean**2).tolist(),
        "md5": {p.name: _md5(p) for p in sorted(folder.iterdir())},
    }


def ensure_shapes10(cache=None) -> Path:
    """The shapes10 root (holding cifar-10-batches-py/), made on first use."""
    return ensure_set(SHAPES10, VERSIONS[SHAPES10], _write_shapes10, cache)


# ------------------------------------------------------------------------------------------------ loaders
def _check_cifar_root(root) -> Path:
    root = Path(root).expanduser()
    if root.name == CIFAR_FOLDER and not (root / CIFAR_FOLDER).is_dir():
        root = root.parent  # accept the batches folder itself
    wanted = [*CIFAR_TRAIN, CIFAR_TEST, CIFAR_META]
    missing = [f for f in wanted if not (root / CIFAR_FOLDER / f).is_file()]
    if missing:
        raise DatasetNotFoundError(
            f"CIFAR-10 not found under {root} (missing {', '.join(missing)}): expected "
            f"{root}/{CIFAR_FOLDER}/data_batch_1..5, test_batch and batches.meta "
            "(torchvision's python-pickle format; this harness never downloads)"
        )
    return root


def cifar10(root, train: bool, transform=None):
    """torchvision's CIFAR10 (download=False) with a one-line error naming the layout when missing.

    A folder with our MANIFEST.json (an embedded set in CIFAR format) is checked against the checksums
    recorded in that manifest instead of CIFAR-10's own.
    """
    from torchvision.datasets import CIFAR10

    root = _check_cifar_root(root)
    manifest = read_manifest(root)
    if manifest is None or "md5" not in manifest:
        return CIFAR10(str(root), train=train, transform=transform, download=False)
    md5 = manifest["md5"]

    class CIFAR10Format(CIFAR10):  # torchvision's reader; only the checksums are those of our files
        train_list = [[f, md5[f]] for f in CIFAR_TRAIN]
        test_list = [[CIFAR_TEST, md5[CIFAR_TEST]]]
        meta = {"filename": CIFAR_META, "key": "label_names", "md5": md5[CIFAR_META]}

    return CIFAR10Format(str(root), train=train, transform=transform, download=False)


def image_folder(root, split: str, transform=None, what: str = "ImageNet"):
    """torchvision's ImageFolder on <root>/<split>, reading images with tasks.bad_data.read_image: a missing
    layout is a one-line DatasetNotFoundError, an empty class folder or an unreadable image a BadDataError
    naming it."""
    from torchvision.datasets import ImageFolder
    from torchvision.datasets.folder import IMG_EXTENSIONS

    root = Path(root).expanduser()
    folder = root / split
    if not folder.is_dir() or not any(p.is_dir() for p in folder.iterdir()):
        raise DatasetNotFoundError(
            f"{what} not found under {root} (no class folders in {folder}): expected "
            f"{root}/train/<class>/*.JPEG and {root}/val/<class>/*.JPEG (ImageFolder layout, the "
            "validation images sorted into class folders; this harness never downloads)"
        )
    images = ImageFolder(str(folder), transform=transform, loader=read_image, allow_empty=True)
    empty = sorted(set(range(len(images.classes))) - set(images.targets))
    if empty:
        names = ", ".join(str(folder / images.classes[c]) for c in empty[:3]) + (
            ", ..." if len(empty) > 3 else ""
        )
        raise BadDataError(
            f"{len(empty)} class folder(s) of {what} hold no images ({', '.join(IMG_EXTENSIONS)}): {names}; "
            "put their images in or remove the folders",
            folder / images.classes[empty[0]],
        )
    return images


def normalization(dataset: str, cache=None) -> tuple[tuple, tuple]:
    """Per-channel (mean, std) of a dataset name (embedded sets: measured on their train split)."""
    if dataset == "imagenet":
        return IMAGENET_MEAN, IMAGENET_STD
    if dataset == "cifar10":
        return CIFAR10_MEAN, CIFAR10_STD
    if dataset in package_data.PACKAGES:  # grey: one value for the three channels the models take
        manifest = read_manifest(package_data.ensure(dataset, cache))
        return (manifest["mean"],) * 3, (manifest["std"],) * 3
    folder = ensure_digits(cache) if dataset == DIGITS else ensure_shapes10(cache)
    manifest = read_manifest(folder)
    return tuple(manifest["mean"]), tuple(manifest["std"])
