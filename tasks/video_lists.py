"""UCF-101 (split 1) and Kinetics-400 as frame folders: their on-disk layouts and annotation-list readers.

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
(tasks.datasets.DatasetNotFoundError) naming the expected layout; a malformed line of a list is one
(tasks.bad_data.BadDataError) naming the file, the line and what it should hold. The generated stand-ins
(tasks.motion_sets) are written in these same layouts and read by the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tasks.bad_data import BadDataError
from tasks.datasets import DatasetNotFoundError

UCF101 = "ucf101"
KINETICS400 = "kinetics400"
FRAME_TEMPLATE = "img_{:05d}.jpg"
UCF_LISTS = "ucfTrainTestlist"
KINETICS_LISTS = {
    "train": "kinetics400_train_list_rawframes.txt",
    "val": "kinetics400_val_list_rawframes.txt",
}
KINETICS_FRAMES = {"train": "rawframes_train", "val": "rawframes_val"}


@dataclass(frozen=True)
class Video:
    frames: Path  # the folder of img_00001.jpg, ...
    num_frames: int | None  # None: counted on first use
    label: int


def _missing(what: str, root: Path, detail: str, layout: str) -> DatasetNotFoundError:
    return DatasetNotFoundError(f"{what} not found under {root} ({detail}): expected {layout}")


def _lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the non-blank lines of an annotation list (BadDataError if not text)."""
    try:
        text = path.read_text()
    except UnicodeDecodeError as err:
        raise BadDataError(f"annotation list {path} is not text ({err.reason}): replace it", path) from err
    return [(n, line.strip()) for n, line in enumerate(text.split("\n"), start=1) if line.strip()]


def _malformed(path: Path, number: int, line: str, expected: str) -> BadDataError:
    return BadDataError(
        f"annotation list {path}, line {number} is malformed ({line[:80]!r}): expected {expected}; fix or "
        "replace the file",
        path,
    )


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
    for number, line in _lines(lists / "classInd.txt"):
        fields = line.split()
        if len(fields) != 2 or fields[0] != str(len(classes) + 1):
            raise _malformed(lists / "classInd.txt", number, line, f"'{len(classes) + 1} <ClassName>'")
        classes.append(fields[1])
    index = {c: i for i, c in enumerate(classes)}
    videos = []
    for number, line in _lines(lists / names[split]):
        path = line.split()[0]  # "Class/v_Class_gXX_cYY.avi" (the train list adds the 1-based label)
        cls = path.split("/")[0]
        if "/" not in path or cls not in index:
            raise _malformed(
                lists / names[split], number, line, "'<Class>/<video>.avi' of a class in classInd.txt"
            )
        videos.append(Video(root / "rawframes" / Path(path).with_suffix(""), None, index[cls]))
    if videos and not videos[0].frames.is_dir():
        raise _missing("UCF-101", root, f"no frame folder {videos[0].frames}", layout)
    return videos, classes


def _kinetics_list(path: Path) -> list[tuple[str, int, int]]:
    """(frame folder, number of frames, label) of each line of a Kinetics-400 raw-frame list."""
    out = []
    for number, line in _lines(path):
        fields = line.rsplit(maxsplit=2)
        if len(fields) != 3 or not (fields[1].isdigit() and fields[2].isdigit()):
            raise _malformed(path, number, line, "'<frame folder> <number of frames> <0-based label>'")
        out.append((fields[0], int(fields[1]), int(fields[2])))
    return out


def kinetics400_videos(root, split: str) -> tuple[list[Video], list[str]]:
    """The videos of a Kinetics-400 raw-frame list ("train" or "val") and the class names (label order)."""
    root = Path(root).expanduser()
    layout = _KINETICS_LAYOUT.format(r=root)
    path = root / KINETICS_LISTS[split]
    if not path.is_file():
        raise _missing("Kinetics-400", root, f"no {path.name}", layout)
    frames = root / KINETICS_FRAMES[split]
    videos = [Video(frames / folder, count, label) for folder, count, label in _kinetics_list(path)]
    if videos and not videos[0].frames.is_dir():
        raise _missing("Kinetics-400", root, f"no frame folder {videos[0].frames}", layout)
    train = root / KINETICS_LISTS["train"]
    labels = [v.label for v in videos] if split == "train" or not train.is_file() else None
    if labels is None:
        labels = [label for _, _, label in _kinetics_list(train)]
    names = {}
    for v in videos:  # a class name is the folder's first part where the list has one ("abseiling/...")
        rel = v.frames.relative_to(frames).parts
        if len(rel) > 1:
            names.setdefault(v.label, rel[0])
    classes = [names.get(i, str(i)) for i in range(max(labels, default=-1) + 1)]
    return videos, classes
