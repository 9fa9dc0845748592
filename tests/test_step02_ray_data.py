"""Step 02 fed by Ray Data: the same training, reading a Ray Dataset on a two-node Ray cluster."""
import json

import pytest
import ray
import ray.train

from common.data import augment_batch, load_data
from common.model import build_model
from checks import assert_sane_summary, best_epoch, checkpoint_weights, latest_ray_checkpoint, load_script
from conftest import SMOKE, parse_only

RAY_DATA = "02-ray-train-ddp/train_ray_ddp_with_ray_data.py"


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

    def augment_and_note(images, ids, epoch, seed):  # shipped to the workers with train_func, by value
        with open(f"{tmp_path}/rank{ray.train.get_context().get_world_rank()}.jsonl", "a") as notes:
            notes.write(json.dumps([epoch, ids.tolist()]) + "\n")
        return augment_batch(images, ids, epoch, seed)

    monkeypatch.setattr(script, "augment_batch", augment_and_note)
    summary, stdout = main_summary(RAY_DATA, *SMOKE, "--num-workers", "2", "--address", cluster_driver,
                                   "--checkpoint-dir", str(tmp_path / "runs"), module=script)
    assert_sane_summary(summary, "ray_ddp_data", world_size=2)
    assert summary["nodes"] == 2
    best = best_epoch(summary["history"])
    assert f"(epoch {best['epoch']}, test acc {best['test_accuracy']:.2%})" in stdout
    build_model("tiny").load_state_dict(checkpoint_weights(latest_ray_checkpoint(tmp_path / "runs")))

    seen = {}  # (rank, epoch): the ids in the order trained
    for rank in (0, 1):
        for line in (tmp_path / f"rank{rank}.jsonl").read_text().splitlines():
            epoch, ids = json.loads(line)
            seen.setdefault((rank, epoch), []).extend(ids)
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
