"""Lab 01's checks: main() in 2 processes against the recipe in 1 process on whole batches (labs.reference), both in
float64. Each rank runs the lab under watch (the functions of common/ it calls, replaced where they are defined): which
images each step trained and in what process group (augment_batch sees their ids), the gradients of every optimizer step
and the final weights (labs.patching.watch_training), and what each rank's evaluation scored."""
import itertools
import os

import torch
import torch.distributed as dist

from common.data import augment_batch, load_data
from common.training import evaluate
from labs import reference
from labs.harness import lab_args, load_lab
from labs.outcome import Outcome, crashed
from labs.patching import watch_training
from labs.ranks import RunFailed, run_ranks

ONE_GROUP = "2 processes join one process group, and leave it when training ends"
SHARDS = "each step, the ranks train disjoint halves of 1 process's batch, shuffled with --seed, anew each epoch"
SAME_TRAINING = "every step's gradients, and the final weights, are 1 process's: averaged over the ranks"
GLOBAL_LOSS = "the reported train loss is the mean over every rank's images"
GLOBAL_ACCURACY = "the reported accuracy is the whole test set's, not one rank's shard's"
CHECKS = [ONE_GROUP, SHARDS, SAME_TRAINING, GLOBAL_LOSS, GLOBAL_ACCURACY]


def run(lab_file) -> list:
    try:
        alone, pair = run_ranks(f"{__name__}:watched_main", lab_file, 2, lambda: reference.recipe(lab_args().epochs))
    except RunFailed as error:
        return crashed(CHECKS, str(error))
    return [one_group(pair), shards(alone, pair), same_training(alone, pair), global_loss(alone, pair),
            global_accuracy(pair)]


def watched_main(lab_file, *flags: str, float64: bool = True) -> dict:
    """In each process: the lab's main(), with the common functions it calls recording what they see (its model in
    double precision, as the reference's, unless float64 is False); then this rank's share of the test set scored
    with its final weights, as every rank must score it."""
    steps, tallies = [], []

    def watched_augment_batch(images, ids, epoch, seed):
        group = dist.get_world_size() if dist.is_initialized() else 1
        steps.append(dict(epoch=epoch, ids=ids.tolist(), group=group))
        return augment_batch(images, ids, epoch, seed)

    def watched_evaluate(*args, **kwargs):
        tally = evaluate(*args, **kwargs)
        tallies.append(tally.tolist())  # before any all-reduce changes it
        return tally

    watched = watch_training(float64, augment_batch=watched_augment_batch, evaluate=watched_evaluate)
    args = lab_args(*flags)
    history = load_lab(lab_file).main(args)
    group_left = not dist.is_initialized()
    data = load_data(args.data, args.data_dir, args.eval_images)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    model = watched["models"][0]
    own_share = evaluate(model, data.test_images, data.test_labels, torch.device("cpu"), rank, world_size)
    return dict(history=history, steps=steps, gradients=watched["gradients"], sharded=watched["sharded"],
                weights=model.state_dict(), optimizer=watched["optimizers"][0].state_dict(), tallies=tallies,
                own_share=own_share.tolist(), group_left=group_left, rank=rank)


def one_group(pair: list[dict]):
    groups = sorted({step["group"] for rank in pair for step in rank["steps"]})
    failure, hint = None, ""
    if groups != [2]:
        failure = f"the 2 processes trained in process groups of {groups} (each alone), not one group of 2"
        hint = ("torchrun only starts the processes and describes the group in their environment: each process "
                "must join it, and take its rank and the world size from it")
    elif not all(rank["group_left"] for rank in pair):
        failure = "the process group was still open when main() returned"
        hint = ("leave the group when training ends (destroy_process_group, in a finally: also when training "
                "fails), so that no rank exits while another still waits on it")
    return Outcome(ONE_GROUP, failure, hint)


def shards(alone: dict, pair: list[dict]):
    """The ranks' images, step by step, against the reference's batches (seed + epoch's permutation)."""
    epochs = sorted({step["epoch"] for step in alone["steps"]})
    trained = [[[step["ids"] for step in rank["steps"] if step["epoch"] == epoch] for epoch in epochs]
               for rank in pair]
    for epoch, (rank0, rank1) in enumerate(zip(*trained, strict=True)):
        shared = {i for batch in rank0 for i in batch} & {i for batch in rank1 for i in batch}
        if shared:
            return Outcome(SHARDS, f"in epoch {epoch + 1}, rank 0 and rank 1 both trained {len(shared)} of the same "
                                   "images", "a sampler that knows the rank and the world size gives each rank "
                                             "its own shard of the data")
    if len(epochs) > 1 and all(rank[1] == rank[0] for rank in trained):
        return Outcome(SHARDS, "epoch 2 repeated epoch 1's order",
                       "a distributed sampler shuffles with its seed plus the epoch: it knows the epoch only if told")
    batches = [sorted(rank0 + rank1) for epoch in zip(*trained, strict=True)
               for rank0, rank1 in zip(*epoch, strict=True)]
    expected = [sorted(step["ids"]) for step in alone["steps"]]
    if batches != expected:
        step = next(i for i, (a, b) in enumerate(itertools.zip_longest(batches, expected)) if a != b)
        return Outcome(SHARDS, f"step {step + 1}'s images are not those 1 process shuffling with --seed "
                               f"{lab_args().seed} trains in that step ({len(batches)} steps trained)",
                       "every rank's sampler must shuffle with the run's seed (the same on every rank: they split "
                       "one permutation), not its own default")
    return Outcome(SHARDS, None, "")


def same_training(alone: dict, pair: list[dict]):
    match reference.first_difference(alone, pair, reference.TOLERANCE):
        case "ranks differ", step, _:
            return Outcome(SAME_TRAINING, f"step {step}: rank 0's and rank 1's gradients differ",
                           "each rank's gradients come from its own images: something must average them over the "
                           "ranks in backward, before the optimizer steps")
        case "factor", step, ratio:
            return Outcome(SAME_TRAINING, f"step {step}: the ranks' gradients are {ratio:.2f} times 1 process's",
                           "the ranks' gradients must be averaged, not summed: AdamW hides the factor in the "
                           "weights, a learning-rate schedule or SGD would not")
        case "differ", step, difference:
            return Outcome(SAME_TRAINING, f"step {step}: the ranks' gradients differ from 1 process's on the whole "
                                          f"batch by {difference:.1%}",
                           "the whole batch's gradient is the mean of the ranks' gradients of their halves")
        case "steps", steps, _:
            return Outcome(SAME_TRAINING, f"the ranks took {steps} optimizer steps; 1 process takes "
                                          f"{len(alone['steps'])}", "one optimizer step per batch, on every rank")
    trained = {k: v - alone["initial"][k] for k, v in alone["weights"].items()}
    for rank, watched in enumerate(pair):
        moved = {k: v - alone["initial"][k] for k, v in watched["weights"].items()}
        if (difference := reference.relative_difference(moved, trained)) > reference.TOLERANCE:
            return Outcome(SAME_TRAINING, f"rank {rank}'s weights moved {difference:.1%} away from where 1 "
                                          "process's moved in training",
                           "every rank must start from the same weights and take the same steps")
    return Outcome(SAME_TRAINING, None, "")


def global_loss(alone: dict, pair: list[dict]):
    for one, two in zip(alone["history"], pair[0]["history"], strict=False):
        if abs(one["train_loss"] - two["train_loss"]) > reference.TOLERANCE:
            return Outcome(GLOBAL_LOSS, f"epoch {one['epoch']}: rank 0 reported train loss {two['train_loss']:.5f}, "
                                        f"1 process {one['train_loss']:.5f}",
                           "each rank's loss is its own images' mean: the epoch's loss is the mean over every "
                           "rank's, summed over the ranks and divided by their number")
    return Outcome(GLOBAL_LOSS, None, "")


def global_accuracy(pair: list[dict]):
    reported = pair[0]["history"][-1]["test_accuracy"]
    correct, counted = (sum(rank["own_share"][i] for rank in pair) for i in (0, 1))
    own_correct, own_counted = pair[0]["tallies"][-1]  # what rank 0's evaluation scored in the last epoch
    failure = None
    if abs(reported - correct / counted) > 1e-9:
        failure = (f"rank 0 reported {reported:.2%} (its own {own_counted} test images give "
                   f"{own_correct / own_counted:.2%}); all {counted} images give {correct / counted:.2%}")
    return Outcome(GLOBAL_ACCURACY, failure, "each rank scores only its shard of the test set, and the shards differ "
                                             "in size: add up every rank's [correct, counted] before dividing")
