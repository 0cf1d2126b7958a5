"""Fashion-MNIST from Debian's dataset-fashion-mnist (idx files, gzip): 60000
training and 10000 test images of 28x28 grey levels, 10 classes."""

import gzip
import pathlib

import numpy as np

DEFAULT_ROOT = pathlib.Path("/usr/share/datasets/fashion-mnist")
FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
         "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}
MEAN, STD = 0.2860, 0.3530  # of the training images, in [0, 1]


def read_idx(path):
    """The array in an idx file (gzip): magic 0x0000 0x08 ndim, big-endian
    dimensions, then unsigned bytes."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    if data[:3] != b"\0\0\x08":
        raise ValueError(f"{path}: not an idx file of unsigned bytes")
    ndim = data[3]
    shape = tuple(np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load(split, root=DEFAULT_ROOT):
    """(images float32 [n, 784] normalised, labels int64 [n]) of split
    "train" or "test"."""
    images_file, labels_file = FILES[split]
    root = pathlib.Path(root)
    if not (root / images_file).exists():
        raise FileNotFoundError(f"{root / images_file} is missing: install Debian's "
                                "dataset-fashion-mnist (deploy/install-deps.sh does)")
    images = read_idx(root / images_file).reshape(-1, 28 * 28).astype(np.float32)
    images = (images / 255.0 - MEAN) / STD
    labels = read_idx(root / labels_file).astype(np.int64)
    return images, labels
