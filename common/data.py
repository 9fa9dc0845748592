"""CIFAR-10 as uint8 tensors in memory, and augmentation applied to whole batches on the device.

The first run downloads CIFAR-10 with torchvision (cifar-10-python.tar.gz, 170,498,071 bytes: about
170 MB) and writes a cache of two .npz files into the data dir; every later run (and every worker)
loads that cache in well under a second. A data dir that already holds the cache never touches the
network.
"""
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset
from filelock import FileLock

from .errors import fail

DEFAULT_DATA_DIR = "~/.cache/cifar10"
CACHE_FILES = {"train": "cifar10_train.npz", "test": "cifar10_test.npz"}
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
SYNTHETIC_SIZES = {"train": 4096, "test": 1024}
CROP_PADDING = 2  # random crops shift an image by up to this many pixels each way
VALIDATION_SIZE = 5000  # cifar10-val: the last 5,000 training images, held out for tuning the recipe
# Images in each --data's training and evaluation splits
TRAIN_SIZES = {"cifar10": 50_000, "cifar10-val": 50_000 - VALIDATION_SIZE, "synthetic": SYNTHETIC_SIZES["train"]}
EVAL_SIZES = {"cifar10": 10_000, "cifar10-val": VALIDATION_SIZE, "synthetic": SYNTHETIC_SIZES["test"]}


@dataclass
class Data:
    train_images: torch.Tensor  # (N, 3, 32, 32) uint8
    train_labels: torch.Tensor  # (N,) int64
    test_images: torch.Tensor
    test_labels: torch.Tensor
    description: str

    def train_set(self) -> TensorDataset:
        """(image, label, id) for each training image: the id travels with its batch, and augment_batch derives
        the image's random crop and flip from it."""
        return TensorDataset(self.train_images, self.train_labels, torch.arange(len(self.train_labels)))


def load_data(name: str, data_dir: str, eval_images: int | None = None) -> Data:
    """name: cifar10 (evaluate on the test set), cifar10-val (train on 45,000 images, evaluate on the
    other 5,000: tune on this, never on the test set) or synthetic. eval_images: evaluate on the
    first N evaluation images only (memory and speed probes of huge models)."""
    if name == "synthetic":
        train, test = synthetic_split("train"), synthetic_split("test")
        description = f"synthetic ({len(train[1])} train / {len(test[1])} test images, generated)"
    elif name in ("cifar10", "cifar10-val"):
        directory = Path(data_dir).expanduser()
        train, test = load_cifar10_cache(directory)
        if name == "cifar10-val":
            (images, labels), cut = train, -VALIDATION_SIZE
            train, test = (images[:cut], labels[:cut]), (images[cut:], labels[cut:])
        evaluated_on = "validation" if name == "cifar10-val" else "test"
        description = f"{name} from {directory} ({len(train[1])} train / {len(test[1])} {evaluated_on} images)"
    else:
        raise fail(f"unknown --data {name!r}; choose cifar10, cifar10-val or synthetic")
    if eval_images is not None:
        if not 0 < eval_images <= len(test[1]):
            raise fail(f"--eval-images {eval_images} must be between 1 and {len(test[1])}")
        test = test[0][:eval_images], test[1][:eval_images]
        description += f", evaluating on the first {eval_images} only"
    return Data(*to_tensors(*train), *to_tensors(*test), description)


def to_tensors(images: np.ndarray, labels: np.ndarray):
    """NHWC uint8 arrays -> NCHW uint8 tensor, and the labels."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(labels)


def load_cifar10_cache(directory: Path):
    """Read the cache, downloading first if it is missing. One process downloads, the others wait."""
    if not cache_exists(directory):
        directory.mkdir(parents=True, exist_ok=True)
        with FileLock(directory / ".download.lock"):  # waits for the process that downloads
            if not cache_exists(directory):
                download_cifar10(directory)
    return read_split(directory, "train"), read_split(directory, "test")


def cache_exists(directory: Path) -> bool:
    return all((directory / f).exists() for f in CACHE_FILES.values())


def read_split(directory: Path, split: str):
    path = directory / CACHE_FILES[split]
    try:
        with np.load(path) as arrays:
            images, labels = arrays["images"], arrays["labels"]
    except Exception as e:
        raise fail(f"{path} is corrupt ({type(e).__name__}); delete it to download again")
    if images.dtype != np.uint8 or images.shape[1:] != (32, 32, 3) or labels.shape != images.shape[:1]:
        raise fail(f"{path} holds images {images.shape} {images.dtype}, expected (N, 32, 32, 3) uint8 with N "
                   f"labels; delete it to download again")
    return images, labels.astype(np.int64)


def download_cifar10(directory: Path) -> None:
    from torchvision.datasets import CIFAR10

    try:
        splits = {split: CIFAR10(directory, train=split == "train", download=True) for split in CACHE_FILES}
    except Exception as e:
        raise fail(
            f"could not download CIFAR-10 into {directory} ({type(e).__name__}: {e}); offline? "
            f"copy {' and '.join(CACHE_FILES.values())} there and pass --data-dir, or use --data synthetic")
    for split, dataset in splits.items():
        write_cache(directory / CACHE_FILES[split], dataset.data, np.array(dataset.targets, dtype=np.int64))


def write_cache(path: Path, images: np.ndarray, labels: np.ndarray) -> None:
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, images=images, labels=labels)
    os.replace(tmp, path)  # atomic: a reader sees the old file or the whole new one


def synthetic_split(split: str):
    """Deterministic, learnable stand-in for CIFAR-10: ten smooth colour prototypes plus noise."""
    rng = np.random.default_rng(0)
    prototypes = rng.uniform(40, 215, size=(10, 4, 4, 3)).repeat(8, axis=1).repeat(8, axis=2)
    rng = np.random.default_rng(1 if split == "train" else 2)
    labels = rng.integers(0, 10, size=SYNTHETIC_SIZES[split])
    images = prototypes[labels] + rng.normal(0, 24, size=(len(labels), 32, 32, 3))
    return images.clip(0, 255).astype(np.uint8), labels.astype(np.int64)


def normalize(images: torch.Tensor) -> torch.Tensor:
    """uint8 (B, 3, 32, 32) -> float, standardised per channel."""
    mean = torch.tensor(MEAN, device=images.device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=images.device).view(1, 3, 1, 1)
    return (images.float() / 255 - mean) / std


def augment_batch(images: torch.Tensor, ids: torch.Tensor, epoch: int, seed: int) -> torch.Tensor:
    """Random crop (reflect padding CROP_PADDING) and horizontal flip for a whole batch, on its device.

    The randomness is a hash of (sample id, epoch, seed) rather than a generator's state, so an
    image gets the same crop and flip whichever rank sees it and however many ranks there are:
    that is what lets N-process DDP reproduce a single-process run exactly, and a resumed run
    reproduce an uninterrupted one.
    """
    h = mix32(mix32(ids.long() * 9973 + epoch * 7919 + seed * 104729))
    pad = CROP_PADDING
    flip, dx, dy = (h & 1).bool(), (h >> 1) % (2 * pad + 1), (h >> 5) % (2 * pad + 1)
    x = normalize(images)
    x = torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)
    x = F.pad(x, (pad, pad, pad, pad), mode="reflect")
    offsets = torch.arange(32, device=x.device)
    rows, cols = (dy[:, None] + offsets)[:, :, None], (dx[:, None] + offsets)[:, None, :]
    batch = torch.arange(len(x), device=x.device)[:, None, None]
    return x[batch, :, rows, cols].permute(0, 3, 1, 2)  # (B, 32, 32, 3) -> (B, 3, 32, 32)


def mix32(h: torch.Tensor) -> torch.Tensor:
    """An integer hash round (from splitmix/murmur finalisers) that stays inside int64."""
    h = (h ^ (h >> 16)) & 0xFFFFFFFF
    return (h * 0x45D9F3B) & 0xFFFFFFFF
