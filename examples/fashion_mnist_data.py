"""Fashion-MNIST (Xiao et al. 2017) from Debian's dataset-fashion-mnist package.

The package (installed by scripts/install_deps.sh) puts the four idx files, gzip-compressed,
under /usr/share/datasets/fashion-mnist/: 60,000 training and 10,000 test images of 28x28
grey pixels (uint8), labels 0..9 (T-shirt/top, trouser, pullover, dress, coat, sandal, shirt,
sneaker, bag, ankle boot). No download, no torchvision.
"""

import gzip
import os

import numpy as np
import torch

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
# Mean and standard deviation of the training images' pixels, scaled to [0, 1].
MEAN, STD = 0.2860, 0.3530
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
           "Sneaker", "Bag", "Ankle boot")


def read_idx(path):
    """An idx file (gzip) as a uint8 tensor of the dimensions its header gives."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    if data[:2] != b"\0\0" or data[2] != 0x08:
        raise ValueError(f"{path}: not an idx file of unsigned bytes")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    arr = np.frombuffer(data, np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {arr.size} bytes of data for dimensions {dims}")
    return torch.from_numpy(arr.reshape(dims).copy())


def load(split="train", data_dir=DEFAULT_DIR):
    """(images uint8 [N, 28, 28], labels int64 [N]) of the "train" or "test" split."""
    images, labels = FILES[split]
    paths = [os.path.join(data_dir, f) for f in (images, labels)]
    for p in paths:
        if not os.path.exists(p):
            raise FileNotFoundError(f"{p} not found: install Debian's dataset-fashion-mnist "
                                    "(scripts/install_deps.sh does)")
    return read_idx(paths[0]), read_idx(paths[1]).long()


def normalize(images):
    """uint8 [N, 28, 28] -> float32 [N, 1, 28, 28], standardised with MEAN and STD."""
    return images.unsqueeze(1).float().div_(255.0).sub_(MEAN).div_(STD)
