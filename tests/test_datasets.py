"""The embedded datasets: written once, atomically, in real on-disk formats that torchvision reads back."""

import os
import pickle

import numpy as np
import pytest
import torch
from torchvision.datasets import CIFAR10, ImageFolder

from tasks import data_cache as C
from tasks import datasets as D


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """One data cache for the whole session (shared with test_classification by path)."""
    return tmp_path_factory.getbasetemp() / "repro-data-cache"


def test_cache_dir_order(monkeypatch, tmp_path):
    monkeypatch.delenv(C.CACHE_ENV, raising=False)
    assert C.cache_dir() == C.DEFAULT_CACHE.expanduser()
    monkeypatch.setenv(C.CACHE_ENV, str(tmp_path / "env"))
    assert C.cache_dir() == tmp_path / "env"
    assert C.cache_dir(tmp_path / "arg") == tmp_path / "arg"


def test_digits_is_an_imagefolder_of_real_digits_written_once(cache):
    root = D.ensure_digits(cache)
    manifest = (root / C.MANIFEST).stat().st_mtime_ns
    train, val = ImageFolder(str(root / "train")), ImageFolder(str(root / "val"))
    assert (len(train), len(val)) == (1437, 360)
    assert train.classes == [str(d) for d in range(10)]
    image, label = val[0]
    assert image.size == (8, 8) and label == 0
    # the pixels are scikit-learn's digits, scaled 0..16 -> 0..255
    from sklearn.datasets import load_digits

    index = int(os.path.basename(val.samples[0][0]).split(".")[0])
    expected = np.round(load_digits().images[index] * 255 / 16)
    assert np.array_equal(np.asarray(image.convert("L"), dtype=np.float64), expected)
    # stratified: every class in both splits, within a few images of balance
    for ds in (train, val):
        counts = np.bincount(ds.targets, minlength=10)
        assert counts.min() > 0 and counts.max() - counts.min() <= 0.05 * len(ds)
    assert D.ensure_digits(cache) == root
    assert (root / C.MANIFEST).stat().st_mtime_ns == manifest  # not rewritten
    assert not [p for p in root.parent.iterdir() if ".tmp-" in p.name]


def test_shapes10_is_cifar10_format_read_by_torchvision(cache):
    root = D.ensure_shapes10(cache)
    folder = root / D.CIFAR_FOLDER
    assert sorted(p.name for p in folder.iterdir()) == sorted([*D.CIFAR_TRAIN, D.CIFAR_TEST, D.CIFAR_META])
    with open(folder / "data_batch_1", "rb") as f:
        batch = pickle.load(f, encoding="latin1")
    assert batch["data"].dtype == np.uint8 and batch["data"].shape == (1000, 3072)
    train, test = D.cifar10(root, train=True), D.cifar10(root, train=False)
    assert isinstance(train, CIFAR10)  # torchvision's reader, with the checksums of our files
    assert (len(train), len(test)) == (5000, 1000)
    assert train.classes == list(D.SHAPES10_CLASSES)
    assert train.data.shape == (5000, 32, 32, 3)
    # exactly class-balanced
    assert np.bincount(train.targets).tolist() == [500] * 10
    assert np.bincount(test.targets).tolist() == [100] * 10
    # the checksums are checked: CIFAR-10's own reject these files, a corrupted file is refused
    with pytest.raises(RuntimeError, match="corrupted"):
        CIFAR10(str(root), train=False, download=False)


def test_shapes10_is_deterministic_and_seeded(tmp_path):
    a, la = D.make_shapes10(30, seed=3)
    b, lb = D.make_shapes10(30, seed=3)
    c, _ = D.make_shapes10(30, seed=4)
    assert np.array_equal(a, b) and la == lb
    assert not np.array_equal(a, c)
    assert np.bincount(la).tolist() == [3] * 10
    # the written files are byte-identical across two writes
    m1 = D._write_shapes10(tmp_path / "one", per_batch=20, test=20)["md5"]
    m2 = D._write_shapes10(tmp_path / "two", per_batch=20, test=20)["md5"]
    assert m1 == m2


def test_shapes10_is_not_solved_by_a_pixel_template():
    train, train_labels = D.make_shapes10(500, seed=0)
    test, test_labels = D.make_shapes10(200, seed=1)
    x = torch.tensor(train, dtype=torch.float32).flatten(1)
    y = torch.tensor(train_labels)
    means = torch.stack([x[y == c].mean(0) for c in range(10)])
    # colours, positions, rotations and noise vary: the class-mean images explain little of the
    # variance, and nearest-class-mean on pixels is far from solving it (but above chance)
    assert (x - means[y]).var() > 0.6 * x.var()
    pred = torch.cdist(torch.tensor(test, dtype=torch.float32).flatten(1), means).argmin(1)
    accuracy = (pred == torch.tensor(test_labels)).float().mean().item()
    assert 0.1 < accuracy < 0.6


def test_a_killed_write_leaves_nothing_and_a_half_folder_is_rebuilt(tmp_path):
    def killed(out):
        (out / "train").mkdir()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        C.write_set(tmp_path / "digits-v1", killed)
    assert list(tmp_path.iterdir()) == []
    # a folder without a manifest (not made by us, or by an older interrupted version) is rebuilt
    (tmp_path / f"digits-v{D.VERSIONS['digits']}" / "train").mkdir(parents=True)
    root = D.ensure_digits(tmp_path)
    assert (root / C.MANIFEST).is_file() and len(ImageFolder(str(root / "val"))) == 360


def test_missing_roots_are_one_clear_line(tmp_path):
    with pytest.raises(D.DatasetNotFoundError) as err:
        D.cifar10(tmp_path / "nowhere", train=True)
    msg = str(err.value)
    assert "\n" not in msg and "cifar-10-batches-py/data_batch_1..5, test_batch" in msg
    with pytest.raises(D.DatasetNotFoundError) as err:
        D.image_folder(tmp_path, "train")
    msg = str(err.value)
    assert "\n" not in msg and "/train/<class>/" in msg and "/val/<class>/" in msg


def test_two_writers_of_one_set_the_first_to_finish_wins(tmp_path):
    first = C.write_set(tmp_path / "set-v1", lambda out: {"writer": 1})

    def second(out):
        (out / "data").write_text("2")
        return {"writer": 2}

    assert C.write_set(tmp_path / "set-v1", second) == first  # the finished set is kept, not replaced
    assert not (tmp_path / "set-v1" / "data").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["set-v1"]  # the loser's folder is gone
