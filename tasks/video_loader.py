"""The video loader: clips of frames from the frame folders of any of the four video sets.

FrameClipDataset reads UCF-101 and Kinetics-400 from a data root (tasks.video_lists) and the generated
stand-ins motion10 / motion20 from the data cache (tasks.motion_sets), which are written in the same
layouts. Real sets are normalised with the Kinetics-400 statistics torchvision's video models use; the
stand-ins per clip (each colour channel by its mean and std over the clip's frames), because their
background and shape colours are drawn per clip and carry no class information: with dataset-wide
statistics that nuisance kept from-scratch 3-D ResNets from learning the motion in the embedded budget
(docs/measurements.md).
"""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from tasks.bad_data import SKIP_HINT, BadDataError, SkipPolicy, read_image
from tasks.data_cache import read_manifest
from tasks.datasets import DatasetNotFoundError
from tasks.motion_sets import MOTION_SETS, ensure_motion
from tasks.registry import DATASETS
from tasks.subsets import balanced_prefix
from tasks.video_lists import FRAME_TEMPLATE, KINETICS400, UCF101, kinetics400_videos, ucf101_videos

REAL = (UCF101, KINETICS400)
EMBEDDED = tuple(MOTION_SETS)
LAYOUT = {UCF101: UCF101, KINETICS400: KINETICS400, **{name: s.layout for name, s in MOTION_SETS.items()}}
PER_CLIP_EPS = 1e-3  # a blank clip (std 0) normalises to zeros, not NaN
KINETICS_MEAN, KINETICS_STD = (0.43216, 0.394666, 0.37645), (0.22803, 0.22145, 0.216989)


@DATASETS.register_module()
class FrameClipDataset(Dataset):
    """Clips of `clip_len` frames (every `frame_interval`-th) from frame folders, as (3, T, H, W) floats.

    dataset: ucf101 / kinetics400 (from `root`) or motion10 / motion20 (made in the cache `root`).
    Training clips start at a random frame when `augment`, else every clip is the video's centre window.
    Spatially: with `resize`, the short side is resized to it
    and an `input_size` square is cropped (random crop and horizontal flip when augmenting, centre crop
    otherwise); without, frames are resized to input_size x input_size when they are not already.
    `limit` keeps a class-balanced prefix (the first videos of each class, in list order). A video with
    fewer frames than one clip spans, or an unreadable frame, is a BadDataError naming it; with `skip_bad`
    the next good video is taken instead, and the skip is logged and listed (tasks.bad_data.SkipPolicy).
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
        skip_bad: bool = False,
    ):
        if split not in ("train", "val"):
            raise ValueError(f"unknown split {split!r}; choose from train, val")
        if dataset in REAL and root is None:
            raise DatasetNotFoundError(f"{dataset} needs a data root (--data-root); none was given")
        if dataset in EMBEDDED:
            root = str(ensure_motion(dataset, root))
        elif dataset not in REAL:
            raise ValueError(f"unknown dataset {dataset!r}; choose from {', '.join(REAL + EMBEDDED)}")
        self.root = root
        if LAYOUT[dataset] == UCF101:
            self.videos, self.classes = ucf101_videos(root, split)
        else:
            self.videos, self.classes = kinetics400_videos(root, split)
        self.mean, self.std = normalization(dataset, root)
        # the stand-ins are normalised per clip (the module docstring says why); real data by its statistics
        self.per_clip_norm = dataset in EMBEDDED
        self.clip_len, self.frame_interval = clip_len, frame_interval
        self.input_size, self.resize, self.augment = input_size, resize, augment
        self.metainfo = {"dataset": dataset, "split": split, "classes": tuple(self.classes)}
        self.targets = [v.label for v in self.videos]
        if limit is not None:
            self.videos = [self.videos[i] for i in balanced_prefix(self.targets, len(self.classes), limit)]
            self.targets = [v.label for v in self.videos]
        self._counts: dict[int, int] = {}
        self.skip_policy = SkipPolicy(skip_bad)

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
                reason = f"{type(err).__name__}: {err.strerror or err}"
                raise BadDataError(
                    f"frame folder {video.frames} unreadable ({reason}): extract the video's frames into it "
                    f"or remove it from the list, {SKIP_HINT}",
                    video.frames,
                    reason,
                ) from err
        return self._counts[i]

    def frame_indices(self, i: int, rng: np.random.Generator | None = None) -> list[int]:
        """0-based frame indices of the clip of video i (random start when rng is given); a video shorter
        than the clip's span is a BadDataError."""
        n = self.num_frames(i)
        span = (self.clip_len - 1) * self.frame_interval + 1
        if n < span:
            reason = f"{n} frames, fewer than a clip of {span}"
            raise BadDataError(
                f"video {self.videos[i].frames} has {reason} (clip_len {self.clip_len}, frame_interval "
                f"{self.frame_interval}): re-extract its frames or remove it from the list, {SKIP_HINT}",
                self.videos[i].frames,
                reason,
            )
        free = n - span
        start = int(rng.integers(0, free + 1)) if rng is not None else free // 2
        return [start + k * self.frame_interval for k in range(self.clip_len)]

    def __getitem__(self, i: int) -> dict:
        return self.skip_policy.fetch(self._item, i, len(self))

    def _item(self, i: int) -> dict:
        video = self.videos[i]
        rng = np.random.default_rng(torch.randint(0, 2**31, ()).item()) if self.augment else None
        fix = f"re-extract the frames of {video.frames}"
        frames = [
            np.asarray(read_image(video.frames / FRAME_TEMPLATE.format(f + 1), "video frame", fix))
            for f in self.frame_indices(i, rng)
        ]
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
