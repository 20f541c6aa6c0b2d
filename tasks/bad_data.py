"""Bad data as one line naming the file and what to do, and the opt-in policy that skips bad samples.

    image = read_image(path)             # BadDataError naming the file when it cannot be decoded
    policy = SkipPolicy(enabled=False)   # a dataset's: fetch(get, i, n) skips bad samples when enabled
    check_one_batch(loader)              # BadDataError when the training data cannot fill one batch

A BadDataError is the user's data, not the code: `repro train` and `repro table` print its message as
one line (one_line_error, also for an error re-raised from a data-loader worker) and exit non-zero.
Skipping is never silent: each skipped sample is logged once per process, appended to the run's skip
log (the loader workers are other processes) and listed in the run's result (RunResult.skipped_samples).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmengine.logging import print_log
from PIL import Image

SKIP_HINT = "or pass --skip-bad-samples to train without it (skipped samples are listed in the result)"
SKIP_LOG = "skipped_samples.tsv"  # in the run's work dir: "path<TAB>reason" per skip


class BadDataError(ValueError):
    """A sample or an annotation file that cannot be used; `path` names it (None for the whole set) and
    `reason` says what is wrong with it."""

    def __init__(self, message: str, path: str | os.PathLike | None = None, reason: str | None = None):
        super().__init__(message)
        self.path = None if path is None else str(path)
        self.reason = reason or message


def _reason(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def read_image(
    path: str | os.PathLike, what: str = "image", fix: str = "replace or remove it"
) -> Image.Image:
    """The RGB image at `path` (as torchvision's ImageFolder reads it); an unreadable, truncated or
    missing file is a BadDataError naming it and saying what to do (`fix`)."""
    try:
        with open(path, "rb") as f:
            image = Image.open(f)
            return image.convert("RGB")  # decodes all of it: a truncated file fails here
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        reason = _reason(err)
        raise BadDataError(f"unreadable {what} {path} ({reason}): {fix}, {SKIP_HINT}", path, reason) from err


class SkipPolicy:
    """A dataset's answer to a bad sample: raise (the default), or skip it and take the next one.

    `log_path` (set by the harness before the loader starts its workers) collects the skips of every
    process; without it they are kept in `skipped` of this process only.
    """

    def __init__(self, enabled: bool = False):
        self.enabled = bool(enabled)
        self.log_path: str | None = None
        self.skipped: dict[str, str] = {}

    def fetch(self, get: Callable[[int], Any], index: int, length: int) -> Any:
        """get(index), or under the skip policy get() of the next good sample after it (wrapping around)."""
        for k in range(max(1, length)):
            try:
                return get((index + k) % max(1, length))
            except BadDataError as err:
                if not self.enabled:
                    raise
                self.record(err)
        raise BadDataError("every sample of the dataset is unreadable: nothing left to train on")

    def record(self, err: BadDataError) -> None:
        path, reason = err.path or "?", err.reason
        if self.log_path is not None:
            line = f"{path}\t{reason}\n".encode()
            fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)  # one write with O_APPEND: lines from several workers never interleave
            finally:
                os.close(fd)
        if path not in self.skipped:
            self.skipped[path] = reason
            print_log(
                f"skipped bad sample {path} ({reason}) [--skip-bad-samples]", "current", logging.WARNING
            )


def read_skip_log(path: str | os.PathLike) -> dict[str, str]:
    """{path: reason} of every sample a run skipped (each once)."""
    out: dict[str, str] = {}
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        sample, _, reason = line.partition("\t")
        if sample:
            out.setdefault(sample, reason)
    return out


def describe_dataset(dataset: Any) -> str:
    meta = getattr(dataset, "metainfo", None) or {}
    parts = [str(meta[k]) for k in ("dataset", "split") if isinstance(meta, dict) and meta.get(k)]
    root = next(
        (getattr(dataset, a) for a in ("root", "data_root", "ann_file") if getattr(dataset, a, None)), None
    )
    name = " ".join(parts) or type(dataset).__name__
    return f"{name} ({root})" if root else name


def check_one_batch(loader) -> None:
    """A training loader must yield at least one batch on every rank (with drop_last, an incomplete one
    is dropped): else one line naming the data, its size and the batch size."""
    if len(loader) > 0:
        return
    from mmengine.dist import get_world_size

    batch = getattr(loader, "batch_size", None) or getattr(loader.batch_sampler, "batch_size", "?")
    total, ranks = len(loader.dataset), get_world_size()
    per_rank = f"{-(-total // ranks)} per rank on {ranks} ranks" if ranks > 1 else f"{total}"
    raise BadDataError(
        f"the training data {describe_dataset(loader.dataset)} has {per_rank} samples, fewer than one batch "
        f"of {batch} (incomplete batches are dropped): add data, or lower the batch size with --cfg-options "
        "train_dataloader.batch_size=N"
    )


_WORKER = re.compile(r"^Caught \w+ in DataLoader worker process \d+\.")


def one_line_error(err: BaseException) -> str:
    """The message of an error as one line; an error a data-loader worker raised (its message holds the
    worker's traceback) gives its original last line, without the exception's module path."""
    text = str(err).strip()
    if _WORKER.match(text):
        last = [line for line in text.splitlines() if line.strip()][-1]
        return re.sub(r"^[\w.]*\w+(Error|Exception): ", "", last.strip())
    lines = text.splitlines()
    return lines[0] if lines else type(err).__name__
