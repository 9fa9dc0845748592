"""Step 03: FSDP1 on a two-node Ray cluster of CPUs (gloo). Ray's prepare_model refuses "fsdp" without CUDA,
so on CPUs the script wraps the model in FullyShardedDataParallel itself, as prepare_model does on GPUs."""
import pytest
import torch

from common.data import load_data
from common.model import build_model
from common.training import evaluate
from checks import (assert_half_the_state_per_rank, assert_same_weights, assert_sane_summary, assert_short_last_line,
                    checkpoint_weights, collectives_per_step, final_json, latest_ray_checkpoint, load_script,
                    profile_summary, resumed_after)
from conftest import ACCUMULATE, EVAL_IMAGES, PROFILE, SMOKE, ray_script

RAY_FSDP = "03-ray-train-fsdp/train_ray_fsdp.py"


@pytest.fixture(scope="module")
def fsdp1_run(ray_cluster, tmp_path_factory):
    """One step-03 run whose last worker crashes after epoch 1: Ray restarts the worker group, which loads the
    full-state checkpoint back into the sharded model. One Ray run checks both the sharding and the restart: had
    the restart lost any state, the run would not end with DDP's weights."""
    storage = tmp_path_factory.mktemp("fsdp1")
    result = ray_script(RAY_FSDP, ray_cluster, storage, *ACCUMULATE, *PROFILE, "--fail-at-epoch", "1",
                        "--max-failures", "1")
    return final_json(result), storage, result


def test_fsdp1_trains_on_cpus_and_says_how_it_wrapped_the_model(fsdp1_run):
    summary, storage, result = fsdp1_run
    assert_sane_summary(summary, "ray_fsdp", world_size=2)
    assert_short_last_line(result.stdout, summary, latest_ray_checkpoint(storage).parent)
    assert summary["nodes"] == 2 and summary["device"] == "cpu"
    assert result.stdout.splitlines()[0] == ("FSDP1: on CPUs, FullyShardedDataParallel by hand: "
                                             "prepare_model refuses fsdp without CUDA")


def test_fsdp1_holds_half_the_state_per_rank(fsdp1_run):
    assert_half_the_state_per_rank(fsdp1_run[0])  # each rank's slice of FSDP1's flat parameters


def test_fsdp1_equals_ddp_with_the_same_seed_and_global_batch(fsdp1_run, ray_run):
    """Bit for bit, crash and restart included: with 2 ranks, FSDP1's reduce-scatter and DDP's all-reduce add the
    same two gradients, and AdamW updates each element alike in FSDP1's flat tensors or DDP's separate ones."""
    fsdp1, ddp = fsdp1_run[0], ray_run[0]
    assert [h["test_accuracy"] for h in fsdp1["history"]] == [h["test_accuracy"] for h in ddp["history"]]
    assert [h["train_loss"] for h in fsdp1["history"]] == pytest.approx([h["train_loss"] for h in ddp["history"]])
    assert_same_weights(checkpoint_weights(latest_ray_checkpoint(ray_run[1])),
                        checkpoint_weights(latest_ray_checkpoint(fsdp1_run[1])))


def test_full_state_checkpoint_reproduces_the_accuracy_on_one_device(fsdp1_run):
    model = build_model("tiny")
    model.load_state_dict(checkpoint_weights(latest_ray_checkpoint(fsdp1_run[1])))  # plain keys: no FSDP prefixes
    data = load_data("synthetic", "", EVAL_IMAGES)  # the images the run evaluated (SMOKE's --eval-images)
    correct, counted = evaluate(model, data.test_images, data.test_labels, torch.device("cpu")).tolist()
    assert counted == EVAL_IMAGES and correct / counted == fsdp1_run[0]["test_accuracy"]


def test_crashed_worker_restarts_from_the_last_checkpoint(fsdp1_run):
    """The restarted group goes on from epoch 1's checkpoint, not from scratch; test_fsdp1_equals_ddp checks that
    it ends with the uninterrupted weights (DDP's, bit for bit). A --resume run loads the checkpoint the same way,
    through ray.train.get_checkpoint() in a fresh worker group: step 04's tests run --resume itself."""
    summary, _, result = fsdp1_run
    assert resumed_after(result.stdout) == [1]
    assert result.stdout.count("epoch 1/2 |") == 1 and result.stdout.count("epoch 2/2 |") == 1
    assert [h["epoch"] for h in summary["history"]] == [1, 2]


def test_one_worker_is_refused_in_one_line(tmp_path, run_main):
    assert run_main(RAY_FSDP, *SMOKE, "--num-workers", "1", "--checkpoint-dir", str(tmp_path)) == (
        2, ["error: --num-workers 1 shards nothing: sharding needs 2 or more workers (with one GPU: --num-workers 2 "
            "--no-gpu shards over CPU workers)"])


def test_fsdp1_gathers_each_unit_and_reduce_scatters_once_per_optimizer_step(fsdp1_run):
    """The profiler's count, per rank and optimizer step of 2 micro-batches: all-gathers of the units' weights, and
    one reduce-scatter per unit (6 blocks and the root), not one per micro-batch: no_sync() skipped the first."""
    units = len(build_model("tiny").encoder.layers) + 1
    for calls in collectives_per_step(profile_summary(fsdp1_run[1])):
        assert calls["reduce_scatter"] == units and calls["all_gather"] > 0 and "all_reduce" not in calls


@pytest.mark.parametrize("device, world_size, wrapped_by", [("cuda", 2, "prepare_model"), ("cuda", 1, "hand"),
                                                              ("cpu", 2, "hand"), ("cpu", 1, "hand")])
def test_fsdp1_is_wrapped_by_hand_wherever_prepare_model_would_not_shard(device, world_size, wrapped_by,
                                                                        monkeypatch):
    """On a GPU in local mode (a world of one) prepare_model returns the model unwrapped, which has no no_sync() for
    gradient accumulation: the script wraps it by hand there, as on CPUs, which prepare_model refuses."""
    step03 = load_script(RAY_FSDP)
    monkeypatch.setattr(step03.ray.train.torch, "prepare_model", lambda model, **kwargs: ("prepare_model", model))
    monkeypatch.setattr(step03, "FullyShardedDataParallel", lambda model, **kwargs: ("hand", model))
    model = torch.nn.Linear(2, 2)
    wrapped = step03.shard_fsdp1(model, torch.device(device), world_size, {})
    assert wrapped == (wrapped_by, model)
