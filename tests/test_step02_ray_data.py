"""Step 02 fed by Ray Data: the same training, reading a Ray Dataset on a two-node Ray cluster."""
import json
import sys
from pathlib import Path

import pytest
import ray
import ray.train

from common.data import augment_batch, load_data
from common.data import TRAIN_SIZES
from common.model import build_model
from checks import assert_sane_summary, best_epoch, checkpoint_weights, latest_ray_checkpoint, load_script
from conftest import SMOKE, parse_only, two_node_cluster
from early import takes

RAY_DATA = "02-ray-train-ddp/train_ray_ddp_with_ray_data.py"


def noting_ids(folder: Path):
    """augment_batch, noting every sample id it gets in a file per worker (rank<r>.jsonl, a line per batch: the
    epoch and the ids). Shipped to the workers with train_func, by value."""
    def augment_and_note(images, ids, epoch, seed):
        with open(f"{folder}/rank{ray.train.get_context().get_world_rank()}.jsonl", "a") as notes:
            notes.write(json.dumps([epoch, ids.tolist()]) + "\n")
        return augment_batch(images, ids, epoch, seed)
    return augment_and_note


def noted_ids(folder: Path) -> dict:
    """{(rank, epoch): the ids in the order trained}, from noting_ids's files."""
    seen = {}
    for rank in (0, 1):
        for line in (folder / f"rank{rank}.jsonl").read_text().splitlines():
            epoch, ids = json.loads(line)
            seen.setdefault((rank, epoch), []).extend(ids)
    return seen


@takes(80)  # the full suite: 42, 57 and 58 s (AMD EPYC Zen 5, 2026-11-28); 72 and 76 s (AMD EPYC Zen 4, 2026-12-04)
def whole_epoch(folder: Path, lane) -> dict:
    """The variant as its command line runs it, on a cluster of its own (two_node_cluster): its main() in this run's
    own process, where its ray.init starts the job with its runtime_env and worker setup hook (on the test cluster,
    from the test process, they would not be applied), for one whole epoch of the synthetic set (no
    --steps-per-epoch), on 2 workers, every sample id noted (noting_ids)."""
    cluster = two_node_cluster()
    script = load_script(RAY_DATA)
    script.augment_batch = noting_ids(folder)
    flags = [flag for flag in SMOKE if flag not in ("--steps-per-epoch", "6", "--epochs", "2")]
    sys.argv = [RAY_DATA, *flags, "--epochs", "1", "--num-workers", "2", "--address", cluster.address,
                "--checkpoint-dir", str(folder / "runs")]
    try:
        script.main()
    finally:
        cluster.shutdown()
    return noted_ids(folder)


@pytest.mark.early(run=whole_epoch)
def test_over_a_whole_epoch_the_workers_shards_are_disjoint_and_cover_the_training_set(early_run):
    """Ray Train's split of the dataset, read by the variant's own loop for a whole epoch: each worker gets half the
    images, none twice, none that the other gets, and together every image of the set."""
    a, b = early_run[0, 0], early_run[1, 0]
    assert len(a) == len(b) == TRAIN_SIZES["synthetic"] // 2
    assert len(set(a)) == len(a) and len(set(b)) == len(b) and not set(a) & set(b)
    assert set(a) | set(b) == set(range(TRAIN_SIZES["synthetic"]))


@pytest.mark.smoke
def test_it_trains_on_both_nodes_each_worker_on_a_disjoint_shard_in_a_new_order_every_epoch(cluster_driver,
                                                                                          main_summary, tmp_path,
                                                                                          monkeypatch):
    """The script's main() on the two-node test cluster, as its command line runs it (in this process, already the
    cluster's driver: the smoke tier's run of the variant), SMOKE's 2 epochs of 6 steps on 2 workers, every sample
    id that reaches augment_batch noted per worker and epoch. It trains on both nodes and calls its best checkpoint
    by that epoch's accuracy, a checkpoint that loads. The two workers never share an image, none sees one twice in
    an epoch, both train on as many, and each sees a new order every epoch."""
    script = load_script(RAY_DATA)
    monkeypatch.setattr(script, "augment_batch", noting_ids(tmp_path))
    summary, stdout = main_summary(RAY_DATA, *SMOKE, "--num-workers", "2", "--address", cluster_driver,
                                   "--checkpoint-dir", str(tmp_path / "runs"), module=script)
    assert_sane_summary(summary, "ray_ddp_data", world_size=2)
    assert summary["nodes"] == 2
    best = best_epoch(summary["history"])
    assert f"(epoch {best['epoch']}, test acc {best['test_accuracy']:.2%})" in stdout
    build_model("tiny").load_state_dict(checkpoint_weights(latest_ray_checkpoint(tmp_path / "runs")))

    seen = noted_ids(tmp_path)
    _, args = parse_only(RAY_DATA, *SMOKE)
    per_worker = args.steps_per_epoch * args.batch_size // 2
    for epoch in (0, 1):
        a, b = seen[0, epoch], seen[1, epoch]
        assert len(a) == len(b) == per_worker and not set(a) & set(b)  # as many each, disjoint
        assert len(set(a)) == len(a) and len(set(b)) == len(b)  # no image twice in an epoch
    assert seen[0, 0] != seen[0, 1] and seen[1, 0] != seen[1, 1]  # a new order every epoch


def test_the_block_order_is_new_every_epoch_and_the_same_for_the_same_seed(ray_driver):
    """train_dataset's randomize_block_order draws a new order at each execution (an epoch), from the seed
    (RandomSeedConfig): a plain seed would repeat epoch 1's block order every epoch, and the workers' shuffle buffers
    only mix rows of a few neighbouring blocks. Read here whole, block by block: no buffer, no split between workers."""
    data = load_data("synthetic", "")

    def block_order(dataset) -> list[int]:
        return [int(block["id"][0]) for block in dataset.iter_batches(batch_size=None)]

    dataset = load_script(RAY_DATA).train_dataset(data, seed=0)
    first, second = block_order(dataset), block_order(dataset)
    assert len(first) > 4 and sorted(first) == sorted(second) and first != second
    assert block_order(load_script(RAY_DATA).train_dataset(data, seed=0)) == first
