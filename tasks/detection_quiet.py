"""A detection run's terminal shows what matters: pycocotools' progress lines go to the run's log, and
MMDetection's ERROR for a validation without a single detection becomes one INFO line (the result calls
it mAP 0, with a note: tasks.detection._run_scores). Both are set up when tasks.detection is imported,
without a config entry, so the Runner configs stay as they were (tests/test_golden_configs.py).

pycocotools prints ("loading annotations into memory...", "index created!", "Accumulating evaluation
results...", the AP summary) with the builtin print; a module-level `print` in its two modules shadows
it and hands each line to the current MMLogger at INFO, which writes it to the run's log where the log
level lets it. Prints to another stream than stdout are left alone.
"""

from __future__ import annotations

import builtins
import functools
import logging
import sys

import pycocotools.coco
import pycocotools.cocoeval
from mmdet.evaluation.metrics import CocoMetric
from mmengine.logging import MMLogger

EMPTY_RESULT = "The testing results of the whole dataset is empty."  # mmdet's CocoMetric, on no detections


def print_to_log(*args, sep=" ", end="\n", file=None, flush=False) -> None:
    if file is not None and file is not sys.stdout:
        builtins.print(*args, sep=sep, end=end, file=file, flush=flush)
        return
    text = sep.join(map(str, args)).rstrip("\n")
    if text:
        MMLogger.get_current_instance().info(text)


for _module in (pycocotools.coco, pycocotools.cocoeval):
    _module.print = print_to_log


class EmptyResultIsInfo(logging.Filter):
    """MMDetection's ERROR for an empty result, as one INFO line that says what the run records."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and record.getMessage() == EMPTY_RESULT:
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = "no detections on the validation set: its mAP is recorded as 0", ()
        return True  # the handlers' levels decide where the INFO line goes


def _quiet(compute_metrics):
    """CocoMetric.compute_metrics with EmptyResultIsInfo on the run's logger while it runs."""

    @functools.wraps(compute_metrics)
    def wrapped(self, results):
        logger, note = MMLogger.get_current_instance(), EmptyResultIsInfo()
        logger.addFilter(note)
        try:
            return compute_metrics(self, results)
        finally:
            logger.removeFilter(note)

    wrapped.quiet = True
    return wrapped


if not getattr(CocoMetric.compute_metrics, "quiet", False):
    CocoMetric.compute_metrics = _quiet(CocoMetric.compute_metrics)
