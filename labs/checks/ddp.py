"""Lab 01's checks: main() in 2 processes against main() in 1. Each process runs the lab under watch: which
images each step trained (augment_batch sees their ids), in what process group, with what final weights, and
what each rank's evaluation scored."""
import torch
import torch.distributed as dist

from common import augment_batch, build_model, evaluate
from labs.harness import Outcome, RunFailed, crashed, lab_args, load_lab, run_groups

SAME_TRAINING = "2 processes form one group and train what 1 process trains (weights and loss)"
NEW_SHARDS = "each epoch, the ranks train disjoint shards of the data, in a new order"
GLOBAL_ACCURACY = "the reported accuracy is the whole test set's, not one rank's shard's"
# 2 ranks of 16 images sum their gradients in another order than 1 process of 32: the losses end this close.
LOSS_TOLERANCE = 1e-4


def run(lab_file) -> list:
    try:
        [alone], pair = run_groups(lab_file, [(f"{__name__}:watched_main", 1), (f"{__name__}:watched_main", 2)])
    except RunFailed as error:
        return crashed([SAME_TRAINING, NEW_SHARDS, GLOBAL_ACCURACY], str(error))
    return [same_training(alone, pair), new_shards(pair), global_accuracy(pair)]


def watched_main(lab_file) -> dict:
    """In each process: the lab's main(), with the common functions it calls recording what they see."""
    lab = load_lab(lab_file)
    steps, models, tallies = [], [], []

    def watched_augment_batch(images, ids, epoch, seed):
        group = dist.get_world_size() if dist.is_initialized() else 1
        steps.append(dict(epoch=epoch, ids=ids.tolist(), group=group))
        return augment_batch(images, ids, epoch, seed)

    def watched_build_model(preset):
        models.append(build_model(preset))
        return models[-1]

    def watched_evaluate(*args, **kwargs):
        tally = evaluate(*args, **kwargs)
        tallies.append(tally.tolist())  # before any all-reduce changes it
        return tally

    lab.augment_batch, lab.build_model, lab.evaluate = watched_augment_batch, watched_build_model, watched_evaluate
    history = lab.main(lab_args())
    return dict(history=history, steps=steps, weights=models[0].state_dict(), tallies=tallies)


def same_training(alone: dict, pair: list[dict]):
    hint = None
    groups = {step["group"] for rank in pair for step in rank["steps"]}
    if groups != {2}:
        failure = f"the 2 processes trained in process groups of {sorted(groups)} (each alone), not one group of 2"
        hint = ("torchrun only starts the processes and describes the group in their environment: each process "
                "must join it, and take its rank and the world size from it")
    elif not all(torch.equal(pair[0]["weights"][k], pair[1]["weights"][k]) for k in pair[0]["weights"]):
        failure = "rank 0 and rank 1 ended with different weights"
        hint = "each rank's gradients come from its own images: something must average them over the ranks in backward"
    else:
        failure = differing_losses(alone["history"], pair[0]["history"])
        hint = ("2 ranks of 16 images must train what 1 process does with batches of 32: each rank its own half of "
                "every batch, and the loss reported as the mean over every rank's images")
    return Outcome(SAME_TRAINING, failure, hint)


def differing_losses(alone: list[dict], pair: list[dict]) -> str | None:
    for one, two in zip(alone, pair, strict=True):
        if abs(one["train_loss"] - two["train_loss"]) > LOSS_TOLERANCE:
            return (f"epoch {one['epoch']}: 2 processes reported train loss {two['train_loss']:.5f}, "
                    f"1 process {one['train_loss']:.5f}")
    return None


def new_shards(pair: list[dict]):
    epochs = sorted({step["epoch"] for step in pair[0]["steps"]})
    seen = [[[i for step in rank["steps"] if step["epoch"] == epoch for i in step["ids"]] for epoch in epochs]
            for rank in pair]
    for epoch, (rank0, rank1) in enumerate(zip(*seen, strict=True)):
        if set(rank0) & set(rank1):
            shared = len(set(rank0) & set(rank1))
            return Outcome(NEW_SHARDS, f"in epoch {epoch + 1}, rank 0 and rank 1 both trained {shared} of the same "
                                       "images", "a sampler that knows the rank and the world size gives each rank "
                                                 "its own shard of the data")
    if any(epoch == rank[0] for rank in seen for epoch in rank[1:]):
        return Outcome(NEW_SHARDS, "every epoch repeated epoch 1's order",
                       "a distributed sampler shuffles with its seed plus the epoch: it only knows the epoch if told")
    return Outcome(NEW_SHARDS, None, "")


def global_accuracy(pair: list[dict]):
    reported = pair[0]["history"][-1]["test_accuracy"]
    last_tallies = [rank["tallies"][-1] for rank in pair]  # [correct, counted] each rank scored in the last epoch
    correct, counted = (sum(tally[i] for tally in last_tallies) for i in (0, 1))
    own_correct, own_counted = last_tallies[0]
    failure = None
    if abs(reported - correct / counted) > 1e-9:
        failure = (f"rank 0 reported {reported:.2%} (its own {own_counted} test images give "
                   f"{own_correct / own_counted:.2%}); all {counted} images give {correct / counted:.2%}")
    return Outcome(GLOBAL_ACCURACY, failure, "each rank scores only its shard of the test set: add up every rank's "
                                             "[correct, counted] before dividing")
