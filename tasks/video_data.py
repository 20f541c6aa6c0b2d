"""Video data as pre-extracted frame folders: UCF-101 (split 1), Kinetics-400, and two embedded stand-ins.

Real data (profile ``paper``) is read from ``--data-root``, never downloaded, as frame folders (one
folder of JPEG frames ``img_00001.jpg, img_00002.jpg, ...`` per video) with annotation lists:

- UCF-101, official split 1 (the lists of UCF101TrainTestSplits-RecognitionTask.zip, unchanged)::

      <root>/ucfTrainTestlist/classInd.txt        "1 ApplyEyeMakeup" ... (1-based)
      <root>/ucfTrainTestlist/trainlist01.txt     "ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi 1"
      <root>/ucfTrainTestlist/testlist01.txt      "ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01.avi"
      <root>/rawframes/ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01/img_00001.jpg ...

- Kinetics-400, in MMAction2's raw-frame list format (one line per video: frame folder relative to
  the split's frame root, number of frames, 0-based label)::

      <root>/kinetics400_train_list_rawframes.txt "abseiling/-3B32lodo2M_000059_000069 300 0"
      <root>/kinetics400_val_list_rawframes.txt
      <root>/rawframes_train/abseiling/-3B32lodo2M_000059_000069/img_00001.jpg ...
      <root>/rawframes_val/...

Frames are extracted with standard tools, e.g. for every video (UCF-101's .avi, Kinetics' trimmed
clips; Kinetics frames are usually resized so that the short side is 256 or 320 px)::

      mkdir -p rawframes/ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01
      ffmpeg -i UCF-101/ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi -q:v 2 \\
             rawframes/ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01/img_%05d.jpg

(MMAction2's ``tools/data/build_rawframes.py`` writes the same layout, and its
``build_file_list.py`` the Kinetics lists.) A missing root, list or frame folder is one error line
(tasks.datasets.DatasetNotFoundError) naming the expected layout.

The embedded stand-ins (profiles ``embedded`` and ``smoke``) are generated clips of moving shapes whose
class is the motion of the largest object, never its looks: shape, size, colour, background and noise
are drawn independently of the class, and objects wrap around the frame edges (the frame is a torus),
so every single frame has the same distribution whatever the class and only the change between frames
tells the classes apart. Each is made once, on first use, in the data cache (``~/.cache/int8-repro/
data``, env ``REPRO_DATA_CACHE``, or the ``cache`` argument), written into a temporary folder and
renamed into place (tasks.datasets' atomic writer), and written in the layout of the dataset it
stands in for, so that it is read back by the same loader code:

- ``motion10`` (stands in for UCF-101; UCF-101's layout and split-1 lists): 10 classes: a group of 3-5
  shapes moving rigidly together in one of 8 compass directions (speed 5-9% of the frame side per
  frame), or circling clockwise or counter-clockwise (radius 12-18% of the side, 35-55 degrees per
  frame). 25 "groups" of 18 clips per class as UCF-101's g01-g25, groups 1-7 tested (split 1's rule):
  3,240 training and 1,260 test clips.
- ``motion20`` (stands in for Kinetics-400; its list format): 20 classes: the 8 directions slow (5-7%
  of the side per frame) and fast (10-13%), circling clockwise / counter-clockwise slowly (25-35 degrees
  per frame) and fast (50-70 degrees); half the clips carry a smaller distractor shape with a random
  motion of its own. 160 training and 30 validation clips per class: 3,200 / 600.

The loader normalises the stand-ins per clip (each colour channel by its mean and std over the clip's
frames): background and shape colours are drawn per clip and carry no class information, and with
dataset-wide statistics that nuisance kept from-scratch 3-D ResNets from learning the motion in the
budget. Measured on version-2 motion10 clips rendered in memory (R3D-18 FP32, 16x16 input, batch 16,
one CPU thread, clip top-1, chance 10%): with dataset statistics, the best of the variants tried (lr
0.003-0.03, Adam, larger or faster groups, 3,200-4,800 fresh clips, 100-300 iterations) reached 16-19.5%,
and lr 0.0125 with 200 iterations on 3,200 fresh clips reached 11% with a plain background; per-clip
normalisation at those same settings (patterned background) reached 64%. Version 1 moved a single
shape, version 2 a group of shapes; version 3 (this one) has 3.6x / 2.7x more clips, so that an
embedded run sees each training clip about once and cannot memorise them.
Clips are 8 frames of 32x32 RGB (drawn at 64x64 and averaged down), JPEG quality 95 without chroma
subsampling. Their accuracies are not UCF-101 or Kinetics-400 numbers and are never presented as such.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import Dataset

from tasks.data_cache import ensure_set, read_manifest
from tasks.datasets import DatasetNotFoundError

UCF101 = "ucf101"
KINETICS400 = "kinetics400"
MOTION10 = "motion10"
MOTION20 = "motion20"
REAL = (UCF101, KINETICS400)
EMBEDDED = (MOTION10, MOTION20)
LAYOUT = {UCF101: UCF101, KINETICS400: KINETICS400, MOTION10: UCF101, MOTION20: KINETICS400}
VERSIONS = {MOTION10: 3, MOTION20: 3}
PER_CLIP_EPS = 1e-3  # a blank clip (std 0) normalises to zeros, not NaN
FRAME_TEMPLATE = "img_{:05d}.jpg"
UCF_LISTS = "ucfTrainTestlist"
KINETICS_LISTS = {
    "train": "kinetics400_train_list_rawframes.txt",
    "val": "kinetics400_val_list_rawframes.txt",
}
KINETICS_FRAMES = {"train": "rawframes_train", "val": "rawframes_val"}

# Normalisation of the real sets: the Kinetics-400 statistics torchvision's video models use.
KINETICS_MEAN, KINETICS_STD = (0.43216, 0.394666, 0.37645), (0.22803, 0.22145, 0.216989)


# ------------------------------------------------------------------------------------------ annotations
@dataclass(frozen=True)
class Video:
    frames: Path  # the folder of img_00001.jpg, ...
    num_frames: int | None  # None: counted on first use
    label: int


def _missing(what: str, root: Path, detail: str, layout: str) -> DatasetNotFoundError:
    return DatasetNotFoundError(f"{what} not found under {root} ({detail}): expected {layout}")


_UCF_LAYOUT = (
    "{r}/ucfTrainTestlist/classInd.txt, trainlist01.txt, testlist01.txt (the official split lists) and "
    "{r}/rawframes/<Class>/<video>/img_00001.jpg ... (frames extracted with ffmpeg; never downloaded)"
)
_KINETICS_LAYOUT = (
    "{r}/kinetics400_{{train,val}}_list_rawframes.txt ('<folder> <num_frames> <label>' per line) and "
    "{r}/rawframes_{{train,val}}/<folder>/img_00001.jpg ... (frames extracted with ffmpeg; never downloaded)"
)


def ucf101_videos(root, split: str, fold: int = 1) -> tuple[list[Video], list[str]]:
    """The videos of UCF-101's official split `fold` ("train" or "val" = its test list) and the classes."""
    root = Path(root).expanduser()
    lists = root / UCF_LISTS
    layout = _UCF_LAYOUT.format(r=root)
    names = {"train": f"trainlist{fold:02d}.txt", "val": f"testlist{fold:02d}.txt"}
    for name in ("classInd.txt", names[split]):
        if not (lists / name).is_file():
            raise _missing("UCF-101", root, f"no {UCF_LISTS}/{name}", layout)
    classes = []
    for line in (lists / "classInd.txt").read_text().split("\n"):
        if line.strip():
            index, name = line.split()
            if int(index) != len(classes) + 1:
                raise DatasetNotFoundError(f"{lists}/classInd.txt: class indices are not 1, 2, 3, ...")
            classes.append(name)
    index = {c: i for i, c in enumerate(classes)}
    videos = []
    for line in (lists / names[split]).read_text().split("\n"):
        if not line.strip():
            continue
        path = line.split()[0]  # "Class/v_Class_gXX_cYY.avi" (the train list adds the 1-based label)
        cls = path.split("/")[0]
        videos.append(Video(root / "rawframes" / Path(path).with_suffix(""), None, index[cls]))
    if videos and not videos[0].frames.is_dir():
        raise _missing("UCF-101", root, f"no frame folder {videos[0].frames}", layout)
    return videos, classes


def kinetics400_videos(root, split: str) -> tuple[list[Video], list[str]]:
    """The videos of a Kinetics-400 raw-frame list ("train" or "val") and the class names (label order)."""
    root = Path(root).expanduser()
    layout = _KINETICS_LAYOUT.format(r=root)
    path = root / KINETICS_LISTS[split]
    if not path.is_file():
        raise _missing("Kinetics-400", root, f"no {path.name}", layout)
    frames = root / KINETICS_FRAMES[split]
    videos = []
    for line in path.read_text().split("\n"):
        if line.strip():
            folder, count, label = line.rsplit(maxsplit=2)
            videos.append(Video(frames / folder, int(count), int(label)))
    if videos and not videos[0].frames.is_dir():
        raise _missing("Kinetics-400", root, f"no frame folder {videos[0].frames}", layout)
    train = root / KINETICS_LISTS["train"]
    labels = [v.label for v in videos] if split == "train" or not train.is_file() else None
    if labels is None:
        labels = [int(line.rsplit(maxsplit=1)[1]) for line in train.read_text().split("\n") if line.strip()]
    names = {}
    for v in videos:  # a class name is the folder's first part where the list has one ("abseiling/...")
        rel = v.frames.relative_to(frames).parts
        if len(rel) > 1:
            names.setdefault(v.label, rel[0])
    classes = [names.get(i, str(i)) for i in range(max(labels, default=-1) + 1)]
    return videos, classes


# ------------------------------------------------------------------------------------------------ loader
class FrameClipDataset(Dataset):
    """Clips of `clip_len` frames (every `frame_interval`-th) from frame folders, as (3, T, H, W) floats.

    dataset: ucf101 / kinetics400 (from `root`) or motion10 / motion20 (made in the cache `root`).
    Training clips start at a random frame when `augment`, else every clip is the video's centre window;
    videos shorter than the window are looped. Spatially: with `resize`, the short side is resized to it
    and an `input_size` square is cropped (random crop and horizontal flip when augmenting, centre crop
    otherwise); without, frames are resized to input_size x input_size when they are not already.
    `limit` keeps a class-balanced prefix (the first videos of each class, in list order).
    Items are dict(inputs=float tensor (3, T, H, W) normalised, labels=int), as the Runner's collate wants:
    real sets with Kinetics' channel mean and std, the generated stand-ins per clip (each channel's mean and
    std over the clip's own frames).
    """

    def __init__(
        self,
        dataset: str,
        split: str,
        root: str | None = None,
        clip_len: int = 8,
        frame_interval: int = 1,
        input_size: int = 32,
        resize: int | None = None,
        augment: bool = False,
        limit: int | None = None,
    ):
        if split not in ("train", "val"):
            raise ValueError(f"unknown split {split!r}; choose from train, val")
        if dataset in REAL and root is None:
            raise DatasetNotFoundError(f"{dataset} needs a data root (--data-root); none was given")
        if dataset in EMBEDDED:
            root = str(ensure_motion(dataset, root))
        elif dataset not in REAL:
            raise ValueError(f"unknown dataset {dataset!r}; choose from {', '.join(REAL + EMBEDDED)}")
        if LAYOUT[dataset] == UCF101:
            self.videos, self.classes = ucf101_videos(root, split)
        else:
            self.videos, self.classes = kinetics400_videos(root, split)
        self.mean, self.std = normalization(dataset, root)
        # the stand-ins are normalised per clip (see the module docstring); real data by dataset statistics
        self.per_clip_norm = dataset in EMBEDDED
        self.clip_len, self.frame_interval = clip_len, frame_interval
        self.input_size, self.resize, self.augment = input_size, resize, augment
        self.metainfo = {"dataset": dataset, "split": split, "classes": tuple(self.classes)}
        self.targets = [v.label for v in self.videos]
        if limit is not None:
            per_class = max(1, limit // len(self.classes))
            seen: dict[int, int] = {}
            kept = []
            for v in self.videos:
                if seen.get(v.label, 0) < per_class:
                    seen[v.label] = seen.get(v.label, 0) + 1
                    kept.append(v)
            self.videos = kept
            self.targets = [v.label for v in kept]
        self._counts: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.videos)

    def num_frames(self, i: int) -> int:
        video = self.videos[i]
        if video.num_frames is not None:
            return video.num_frames
        if i not in self._counts:
            try:
                self._counts[i] = sum(1 for n in os.listdir(video.frames) if n.startswith("img_"))
            except OSError as err:
                raise DatasetNotFoundError(f"frame folder {video.frames} unreadable: {err}") from err
        return self._counts[i]

    def frame_indices(self, i: int, rng: np.random.Generator | None = None) -> list[int]:
        """0-based frame indices of the clip of video i (random start when rng is given)."""
        n = max(1, self.num_frames(i))
        span = (self.clip_len - 1) * self.frame_interval + 1
        free = max(0, n - span)
        start = int(rng.integers(0, free + 1)) if rng is not None else free // 2
        return [(start + k * self.frame_interval) % n for k in range(self.clip_len)]

    def __getitem__(self, i: int) -> dict:
        video = self.videos[i]
        rng = np.random.default_rng(torch.randint(0, 2**31, ()).item()) if self.augment else None
        frames = []
        for f in self.frame_indices(i, rng):
            path = video.frames / FRAME_TEMPLATE.format(f + 1)
            try:
                with Image.open(path) as img:
                    frames.append(np.asarray(img.convert("RGB")))
            except OSError as err:
                raise DatasetNotFoundError(f"frame {path} missing or unreadable: {err}") from err
        clip = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).float().div_(255)  # (T, 3, H, W)
        clip = self._spatial(clip, rng)
        if self.per_clip_norm:
            mean = clip.mean(dim=(0, 2, 3), keepdim=True)
            std = clip.std(dim=(0, 2, 3), keepdim=True).add_(PER_CLIP_EPS)
        else:
            mean = torch.tensor(self.mean).view(1, 3, 1, 1)
            std = torch.tensor(self.std).view(1, 3, 1, 1)
        clip = clip.sub_(mean).div_(std).permute(1, 0, 2, 3).contiguous()  # (3, T, H, W)
        return {"inputs": clip, "labels": video.label}

    def _spatial(self, clip: torch.Tensor, rng) -> torch.Tensor:
        size = self.input_size
        h, w = clip.shape[-2:]
        if self.resize is None:
            if (h, w) != (size, size):
                clip = F.interpolate(clip, size=(size, size), mode="bilinear", antialias=True)
            return clip
        scale = self.resize / min(h, w)
        if scale != 1:
            new = (max(size, round(h * scale)), max(size, round(w * scale)))
            clip = F.interpolate(clip, size=new, mode="bilinear", antialias=True)
            h, w = new
        if rng is not None:
            top, left = int(rng.integers(0, h - size + 1)), int(rng.integers(0, w - size + 1))
        else:
            top, left = (h - size) // 2, (w - size) // 2
        clip = clip[..., top : top + size, left : left + size]
        if rng is not None and rng.uniform() < 0.5:
            clip = clip.flip(-1)
        return clip


def normalization(dataset: str, root=None) -> tuple[tuple, tuple]:
    """Per-channel (mean, std): Kinetics' for the real sets, measured on the train split for the embedded."""
    if dataset in REAL:
        return KINETICS_MEAN, KINETICS_STD
    manifest = read_manifest(root) if root is not None else None
    if manifest is None:
        manifest = read_manifest(ensure_motion(dataset, root))
    return tuple(manifest["mean"]), tuple(manifest["std"])


# ----------------------------------------------------------------------------------- moving-shape clips
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
        if LAYOUT[spec.name] == UCF101:
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
            if LAYOUT[spec.name] == UCF101:
                _save_frames(clip, out / "rawframes" / rel)
            else:
                _save_frames(clip, out / KINETICS_FRAMES[split] / rel)
            if split == "train":
                x = clip.reshape(-1, 3).astype(np.float64) / 255.0
                stats += np.stack([x.sum(0), (x**2).sum(0)])
                count += len(x)
    if LAYOUT[spec.name] == UCF101:
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
        "format": f"{LAYOUT[spec.name]} frame folders ({FRAME_TEMPLATE}) with its annotation lists",
        "source": "generated by tasks.video_data.render_clip",
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
