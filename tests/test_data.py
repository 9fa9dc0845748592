"""The data path: cache format, first download under concurrency, clear errors, sharding, augmentation."""
import multiprocessing
import time
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch

from common.data import augment_batch, load_data, normalize
from common.model import build_model
from common.reporting import peak_memory_mb
from common.training import evaluate, predict
from common.data import CROP_PADDING
from common import data as data_module
from checks import load_script
from conftest import parse_only

DDP = "01-vanilla-pytorch-ddp/train_ddp.py"


class FakeCIFAR10:
    """Stands in for torchvision.datasets.CIFAR10: no network, counts downloads in a file."""
    sizes = {True: 60, False: 20}

    def __init__(self, root, train, download):
        with open(f"{root}/downloads.log", "a") as log:
            log.write(f"{'train' if train else 'test'}\n")
        time.sleep(0.5)  # long enough for the other processes to pile up on the lock
        rng = np.random.default_rng(int(train))
        self.data = rng.integers(0, 256, size=(self.sizes[train], 32, 32, 3), dtype=np.uint8)
        self.targets = list(rng.integers(0, 10, size=self.sizes[train]))


@pytest.fixture
def fake_torchvision(monkeypatch):
    monkeypatch.setattr("torchvision.datasets.CIFAR10", FakeCIFAR10)


def test_first_load_downloads_then_reads_the_cache(tmp_path, fake_torchvision):
    first = load_data("cifar10", tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.npz")) == ["cifar10_test.npz", "cifar10_train.npz"]
    second = load_data("cifar10", tmp_path)  # from the cache: no second download
    assert (tmp_path / "downloads.log").read_text().split() == ["train", "test"]
    assert torch.equal(first.train_images, second.train_images) and torch.equal(first.test_labels, second.test_labels)
    assert first.train_images.shape == (60, 3, 32, 32) and first.train_images.dtype == torch.uint8
    assert first.train_labels.dtype == torch.int64
    # NCHW tensor holds exactly the NHWC arrays of the cache.
    with np.load(tmp_path / "cifar10_train.npz") as cache:
        assert np.array_equal(first.train_images.permute(0, 2, 3, 1).numpy(), cache["images"])


def load_in_child(directory, queue):
    # numpy only: torch's thread pools do not survive fork()
    (train_images, _), _ = data_module.load_cifar10_cache(directory)
    queue.put(int(train_images.sum()))


def test_concurrent_first_loads_download_once(tmp_path, fake_torchvision):
    ctx = multiprocessing.get_context("fork")  # children inherit the fake torchvision
    queue = ctx.Queue()
    children = [ctx.Process(target=load_in_child, args=(tmp_path, queue)) for _ in range(3)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    assert (tmp_path / "downloads.log").read_text().split() == ["train", "test"]
    assert len({queue.get() for _ in children}) == 1  # everyone read the same data


def test_offline_without_cache_gives_a_clear_error(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr("torchvision.datasets.CIFAR10", offline)
    with pytest.raises(SystemExit, match=r"could not download CIFAR-10 .*offline\? .*--data-dir.*--data synthetic"):
        load_data("cifar10", tmp_path)


def test_corrupt_cache_gives_a_clear_error(tmp_path):
    data_module.write_cache(tmp_path / "cifar10_train.npz", np.zeros((4, 32, 32, 3), np.uint8), np.zeros(4))
    (tmp_path / "cifar10_test.npz").write_bytes(b"not a zip file")
    with pytest.raises(SystemExit, match=r"cifar10_test.npz is corrupt .*delete it"):
        load_data("cifar10", tmp_path)


def test_cache_of_the_wrong_shape_gives_a_clear_error(tmp_path):
    for split in ("train", "test"):
        data_module.write_cache(tmp_path / f"cifar10_{split}.npz", np.zeros((4, 28, 28), np.uint8), np.zeros(4))
    with pytest.raises(SystemExit, match=r"expected \(N, 32, 32, 3\) uint8"):
        load_data("cifar10", tmp_path)


def test_validation_split_holds_out_the_last_training_images_and_never_the_test_set(tmp_path, monkeypatch):
    monkeypatch.setattr(data_module, "VALIDATION_SIZE", 15)
    for split, n in (("train", 60), ("test", 20)):
        images = np.random.default_rng(n).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        data_module.write_cache(tmp_path / f"cifar10_{split}.npz", images, np.arange(n) % 10)
    full, val = load_data("cifar10", tmp_path), load_data("cifar10-val", tmp_path)
    assert torch.equal(val.train_images, full.train_images[:45])
    assert torch.equal(val.test_images, full.train_images[45:])
    assert "45 train / 15 validation images" in val.description


def test_eval_images_keeps_the_first_n_and_rejects_impossible_counts():
    data = load_data("synthetic", "unused", eval_images=8)
    assert torch.equal(data.test_labels, load_data("synthetic", "unused").test_labels[:8])
    with pytest.raises(SystemExit, match=r"--eval-images 0 must be between 1 and 1024"):
        load_data("synthetic", "unused", eval_images=0)


def test_synthetic_data_is_deterministic_and_balanced():
    a, b = load_data("synthetic", "unused"), load_data("synthetic", "unused")
    assert torch.equal(a.train_images, b.train_images) and torch.equal(a.test_labels, b.test_labels)
    assert a.train_images.shape[1:] == (3, 32, 32) and a.train_images.dtype == torch.uint8
    assert torch.bincount(a.train_labels, minlength=10).min() > len(a.train_labels) / 20
    assert not torch.equal(a.train_images[: len(a.test_images)], a.test_images)  # test is not a copy of train


class Loader(Exception):
    """Raised in place of the DataLoader that a step's train() builds: its sampler."""


def ddp_sampler(rank: int, world_size: int):
    """The sampler that step 01's DDP script builds for this rank (its own train(), stopped at its DataLoader)."""
    script = load_script(DDP)

    def loader(dataset, sampler, **options):
        raise Loader(sampler)

    script.DataLoader = loader
    _, args = parse_only(DDP, "--data", "synthetic", "--model", "tiny", "--batch-size", str(8 * world_size))
    with pytest.raises(Loader) as built:
        script.train(args, rank, world_size, master_process=rank == 0, device=torch.device("cpu"))
    return built.value.args[0]


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_ddp_scripts_shards_are_disjoint_cover_the_set_and_reshuffle(world_size):
    """As the script's loop uses its sampler (set_epoch every epoch). That the ranks' batches together are the single
    machine's batches is proved by the runs themselves: test_step01's DDP run ends with one process's weights."""
    samplers = [ddp_sampler(rank, world_size) for rank in range(world_size)]
    size = len(load_data("synthetic", "unused").train_labels)
    orders = {}
    for epoch in (0, 1):
        shards = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            shards.append(list(sampler))
        flat = [i for shard in shards for i in shard]
        assert len(flat) == len(set(flat)) == size // world_size * world_size  # disjoint, nothing padded
        orders[epoch] = shards
    assert orders[0] != orders[1]  # set_epoch reshuffles


def test_augmentation_is_keyed_on_sample_epoch_and_seed():
    images = load_data("synthetic", "unused").train_images[:64]
    ids = torch.arange(64)
    out = augment_batch(images, ids, epoch=0, seed=0)
    assert out.shape == (64, 3, 32, 32) and out.dtype == torch.float32
    # Splitting a batch across ranks changes nothing: the randomness belongs to the sample.
    halves = torch.cat([augment_batch(images[:32], ids[:32], 0, 0), augment_batch(images[32:], ids[32:], 0, 0)])
    assert torch.equal(out, halves)
    assert torch.equal(out, augment_batch(images, ids, 0, 0))
    assert not torch.equal(out, augment_batch(images, ids, 1, 0))
    assert not torch.equal(out, augment_batch(images, ids, 0, 1))

def test_augmentation_leaves_about_one_image_in_every_crop_and_flip_combination_unchanged():
    images = load_data("synthetic", "unused").train_images
    out = augment_batch(images, torch.arange(len(images)), epoch=0, seed=0)
    unchanged = (out == normalize(images)).flatten(1).all(1).float().mean().item()
    combinations = (2 * CROP_PADDING + 1) ** 2 * 2  # crop offsets x flipped or not: 1 in 50 is the identity
    assert 0.5 / combinations < unchanged < 2 / combinations


def test_augmentation_is_a_crop_and_a_flip():
    image = torch.arange(3 * 32 * 32, dtype=torch.int64).reshape(1, 3, 32, 32).remainder(256).to(torch.uint8)
    reference = torch.nn.functional.pad(normalize(image), (4, 4, 4, 4), mode="reflect")
    for sample_id in range(20):
        out = augment_batch(image, torch.tensor([sample_id]), 0, 0)[0]
        windows = [reference[0, :, y:y + 32, x:x + 32] for y in range(9) for x in range(9)]
        assert any(torch.equal(out, w) or torch.equal(out, w.flip(2)) for w in windows)


@pytest.mark.parametrize("world_size", [1, 2, 3, 7])
def test_evaluation_counts_every_test_image_exactly_once(world_size):
    """Every rank's [correct, counted] over its shard (images rank::world_size), each image scored against its own
    label once. A random linear model predicts a class of its own for each image (an untrained tiny, with torchvision's
    zero head, predicts class 0 for all), and the labels make exactly the even-numbered images right: an image counted
    twice, skipped, or scored against another image's label changes the counts."""
    data = load_data("synthetic", "unused")
    images = data.test_images[:101]  # 101: no world size divides it
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
    with torch.no_grad():
        predicted = predict(model, images).argmax(1)
    assert len(predicted.unique()) > 2
    even = torch.arange(101) % 2 == 0
    labels = torch.where(even, predicted, (predicted + 1) % 10)  # right on even-numbered images only
    device = torch.device("cpu")
    assert evaluate(model, images, labels, device, batch_size=50).tolist() == [51, 101]
    for rank in range(world_size):
        shard = torch.arange(rank, 101, world_size)
        assert evaluate(model, images, labels, device, rank, world_size, batch_size=16).tolist() == [
            int(even[shard].sum()), len(shard)], rank


def test_evaluation_on_fewer_images_than_ranks_counts_each_once_and_runs_as_many_forwards_on_every_rank():
    """--eval-images 2 on 4 ranks: ranks 2 and 3 have no image of their own, yet run the forward passes a sharded
    model needs from every rank (on a filler image they do not count)."""
    data = load_data("synthetic", "unused")
    images, labels = data.test_images[:2], data.test_labels[:2]
    forwards = []
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
    model.register_forward_hook(lambda module, args, output: forwards.append(len(output)))
    tallies = [evaluate(model, images, labels, torch.device("cpu"), rank, 4).tolist() for rank in range(4)]
    assert [counted for _, counted in tallies] == [1, 1, 0, 0]
    assert sum(correct for correct, _ in tallies) == evaluate(model, images, labels, torch.device("cpu"))[0]
    assert forwards[:8] == [1] * 8  # each rank: one image and its mirror


def test_evaluation_scores_the_mean_prediction_of_each_image_and_its_mirror():
    data = load_data("synthetic", "unused")
    images, labels = data.test_images[:64], data.test_labels[:64]
    torch.manual_seed(0)
    model = build_model("tiny").eval()
    torch.nn.init.normal_(model.heads.head.weight, std=0.1)  # torchvision starts it at zero: 0.1 for every class
    with torch.no_grad():
        probabilities = predict(model, images)
        plain, of_mirror = (model(normalize(x)).softmax(1) for x in (images, images.flip(3)))
        of_mirror_with_its_mirror = predict(model, images.flip(3))
    assert not torch.allclose(plain, of_mirror)  # the model tells an image from its mirror image
    assert torch.allclose(probabilities, (plain + of_mirror) / 2)
    assert torch.allclose(probabilities, of_mirror_with_its_mirror)  # so an image and its mirror score alike
    correct, counted = evaluate(model, images, labels, torch.device("cpu")).tolist()
    assert (correct, counted) == ((probabilities.argmax(1) == labels).sum().item(), 64)


def test_peak_memory_is_megabytes_on_linux_and_on_macos():
    """ru_maxrss counts kilobytes on Linux and bytes on macOS: the same peak must read the same megabytes."""
    from common.reporting import maxrss_units_per_mb

    assert 5 * 2**20 / maxrss_units_per_mb("darwin") == 5 * 1024 / maxrss_units_per_mb("linux") == 5
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    peak_kb = int(status["VmHWM"].split()[0])
    assert peak_memory_mb(torch.device("cpu")) == pytest.approx(peak_kb / 1024, rel=0.05)
