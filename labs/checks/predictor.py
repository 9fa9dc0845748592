"""Lab 06's checks: the lab's classify() on the first 256 synthetic test images, with the seeded weights of the
tiny model, against step 06's own Classifier on the same images. Every model the lab builds, in whichever Ray
process, is counted into a file of the check's folder."""
import logging
import os
import tempfile
from pathlib import Path

import ray
import ray.data
import torch

from common import build_model, load_data
from labs.harness import Outcome, ROOT, lab_args, load_lab, start_ray

ONCE_PER_ACTOR = "each actor builds the model and loads the weights once, not once per batch"
SAME_PREDICTIONS = "every image's prediction is the step script's"
BATCHES = 4  # of the lab's 64 images each
STEP_SCRIPT = ROOT / "06-ray-data-inference" / "batch_inference.py"


class CountingBuilds:
    """build_model, writing the pid of every process that calls it into a file."""

    def __init__(self, log: Path):
        self.log = log

    def __call__(self, preset: str):
        with open(self.log, "a") as log:
            log.write(f"{os.getpid()}\n")
        return build_model(preset)


def run(lab_file, address) -> list:
    lab, args = load_lab(lab_file), lab_args()
    start_ray(address)
    quiet_ray_data()
    data = load_data(args.data, args.data_dir, args.eval_images)
    torch.manual_seed(args.seed)
    weights_ref = ray.put(build_model(args.model).state_dict())
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "builds"
        log.touch()
        lab.build_model = CountingBuilds(log)
        rows = lab.classify(evaluation_set(data), args.model, weights_ref).take_all()
        builders = log.read_text().split()
    expected = step_script_predictions(data, args.model, weights_ref)
    ray.shutdown()
    return [once_per_actor(builders), same_predictions(rows, expected)]


def quiet_ray_data() -> None:
    """As step 06: no INFO lines from Ray Data, nor its execution plan and one bar per stage."""
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    context = ray.data.DataContext.get_current()
    context.enable_operator_progress_bars = False
    context.print_on_execution_start = False


def evaluation_set(data) -> ray.data.Dataset:
    """As step 06's, in BATCHES blocks: one batch of 64 each."""
    rows = [dict(id=i, label=int(label), image=image)
            for i, (image, label) in enumerate(zip(data.test_images.numpy(), data.test_labels, strict=True))]
    return ray.data.from_items(rows, override_num_blocks=BATCHES)


def step_script_predictions(data, preset: str, weights_ref) -> list[int]:
    """Step 06's Classifier, called here on every image at once."""
    classifier = load_lab(STEP_SCRIPT).Classifier(preset, weights_ref, "cpu")
    return classifier(dict(image=data.test_images.numpy()))["predicted"].tolist()


def once_per_actor(builders: list[str]):
    failure = None
    if len(builders) != len(set(builders)) or len(builders) >= BATCHES:
        failure = (f"the model was built {len(builders)} times, in {len(set(builders))} process(es), for "
                   f"{BATCHES} batches")
    return Outcome(ONCE_PER_ACTOR, failure, "map_batches given a class starts a pool of actors and constructs the "
                                            "class once in each; given a function, it runs all of it for every "
                                            "batch")


def same_predictions(rows: list[dict], expected: list[int]):
    failure = None
    if rows and "id" not in rows[0]:
        failure = f"the output rows have columns {sorted(rows[0])}: no id says which image a prediction is for"
    elif sorted((row["id"], int(row["predicted"])) for row in rows) != list(enumerate(expected)):
        wrong = sum(int(row["predicted"]) != expected[row["id"]] for row in rows)
        failure = f"{wrong} of {len(expected)} predictions differ from the step script's ({len(rows)} rows out)"
    return Outcome(SAME_PREDICTIONS, failure, "Ray Data returns batches in any order: each output row must keep "
                                              "its input columns beside what the model adds")
