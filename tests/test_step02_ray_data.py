"""Step 02 fed by Ray Data: the same training, reading a Ray Dataset on a two-node Ray cluster."""
import json
from pathlib import Path

import ray.train
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from common import load_data
from conftest import load_script

RAY_DATA = "02-ray-train-ddp/train_ray_ddp_with_ray_data.py"


def test_each_worker_reads_a_disjoint_shard_in_a_new_order_every_epoch(ray_driver, tmp_path):
    """What the script's docstring promises of train_dataset() (its dataset) under Ray Train's split."""
    def record_ids_per_epoch(config):  # nested: shipped to the workers by value, not as a test-module import
        """In each worker: two epochs of sample ids from its stream, read as the script reads it."""
        rank, shard = ray.train.get_context().get_world_rank(), ray.train.get_dataset_shard("train")
        # The same shuffle-buffer seed both epochs: any new order comes from the dataset (its blocks), not from here.
        epochs = [[i for batch in shard.iter_torch_batches(batch_size=16, drop_last=True, local_shuffle_buffer_size=64,
                                                            local_shuffle_seed=0) for i in batch["id"].tolist()]
                  for _ in range(2)]
        (Path(config["out"]) / f"rank{rank}.json").write_text(json.dumps(epochs))

    TorchTrainer(record_ids_per_epoch, train_loop_config={"out": str(tmp_path)},
                 datasets={"train": load_script(RAY_DATA).train_dataset(load_data("synthetic", ""), seed=0)},
                 scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(storage_path=str(tmp_path))).fit()
    (a0, a1), (b0, b1) = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    for a, b in ((a0, b0), (a1, b1)):
        assert len(a) == len(b) > 0.45 * 4096 and not set(a) & set(b)  # equal halves, disjoint, no image twice
        assert len(set(a)) == len(a) and len(set(b)) == len(b)
    assert a0 != a1 and b0 != b1  # a new order every epoch


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
