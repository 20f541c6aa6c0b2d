"""Bad data is one line naming the file and what to do (exit 2); skipping it is opt-in and never silent."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tables.command import main
from tables.generate import generate
from tables.specs import SPECS
from tasks import detection
from tasks.bad_data import BadDataError, SkipPolicy, one_line_error, read_image
from tasks.datasets import image_folder
from tasks.video_lists import kinetics400_videos, ucf101_videos
from tasks.video_loader import FrameClipDataset

# the paper profile's ImageNet recipe, cut to seconds: 32 px, batches of 2, one epoch (its 2 loader
# workers kept: an error raised in a worker reaches the user as one line too)
SMALL = [
    "train_dataloader.batch_size=2", "val_dataloader.batch_size=2", "train_cfg.max_epochs=1",
    "train_dataloader.dataset.input_size=32", "val_dataloader.dataset.input_size=32", "model.input_size=32",
]  # fmt: skip


def _jpeg(path: Path, seed: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, size=(40, 40, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, quality=90)
    return path


def _imagenet(root: Path, per_class: int = 4) -> Path:
    for split in ("train", "val"):
        for c, name in enumerate(("n01", "n02")):
            for i in range(per_class):
                _jpeg(root / split / name / f"img{i}.JPEG", seed=100 * c + i + (7 if split == "val" else 0))
    return root


def _train(root: Path, *extra: str, options=SMALL) -> list[str]:
    args = [
        "train",
        "--model",
        "resnet18",
        "--method",
        "fp32",
        "--profile",
        "paper",
        "--data-root",
        str(root),
    ]
    return [*args, "--json", *extra, *(["--cfg-options", *options] if options else [])]


def test_an_unreadable_image_is_one_line_naming_it_or_is_skipped_and_listed(tmp_path, capsys):
    root = _imagenet(tmp_path / "imagenet")
    bad = root / "train" / "n01" / "img0.JPEG"
    bad.write_text("this is not a JPEG")
    assert main(_train(root, "--work-dir", str(tmp_path / "failed"))) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert (
        err.startswith(f"error: unreadable image {bad} (UnidentifiedImageError: ")
        and "--skip-bad-samples" in err
    )

    work = tmp_path / "work"
    assert main(_train(root, "--skip-bad-samples", "--work-dir", str(work))) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(result["skipped_samples"]) == 1, result
    assert result["skipped_samples"][0].startswith(
        f"{bad}: UnidentifiedImageError: cannot identify image file"
    )
    assert result["resumed_from"] is None and result["iters"] == 4  # 8 images, batches of 2
    logs = "".join(p.read_text() for p in work.glob("*/*.log"))
    assert f"skipped bad sample {bad}" in logs  # in the run's log, from the loader worker


def test_a_truncated_image_names_the_file(tmp_path):
    good = _jpeg(tmp_path / "a.JPEG", seed=1)
    truncated = tmp_path / "b.JPEG"
    truncated.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    assert read_image(good).size == (40, 40)
    with pytest.raises(
        BadDataError, match=r"unreadable image .*b\.JPEG \(OSError: image file is truncated"
    ) as e:
        read_image(truncated)
    assert e.value.path == str(truncated) and "truncated" in e.value.reason


def test_an_empty_class_folder_is_one_line_naming_it(tmp_path):
    root = _imagenet(tmp_path)
    (root / "train" / "n03").mkdir()
    with pytest.raises(
        BadDataError, match=r"1 class folder\(s\) of ImageNet hold no images .*n03; put their"
    ):
        image_folder(root, "train")


def test_data_smaller_than_one_batch_is_one_line(tmp_path, capsys):
    root = _imagenet(tmp_path)  # 8 training images; the paper recipe's batch is 256
    small = [o for o in SMALL if not o.startswith("train_dataloader.batch_size")]
    assert main(_train(root, "--work-dir", str(tmp_path / "work"), options=small)) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: the training data imagenet train ({root / 'train'}) has 8 samples, fewer than one batch "
        "of 256 (incomplete batches are dropped): add data, or lower the batch size with --cfg-options "
        "train_dataloader.batch_size=N"
    ), err


def _ucf(root: Path, class_ind: str, train_list: str, frames: int = 8) -> Path:
    lists = root / "ucfTrainTestlist"
    lists.mkdir(parents=True)
    (lists / "classInd.txt").write_text(class_ind)
    (lists / "trainlist01.txt").write_text(train_list)
    (lists / "testlist01.txt").write_text("Walk/v_Walk_g01_c01.avi\n")
    for video, n in (("v_Walk_g08_c01", frames), ("v_Walk_g09_c01", 8), ("v_Walk_g01_c01", 8)):
        for f in range(n):
            _jpeg(root / "rawframes" / "Walk" / video / f"img_{f + 1:05d}.jpg", seed=f)
    return root


def test_malformed_annotation_lists_name_the_file_and_the_line(tmp_path):
    ok = "Walk/v_Walk_g08_c01.avi 1\n"
    root = _ucf(tmp_path / "a", "1 Walk\n3 Run\n", ok)
    with pytest.raises(
        BadDataError, match=r"classInd\.txt, line 2 is malformed \('3 Run'\): expected '2 <Class"
    ):
        ucf101_videos(root, "train")
    root = _ucf(tmp_path / "b", "1 Walk\n", ok + "Jump/v_Jump_g01_c01.avi 2\n")
    with pytest.raises(BadDataError, match=r"trainlist01\.txt, line 2 is malformed .*of a class in classInd"):
        ucf101_videos(root, "train")
    kinetics = tmp_path / "k"
    (kinetics / "rawframes_train" / "walk" / "a").mkdir(parents=True)
    (kinetics / "kinetics400_train_list_rawframes.txt").write_text("walk/a 8 0\nwalk/b eight 0\n")
    with pytest.raises(BadDataError, match=r"kinetics400_train_list_rawframes\.txt, line 2 is malformed"):
        kinetics400_videos(kinetics, "train")


def test_a_video_shorter_than_the_clip_or_with_a_bad_frame_names_it_or_is_skipped(tmp_path):
    root = _ucf(tmp_path, "1 Walk\n", "Walk/v_Walk_g08_c01.avi 1\nWalk/v_Walk_g09_c01.avi 1\n", frames=3)
    short = root / "rawframes" / "Walk" / "v_Walk_g08_c01"
    data = FrameClipDataset("ucf101", "train", str(root), clip_len=8, input_size=16)
    with pytest.raises(
        BadDataError, match=rf"video {short} has 3 frames, fewer than a clip of 8 \(clip_len 8"
    ):
        data[0]
    skipping = FrameClipDataset("ucf101", "train", str(root), clip_len=8, input_size=16, skip_bad=True)
    assert skipping[0]["inputs"].shape == (3, 8, 16, 16)  # the next video's clip
    assert skipping.skip_policy.skipped == {str(short): "3 frames, fewer than a clip of 8"}
    frame = root / "rawframes" / "Walk" / "v_Walk_g09_c01" / "img_00005.jpg"
    frame.write_bytes(b"")
    with pytest.raises(BadDataError, match=rf"unreadable video frame {frame} .*re-extract the frames of"):
        data[1]


def test_the_skip_policy_logs_every_skip_and_stops_when_nothing_is_left(tmp_path):
    def get(i):
        if i in (1, 2):
            raise BadDataError(f"bad {i}", f"/data/{i}.jpg", "unreadable")
        return i

    policy = SkipPolicy(enabled=True)
    policy.log_path = str(tmp_path / "skipped.tsv")
    assert [policy.fetch(get, i, 4) for i in range(4)] == [0, 3, 3, 3]
    assert (tmp_path / "skipped.tsv").read_text().splitlines() == [
        "/data/1.jpg\tunreadable",
        "/data/2.jpg\tunreadable",
        "/data/2.jpg\tunreadable",
    ]
    with pytest.raises(BadDataError, match="bad 1"):
        SkipPolicy(enabled=False).fetch(get, 1, 4)
    with pytest.raises(BadDataError, match="every sample of the dataset is unreadable"):
        SkipPolicy(enabled=True).fetch(lambda i: get(1), 0, 3)


def test_a_worker_error_is_its_original_last_line():
    wrapped = BadDataError(
        "Caught BadDataError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n'
        "tasks.bad_data.BadDataError: unreadable image /d/a.JPEG (OSError: x): y\n"
    )
    assert one_line_error(wrapped) == "unreadable image /d/a.JPEG (OSError: x): y"


def test_detection_annotation_files_missing_or_malformed_name_the_file(tmp_path, capsys):
    with pytest.raises(BadDataError, match=r"annotation file .*instances_train2017\.json is missing: put it"):
        detection.run("faster_rcnn_r50_fpn", "fp32", profile="paper", data_root=str(tmp_path))
    annotations = tmp_path / "annotations"
    annotations.mkdir()
    (annotations / "instances_train2017.json").write_text('{"images": [')
    (annotations / "instances_val2017.json").write_text('{"images": [], "annotations": [], "categories": []}')
    with pytest.raises(BadDataError, match=r"annotation file .*instances_train2017\.json is not valid JSON"):
        detection.run("faster_rcnn_r50_fpn", "fp32", profile="paper", data_root=str(tmp_path))
    assert main(["train", "--task", "detection", "--model", "faster_rcnn_r50_fpn", "--method", "fp32",
                 "--profile", "smoke", "--skip-bad-samples"]) == 2  # fmt: skip
    assert "cannot skip samples" in capsys.readouterr().err


def test_a_table_with_skip_bad_samples_passes_it_on_and_says_what_its_cells_skipped(tmp_path, capsys):
    seen = []

    def runner(**kw):
        seen.append(kw.get("skip_bad_samples"))
        skipped = ["/d/img0.JPEG: OSError: cannot identify image file"] if kw["method"] == "daiq" else []
        return dict(method=kw["method"], top1=50.0, diverged=False, skipped_samples=skipped)

    spec = SPECS["table4"]
    spec = dataclasses.replace(
        spec, rows=tuple(r for r in spec.rows if (r.model, r.method) == ("resnet18", "daiq"))
    )
    out = generate(
        spec, profile="smoke", results_dir=tmp_path, runner=runner, progress=False, skip_bad_samples=True
    )
    assert seen == [True, True] and out.errors == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "bad samples" in x]
    assert "resnet18/daiq" in line and "skipped 1 bad samples (listed in " in line
    (entry,) = [
        json.loads(p.read_text()) for p in (tmp_path / "cache").glob("*.json") if "daiq" in p.read_text()
    ]
    assert entry["result"]["skipped_samples"] == ["/d/img0.JPEG: OSError: cannot identify image file"]
