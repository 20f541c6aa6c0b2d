"""A detection run's terminal: pycocotools' progress in the log, not on stdout; a validation without a
detection one INFO line, not mmdet's ERROR; mmengine's pkg_resources warnings filtered at the entry points
(issue 61: a smoke detection run printed five warnings, pycocotools' lines and an ERROR)."""

import json
import logging
import warnings

import numpy as np
from mmdet.evaluation.metrics import CocoMetric
from mmengine.logging import MMLogger
from pycocotools.coco import COCO

import tasks.detection_quiet as Q
from repro.third_party_warnings import filter_known

ANNOTATIONS = dict(
    images=[dict(id=1, file_name="a.png", width=32, height=32)],
    annotations=[dict(id=1, image_id=1, category_id=1, bbox=[1, 1, 10, 10], area=100, iscrowd=0)],
    categories=[dict(id=1, name="box")],
)


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append((record.levelname, record.getMessage()))


def run_logger(name):
    logger = MMLogger.get_instance(name, log_level="WARNING")  # as a smoke run; the log sees INFO
    handler = Records()
    logger.addHandler(handler)
    return logger, handler


def test_pycocotools_progress_goes_to_the_log(tmp_path, capsys):
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps(ANNOTATIONS))
    _, seen = run_logger("quiet-coco")
    COCO(str(ann))
    assert capsys.readouterr().out == ""
    assert ("INFO", "loading annotations into memory...") in seen.records


def test_a_validation_without_detections_is_one_info_line(tmp_path):
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps(ANNOTATIONS))
    logger, seen = run_logger("quiet-empty")
    metric = CocoMetric(ann_file=str(ann), metric="bbox")
    metric.dataset_meta = dict(classes=("box",))
    none = dict(img_id=1, bboxes=np.zeros((0, 4)), scores=np.zeros(0), labels=np.zeros(0, dtype=int))
    assert metric.compute_metrics([({}, none)]) == {}
    assert not [r for r in seen.records if r[0] == "ERROR"]
    assert [r for r in seen.records if "no detections" in r[1]] == [
        ("INFO", "no detections on the validation set: its mAP is recorded as 0")
    ]
    logger.error(Q.EMPTY_RESULT)  # outside a metric's computation mmdet's line is left as it is
    assert seen.records[-1] == ("ERROR", Q.EMPTY_RESULT)


def test_known_third_party_warnings_are_filtered_and_others_kept():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        filter_known()
        warnings.warn(
            "pkg_resources is deprecated as an API. See https://setuptools...", UserWarning, stacklevel=1
        )
        warnings.warn("something of ours", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["something of ours"]
