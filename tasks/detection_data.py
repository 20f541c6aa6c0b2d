"""The embedded detection set: generated shapes in COCO's on-disk format, read by MMDetection itself.

``ensure_shapes_det()`` makes it once, on first use, in the data cache (tasks.data_cache, atomically,
like every stand-in):

    shapes-det-v1/
      train/000000.png ...        TRAIN_IMAGES RGB images, IMAGE_SIZE x IMAGE_SIZE
      val/000000.png ...          VAL_IMAGES
      annotations/instances_train.json, instances_val.json   COCO "instances" format
      MANIFEST.json

Each image has a dark background with a colour gradient, Gaussian pixel noise, and clutter that is not
annotated (random lines and small specks); then 1-4 objects of the CLASSES, each in its own random
colour lighter than the background, with a side or diameter of 24-64 px (of 128), rotated at random.
Objects may overlap (an object placed later may cover up to OVERLAP of an earlier one's box; the boxes
stay the full extent of each shape, as COCO's amodal boxes do). MMDetection's CocoDataset reads the
JSON and images, and its CocoMetric (pycocotools) scores the detections, so the real loaders and the
real metric run. The numbers it gives are not COCO or PASCAL VOC numbers and are never presented so.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from tasks.data_cache import cache_dir, ensure_set

NAME = "shapes-det"
VERSION = 1
CLASSES = ("disc", "square", "triangle", "cross")
IMAGE_SIZE = 128
TRAIN_IMAGES = 480
VAL_IMAGES = 120
OBJECTS = (1, 4)  # objects per image, inclusive
OBJECT_SIZE = (24, 64)  # px, the shape's side / diameter before rotation
OVERLAP = 0.35  # at most this fraction of an earlier box may be covered by a later one


def folder(cache=None) -> Path:
    return cache_dir(cache) / f"{NAME}-v{VERSION}"


def ann_file(split: str) -> str:
    """The annotation file of `split`, relative to the set's folder (MMDetection's data_root)."""
    return f"annotations/instances_{split}.json"


def _vertices(cls: int, size: float, cx: float, cy: float, theta: float) -> list[tuple[float, float]]:
    r = size / 2
    if cls == 0:  # disc: a 40-gon
        pts = [(r * math.cos(a), r * math.sin(a)) for a in np.linspace(0, 2 * math.pi, 40, endpoint=False)]
    elif cls == 1:  # square
        pts = [(-r, -r), (r, -r), (r, r), (-r, r)]
    elif cls == 2:  # equilateral-ish triangle inscribed in the circle of radius r
        pts = [(r * math.cos(a), r * math.sin(a)) for a in (-math.pi / 2, math.pi / 6, 5 * math.pi / 6)]
    else:  # cross with arms a third of the side wide
        w = r / 3
        pts = [(-w, -r), (w, -r), (w, -w), (r, -w), (r, w), (w, w), (w, r), (-w, r), (-w, w), (-r, w)]
        pts += [(-r, -w), (-w, -w)]
    c, s = math.cos(theta), math.sin(theta)
    return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in pts]


def _box(points) -> tuple[float, float, float, float]:
    """x0, y0, x1, y1 of the points clipped to the image."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    return (max(0.0, min(xs)), max(0.0, min(ys)), min(IMAGE_SIZE, max(xs)), min(IMAGE_SIZE, max(ys)))


def _covered(a, b) -> float:
    """The fraction of box a covered by box b."""
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    return w * h / max(1e-6, (a[2] - a[0]) * (a[3] - a[1]))


def render_image(rng: np.random.Generator) -> tuple[Image.Image, list[tuple[int, tuple]]]:
    """One image and its objects as (class index, (x0, y0, x1, y1))."""
    n = IMAGE_SIZE
    base = rng.uniform(0.0, 0.35, size=3)
    tilt = rng.uniform(-0.15, 0.15, size=3)
    ramp = np.linspace(0, 1, n)[None, :, None] if rng.random() < 0.5 else np.linspace(0, 1, n)[:, None, None]
    bg = np.clip(base + tilt * ramp, 0, 1) * np.ones((n, n, 3))
    img = Image.fromarray((bg * 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(rng.integers(1, 4)):  # clutter: thin lines and specks, never annotated
        colour = tuple(int(v) for v in rng.integers(40, 200, size=3))
        if rng.random() < 0.6:
            draw.line([tuple(rng.uniform(0, n, 2)), tuple(rng.uniform(0, n, 2))], fill=colour, width=1)
        else:
            x, y, r = *rng.uniform(0, n, 2), rng.uniform(1.5, 4)
            draw.ellipse((x - r, y - r, x + r, y + r), fill=colour)
    objects: list[tuple[int, tuple]] = []
    for _ in range(rng.integers(OBJECTS[0], OBJECTS[1] + 1)):
        for _attempt in range(20):
            cls = int(rng.integers(len(CLASSES)))
            size = rng.uniform(*OBJECT_SIZE)
            cx, cy = rng.uniform(size / 2, n - size / 2, size=2)
            pts = _vertices(cls, size, cx, cy, rng.uniform(0, 2 * math.pi))
            box = _box(pts)
            if all(_covered(prev, box) <= OVERLAP for _, prev in objects):
                colour = np.clip(base + rng.uniform(0.3, 0.65) + rng.uniform(-0.2, 0.2, size=3), 0, 1)
                draw.polygon(pts, fill=tuple(int(v * 255) for v in colour))
                objects.append((cls, box))
                break
    pixels = np.asarray(img, dtype=np.float32) + rng.normal(0, rng.uniform(2, 8), size=(n, n, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)), objects


def _write_split(out: Path, split: str, count: int, rng: np.random.Generator) -> int:
    (out / split).mkdir(parents=True)
    images, annotations = [], []
    for i in range(count):
        image, objects = render_image(rng)
        name = f"{i:06d}.png"
        image.save(out / split / name)
        images.append(dict(id=i, file_name=f"{split}/{name}", width=IMAGE_SIZE, height=IMAGE_SIZE))
        for cls, (x0, y0, x1, y1) in objects:
            w, h = x1 - x0, y1 - y0
            annotations.append(
                dict(
                    id=len(annotations) + 1,  # pycocotools treats id 0 as "no match": start at 1
                    image_id=i,
                    category_id=cls + 1,
                    bbox=[round(x0, 2), round(y0, 2), round(w, 2), round(h, 2)],
                    area=round(w * h, 2),
                    iscrowd=0,
                )
            )
    coco = dict(
        info=dict(description=f"{NAME} v{VERSION} {split}: generated shapes (int8-repro)"),
        images=images,
        annotations=annotations,
        categories=[dict(id=i + 1, name=name, supercategory="shape") for i, name in enumerate(CLASSES)],
    )
    (out / "annotations").mkdir(exist_ok=True)
    (out / ann_file(split)).write_text(json.dumps(coco))
    return len(annotations)


def _write(out: Path, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    boxes = {s: _write_split(out, s, c, rng) for s, c in (("train", TRAIN_IMAGES), ("val", VAL_IMAGES))}
    return dict(
        name=NAME,
        version=VERSION,
        seed=seed,
        classes=list(CLASSES),
        image_size=IMAGE_SIZE,
        images=dict(train=TRAIN_IMAGES, val=VAL_IMAGES),
        boxes=boxes,
    )


def ensure_shapes_det(cache=None) -> Path:
    """The set's folder, made on first use (atomically)."""
    return ensure_set(NAME, VERSION, _write, cache)
