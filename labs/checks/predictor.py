"""Lab 06's checks: the lab's classify() on 255 synthetic evaluation images, with trained weights of the tiny
model (weights()), against step 06's own Classifier on the same images. In every process of Ray's job,
build_model records each model it builds and each forward pass of it (labs.watch): in which process, and whether
that process is an actor."""
import logging
import tempfile

import ray
import ray.data

from common.data import load_data
from labs import reference, watch
from labs.harness import ROOT, lab_args, load_lab
from labs.outcome import Outcome, crashed
from labs.ray_runs import ray_error, start_ray

POOL = "a pool of 2 actors classifies the images: every forward pass runs in one of 2 actor processes"
ONCE_PER_ACTOR = "each actor builds the model and loads the weights once, not once per batch"
SAME_PREDICTIONS = "every image keeps its id and label, and its prediction and probability are the step script's"
CHECKS = [POOL, ONCE_PER_ACTOR, SAME_PREDICTIONS]
BATCHES = 4  # blocks of 255 images: 64, 64, 64, 63
# Not the other labs' 63 images: Ray Data reads so few into one block, one batch, and a model built per batch is then
# built once.
IMAGES = ["--eval-images", "255"]
ACTORS = 2
# A pool whose actors cannot all start (more CPUs asked than the cluster has) fails after this, not never.
ACTOR_START_TIMEOUT_S = 60
STEP_SCRIPT = ROOT / "06-ray-data-inference" / "batch_inference.py"


def run(lab_file, address) -> list:
    lab, args = load_lab(lab_file), lab_args(*IMAGES)
    with tempfile.TemporaryDirectory() as folder:
        start_ray(address, watch.environment(folder, ["build_model"]))
        quiet_ray_data()
        data = load_data(args.data, args.data_dir, args.eval_images)
        weights_ref = ray.put(weights(args))
        try:
            rows = lab.classify(evaluation_set(data), args.model, weights_ref).take_all()
        except Exception as error:
            return crashed(CHECKS, ray_error(error))
        calls = watch.read(folder)
    expected = step_script_predictions(data, args.model, weights_ref)
    ray.shutdown()
    builds = [call for call in calls if call["function"] == "build_model"]
    forwards = [call for call in calls if call["function"] == "forward"]
    return [pool(forwards), once_per_actor(builds, forwards), same_predictions(rows, expected, data)]


def weights(args) -> dict:
    """The tiny model after the lab's 2 short epochs of the recipe (labs.reference): a model just built has a head of
    zeros, which gives every image 10% for every class, as would any model that loaded no weights."""
    return reference.recipe(args.epochs)["weights"]


def quiet_ray_data() -> None:
    """As step 06: no INFO lines from Ray Data, nor its execution plan and one bar per stage."""
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    context = ray.data.DataContext.get_current()
    context.enable_operator_progress_bars = False
    context.print_on_execution_start = False
    context.wait_for_min_actors_s = ACTOR_START_TIMEOUT_S


def evaluation_set(data) -> ray.data.Dataset:
    """As step 06's, in BATCHES blocks."""
    rows = [dict(id=i, label=int(label), image=image)
            for i, (image, label) in enumerate(zip(data.test_images.numpy(), data.test_labels, strict=True))]
    return ray.data.from_items(rows, override_num_blocks=BATCHES)


def step_script_predictions(data, preset: str, weights_ref) -> dict:
    """Step 06's Classifier, called here on every image at once."""
    classifier = load_lab(STEP_SCRIPT).Classifier(preset, weights_ref, "cpu")
    return classifier(dict(image=data.test_images.numpy()))


def pool(forwards: list[dict]):
    processes = {call["pid"] for call in forwards}
    actors = {call["actor"] for call in forwards if call["actor"]}
    failure = None
    if any(call["actor"] is None for call in forwards):
        failure = f"the model ran in {len(processes)} process(es) that are not actors (Ray tasks)"
    elif len(actors) != ACTORS:
        failure = f"the model ran in {len(actors)} actor(s), not a pool of {ACTORS}"
    return Outcome(POOL, failure, "map_batches given a class (and a pool size: ActorPoolStrategy or concurrency) "
                                  "starts a pool of actors that each keep their state; given a function, it runs "
                                  "tasks, which keep nothing from one batch to the next")


def once_per_actor(builds: list[dict], forwards: list[dict]):
    built = [call["pid"] for call in builds]
    failure = None
    if len(built) != len(set(built)) or not {call["pid"] for call in forwards} <= set(built):
        failure = (f"the model was built {len(built)} times, in {len(set(built))} process(es), for {BATCHES} "
                   "batches")
    return Outcome(ONCE_PER_ACTOR, failure, "a class's constructor runs once in each actor of the pool, and "
                                            "__call__ once per batch: build the model in the constructor")


def same_predictions(rows: list[dict], expected: dict, data):
    failure, hint = None, ("Ray Data returns batches in any order: each output row must keep its input columns "
                           "beside what the model adds")
    if rows and not {"id", "label"} <= set(rows[0]):
        failure = f"the output rows have columns {sorted(rows[0])}: no id and label say which image a prediction is for"
    elif sorted((row["id"], row["label"]) for row in rows) != list(enumerate(data.test_labels.tolist())):
        failure = f"{len(rows)} rows out for {len(data.test_labels)} images, not one per image with its label"
    else:
        wrong = sum(int(row["predicted"]) != expected["predicted"][row["id"]] or
                    abs(float(row["probability"]) - expected["probability"][row["id"]]) > 1e-5 for row in rows)
        if wrong:
            failure = f"{wrong} of {len(rows)} predictions or probabilities differ from the step script's"
            hint = ("classify as the step script does: the weights handed in, the model in eval mode, and "
                    "common.predict, which averages each image with its mirror image")
    return Outcome(SAME_PREDICTIONS, failure, hint)
