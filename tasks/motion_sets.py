"""The embedded video stand-ins: generated clips of moving shapes whose class is the motion.

The class is the motion of the largest objects, never their looks: shape, size, colour, background and
noise are drawn independently of the class, and objects wrap around the frame edges (the frame is a
torus), so every single frame has the same distribution whatever the class and only the change between
frames tells the classes apart. Each set is made once, on first use, in the data cache
(tasks.data_cache) and written in the layout of the dataset it stands in for (tasks.video_lists), so
that the same loader code reads it back:

- ``motion10`` (stands in for UCF-101; UCF-101's layout and split-1 lists): 10 classes: a group of 3-5
  shapes moving rigidly together in one of 8 compass directions (speed 5-9% of the frame side per
  frame), or circling clockwise or counter-clockwise (radius 12-18% of the side, 35-55 degrees per
  frame). 25 "groups" of 18 clips per class as UCF-101's g01-g25, groups 1-7 tested (split 1's rule):
  3,240 training and 1,260 test clips.
- ``motion20`` (stands in for Kinetics-400; its list format): 20 classes: the 8 directions slow (5-7%
  of the side per frame) and fast (10-13%), circling clockwise / counter-clockwise slowly (25-35 degrees
  per frame) and fast (50-70 degrees); half the clips carry a smaller distractor shape with a random
  motion of its own. 160 training and 30 validation clips per class: 3,200 / 600.

Clips are 8 frames of 32x32 RGB (drawn at 64x64 and averaged down), JPEG quality 95 without chroma
subsampling; enough clips that an embedded run sees each training clip about once (how the versions
came to be: docs/measurements.md). Their accuracies are not UCF-101 or Kinetics-400 numbers and are
never presented as such.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from tasks.data_cache import ensure_set
from tasks.video_lists import FRAME_TEMPLATE, KINETICS400, KINETICS_FRAMES, KINETICS_LISTS, UCF101, UCF_LISTS

MOTION10 = "motion10"
MOTION20 = "motion20"
VERSIONS = {MOTION10: 3, MOTION20: 3}

CLIP_FRAMES = 8
FRAME_SIZE = 32
_SS = 2  # supersampling
_DIRECTIONS = ("E", "NE", "N", "NW", "W", "SW", "S", "SE")  # 0, 45, ... degrees, y up


@dataclass(frozen=True)
class Motion:
    """One class: a translation (direction in degrees, speed range) or a circling (turn range, sign)."""

    name: str
    direction: float | None = None  # degrees, counter-clockwise from east (image y points down)
    speed: tuple[float, float] = (0.0, 0.0)  # fraction of the side per frame
    turn: tuple[float, float] = (0.0, 0.0)  # degrees per frame, positive = counter-clockwise
    radius: tuple[float, float] = (0.12, 0.18)  # circling radius, fraction of the side


def _translations(prefix: str, speed) -> list[Motion]:
    return [Motion(f"{prefix}{d}", direction=45.0 * i, speed=speed) for i, d in enumerate(_DIRECTIONS)]


@dataclass(frozen=True)
class MotionSet:
    name: str
    classes: tuple[Motion, ...]
    distractor: float  # the share of clips with a smaller distractor shape
    group: tuple[int, int]  # how many shapes move together as the class says (inclusive range)
    train_per_class: int
    val_per_class: int
    layout: str  # the real dataset whose layout it is written in (UCF101 or KINETICS400)
    per_group: int = 5  # UCF-101 layout: clips per group (UCF-101 has 4-7), the test groups come first


MOTION_SETS = {
    MOTION10: MotionSet(
        MOTION10,
        (
            *_translations("move", (0.05, 0.09)),
            Motion("circle_cw", turn=(-55.0, -35.0)),
            Motion("circle_ccw", turn=(35.0, 55.0)),
        ),
        distractor=0.0,
        group=(3, 5),
        train_per_class=324,  # UCF-101-like groups: 25 groups x 18 clips, groups 1-7 tested
        val_per_class=126,
        layout=UCF101,
        per_group=18,
    ),
    MOTION20: MotionSet(
        MOTION20,
        (
            *_translations("slow", (0.05, 0.07)),  # v2: 3-5%, under a pixel per frame at 16x16
            *_translations("fast", (0.10, 0.13)),
            Motion("circle_cw_slow", turn=(-35.0, -25.0)),
            Motion("circle_ccw_slow", turn=(25.0, 35.0)),
            Motion("circle_cw_fast", turn=(-70.0, -50.0)),
            Motion("circle_ccw_fast", turn=(50.0, 70.0)),
        ),
        distractor=0.5,
        group=(3, 5),
        train_per_class=160,
        val_per_class=30,
        layout=KINETICS400,
    ),
}
_SHAPES = ("disc", "square", "diamond", "ring", "cross")


def _trajectory(motion: Motion, rng: np.random.Generator, frames: int, side: float) -> np.ndarray:
    """(frames, 2) centre positions (x, y), in pixels, before wrapping around the torus."""
    start = rng.uniform(0, side, size=2)
    t = np.arange(frames, dtype=np.float64)[:, None]
    if motion.direction is not None:
        a = math.radians(motion.direction + rng.uniform(-10, 10))
        v = rng.uniform(*motion.speed) * side * np.array([math.cos(a), -math.sin(a)])  # y points down
        return start + t * v
    radius = rng.uniform(*motion.radius) * side
    phase = rng.uniform(0, 2 * math.pi)
    angle = phase + np.radians(rng.uniform(*motion.turn)) * t[:, 0]
    return start + radius * np.stack([np.cos(angle), -np.sin(angle)], axis=1)


def _shape_mask(kind: str, r: float, cx: float, cy: float, theta: float, n: int) -> np.ndarray:
    """Mask (n, n) of one shape centred at (cx, cy) on an n x n torus (periodic distances)."""
    yy, xx = np.mgrid[0:n, 0:n].astype(np.float64) + 0.5
    dx = (xx - cx + n / 2) % n - n / 2
    dy = (yy - cy + n / 2) % n - n / 2
    c, s = math.cos(theta), math.sin(theta)
    u, v = dx * c + dy * s, -dx * s + dy * c
    if kind == "disc":
        m = u**2 + v**2 <= r**2
    elif kind == "square":
        m = np.maximum(abs(u), abs(v)) <= r * 0.85
    elif kind == "diamond":
        m = abs(u) + abs(v) <= r * 1.2
    elif kind == "ring":
        d = u**2 + v**2
        m = (d <= r**2) & (d >= (0.5 * r) ** 2)
    else:  # cross
        m = (np.minimum(abs(u), abs(v)) <= r * 0.35) & (np.maximum(abs(u), abs(v)) <= r)
    return m.astype(np.float64)


def render_clip(spec: MotionSet, cls: int, rng: np.random.Generator, frames: int = CLIP_FRAMES,
                size: int = FRAME_SIZE) -> np.ndarray:  # fmt: skip
    """One clip (frames, size, size, 3) uint8 whose largest shape moves as class `cls` of `spec`."""
    n = size * _SS
    bg = rng.uniform(0.0, 0.45, size=3)
    yy, xx = np.mgrid[0:n, 0:n] / n
    direction = rng.uniform(0, 2 * math.pi)
    ramp = (xx * math.cos(direction) + yy * math.sin(direction))[..., None] - 0.5
    background = np.clip(bg + rng.uniform(-0.15, 0.15, size=3) * ramp, 0, 1)
    objects = []  # (trajectory, radius), painted in order (the labelled group last)
    if rng.uniform() < spec.distractor:
        motion = spec.classes[int(rng.integers(len(spec.classes)))]
        objects.append((_trajectory(motion, rng, frames, n), rng.uniform(0.06, 0.09) * n))
    # the labelled group: a few shapes moving rigidly together (one path, shifted), so that the motion
    # shows in several places of every clip, as the global motion of a scene does
    path = _trajectory(spec.classes[cls], rng, frames, n)
    for k in range(int(rng.integers(spec.group[0], spec.group[1] + 1))):
        shift = 0.0 if k == 0 else rng.uniform(0, n, size=2)
        objects.append((path + shift, rng.uniform(0.1, 0.16) * n))
    looks = []
    for _ in objects:
        while True:  # lighter than the background by at least 0.3 grey levels
            colour = rng.uniform(0, 1, size=3)
            if float(np.array([0.299, 0.587, 0.114]) @ (colour - bg)) >= 0.3:
                break
        looks.append((_SHAPES[int(rng.integers(len(_SHAPES)))], rng.uniform(0, math.pi / 2), colour))
    noise = rng.uniform(2.0, 6.0)
    out = np.empty((frames, size, size, 3), dtype=np.uint8)
    for f in range(frames):
        canvas = background.copy()
        for (path, r), (kind, theta, colour) in zip(objects, looks, strict=True):
            mask = _shape_mask(kind, r, path[f, 0] % n, path[f, 1] % n, theta, n)[..., None]
            canvas = canvas * (1 - mask) + colour * mask
        small = canvas.reshape(size, _SS, size, _SS, 3).mean(axis=(1, 3)) * 255.0
        small += rng.normal(0, noise, size=small.shape)
        out[f] = np.clip(np.round(small), 0, 255).astype(np.uint8)
    return out


def _save_frames(clip: np.ndarray, folder: Path) -> None:
    folder.mkdir(parents=True)
    for f, frame in enumerate(clip):
        # 4:4:4 (no chroma subsampling): at 32 px, 4:2:0 would halve the colour resolution
        Image.fromarray(frame).save(folder / FRAME_TEMPLATE.format(f + 1), quality=95, subsampling=0)


def _write_motion(spec: MotionSet, out: Path, seed: int = 0) -> dict:
    rng = np.random.default_rng([seed, VERSIONS[spec.name], len(spec.classes)])
    stats = np.zeros((2, 3))
    count = 0
    per_split = {"train": [], "val": []}  # (relative folder, label)
    names = [m.name for m in spec.classes]
    for label, name in enumerate(names):
        if spec.layout == UCF101:
            # UCF-101's naming: v_<Class>_g<group>_c<clip>; split 1 tests groups 1-7
            per_group = spec.per_group
            groups = (spec.train_per_class + spec.val_per_class) // per_group
            for g in range(1, groups + 1):
                for c in range(1, per_group + 1):
                    split = "val" if g <= (spec.val_per_class // per_group) else "train"
                    per_split[split].append((f"{name}/v_{name}_g{g:02d}_c{c:02d}", label))
        else:
            for split, k in (("train", spec.train_per_class), ("val", spec.val_per_class)):
                per_split[split] += [(f"{name}/{name}_{split}_{i:04d}", label) for i in range(k)]
    for split, videos in per_split.items():
        for rel, label in videos:
            clip = render_clip(spec, label, rng)
            if spec.layout == UCF101:
                _save_frames(clip, out / "rawframes" / rel)
            else:
                _save_frames(clip, out / KINETICS_FRAMES[split] / rel)
            if split == "train":
                x = clip.reshape(-1, 3).astype(np.float64) / 255.0
                stats += np.stack([x.sum(0), (x**2).sum(0)])
                count += len(x)
    if spec.layout == UCF101:
        lists = out / UCF_LISTS
        lists.mkdir()
        (lists / "classInd.txt").write_text("".join(f"{i + 1} {c}\n" for i, c in enumerate(names)))
        (lists / "trainlist01.txt").write_text(
            "".join(f"{rel}.avi {label + 1}\n" for rel, label in per_split["train"])
        )
        (lists / "testlist01.txt").write_text("".join(f"{rel}.avi\n" for rel, _ in per_split["val"]))
    else:
        for split, videos in per_split.items():
            text = "".join(f"{rel} {CLIP_FRAMES} {label}\n" for rel, label in videos)
            (out / KINETICS_LISTS[split]).write_text(text)
    mean = stats[0] / count
    return {
        "name": spec.name,
        "version": VERSIONS[spec.name],
        "format": f"{spec.layout} frame folders ({FRAME_TEMPLATE}) with its annotation lists",
        "source": "generated by tasks.motion_sets.render_clip",
        "seed": seed,
        "classes": names,
        "frames": CLIP_FRAMES,
        "size": FRAME_SIZE,
        "num_train": len(per_split["train"]),
        "num_val": len(per_split["val"]),
        "mean": mean.tolist(),
        "std": np.sqrt(stats[1] / count - mean**2).tolist(),
    }


def ensure_motion(name: str, cache=None) -> Path:
    """The root of the embedded set `name` (motion10 or motion20), made on first use."""
    if name not in MOTION_SETS:
        raise ValueError(f"unknown embedded video set {name!r}; choose from {', '.join(MOTION_SETS)}")
    return ensure_set(name, VERSIONS[name], lambda out: _write_motion(MOTION_SETS[name], out), cache)
