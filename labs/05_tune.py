"""Lab 05: a Ray Tune sweep as 05-ray-tune/tune_ray_ddp.py runs it: a search space, the ASHA scheduler, and trials
that each build a TorchTrainer, tuned on the validation split.

sweep() below runs its trials to the end, whatever they score, and tunes on the test set. The check reads
SEARCH_SPACE first, and runs no sweep until it passes; then it runs sweep() with 3 trials of 2 epochs (1 worker
each; the data a trial asks for is recorded, and synthetic images stand in for it, each split's its own, so nothing
downloads), and looks at the images the trials scored, at each of ASHA's decisions and at the best result Tune
returns:

    python -m labs.check 05

Write the TODOs (about 10 lines). A solution: labs/solutions/05_tune.py.
"""
import argparse
import itertools

import ray.train.torch
import ray.tune
import torch
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from ray.tune.integration.ray_train import TuneReportCallback  # noqa: F401 (yours to use)
from ray.tune.schedulers import ASHAScheduler  # noqa: F401 (yours to use)
from ray.tune.search import BasicVariantGenerator
from torch.utils.data import DataLoader

from common.data import augment_batch, load_data
from common.model import build_model
from common.training import evaluate, make_optimizer

# TODO 1: search lr from 5e-4 to 6e-3 and weight_decay from 0.01 to 0.3, each on a log scale (the ranges of step 05,
# around the recipe's 2e-3 and 0.05).
SEARCH_SPACE = {}
# A trial only drives its Ray Train run: a CPU held by the trial would be one its own worker waits for.
TRIAL_RESOURCES = {"cpu": 0, "memory": 512 * 2**20}


def sweep(args, storage: str) -> ray.tune.ResultGrid:
    """args.num_samples trials, one at a time; trial 0 trains the flags as given."""
    recipe = {key: getattr(args, key) for key in SEARCH_SPACE}
    search = BasicVariantGenerator(points_to_evaluate=[recipe], max_concurrent=1, random_state=args.seed)
    # TODO 2: after each trial's first epoch, stop those that score below the median of the trials that got there;
    # the others train to the run's end.
    asha = None
    tuner = ray.tune.Tuner(
        ray.tune.with_resources(run_trial, TRIAL_RESOURCES),
        # TODO 3: which split may a sweep score its trials on?
        param_space=dict(vars(args), **SEARCH_SPACE),
        tune_config=ray.tune.TuneConfig(metric="test_accuracy", mode="max", num_samples=args.num_samples,
                                        search_alg=search, scheduler=asha),
        run_config=ray.tune.RunConfig(storage_path=storage, verbose=0))
    return tuner.fit()


def run_trial(config):
    """One trial, in a Tune actor: a Ray Train run of train_func with this trial's config."""
    trainer = TorchTrainer(
        train_func, train_loop_config=config, scaling_config=ScalingConfig(num_workers=1),
        # TODO 4: Tune sees nothing of what the run reports unless the run hands it on.
        run_config=RunConfig(storage_path=config["checkpoint_dir"]))
    trainer.fit()


def train_func(config):
    """The recipe's loop in the trial's worker, scored on the evaluation split of config["data"] every epoch."""
    args = argparse.Namespace(**config)
    data = load_data(args.data, args.data_dir, args.eval_images)
    shuffle = torch.Generator().manual_seed(args.seed)
    train_loader = DataLoader(data.train_set(), batch_size=args.batch_size, shuffle=True, generator=shuffle,
                              drop_last=True)
    device = ray.train.torch.get_device()
    torch.manual_seed(args.seed)
    model = ray.train.torch.prepare_model(build_model(args.model))
    optimizer = make_optimizer(model, args, device)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    for epoch in range(args.epochs):
        for images, labels, ids in itertools.islice(train_loader, args.steps_per_epoch):
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(augment_batch(images, ids, epoch, args.seed)), labels)
            loss.backward()
            optimizer.step()
        correct, counted = evaluate(model, data.test_images, data.test_labels, device).tolist()
        ray.train.report(dict(epoch=epoch + 1, test_accuracy=correct / counted))
