"""What a Ray lab's check watches in the processes where Ray runs the attendee's code. Ray runs setup_worker first in
every process of the check's job: it replaces the watched functions in the modules that define them, at the moment
those modules are imported (torch imported earlier would train with a thread per core), so that the lab's code gets
them however it imports them (an alias, `import common.data as d`, a name pickled with its function). Each call is
written as a line of JSON into a file of the check's folder, which read() collects. No torch at this module's top."""
import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
from pathlib import Path

import ray

from common.ray_internals import REPORT_MODULE
from common.worker_setup import setup_worker as setup_ray_worker

FOLDER, WATCHED = "LABS_WATCH_FOLDER", "LABS_WATCHED"  # the environment Ray hands on to the job's processes
MODELS = []  # the models built in this process, for the weights' digest at each report
HELD_OUT = 1024  # the synthetic training images that stand in for the 5,000 cifar10-val holds out (stand_in)


def environment(folder, watched: list[str]) -> dict:
    """The job's environment variables that make setup_worker watch these functions (keys of WATCHERS)."""
    return {FOLDER: str(folder), WATCHED: ",".join(watched)}


def setup_worker() -> None:
    setup_ray_worker()
    if watched := os.environ.get(WATCHED):
        replace_on_import({name: WATCHERS[name] for name in watched.split(",")})


def read(folder) -> list[dict]:
    """Every call recorded, process by process, in the order each process made them."""
    return [json.loads(line) for path in sorted(Path(folder).glob("calls-*.jsonl"))
            for line in path.read_text().splitlines()]


def record(function: str, **values) -> None:
    dist = sys.modules.get("torch.distributed")
    in_group = dist is not None and dist.is_available() and dist.is_initialized()
    values.update(function=function, pid=os.getpid(), actor=ray.get_runtime_context().get_actor_id(),
                  rank=dist.get_rank() if in_group else None, group=dist.get_world_size() if in_group else 1)
    with open(Path(os.environ[FOLDER], f"calls-{os.getpid()}.jsonl"), "a") as calls:
        calls.write(json.dumps(values) + "\n")


def watched_augment_batch(augment_batch):
    def augment_batch_recording(images, ids, epoch, seed):
        record("augment_batch", epoch=epoch, ids=ids.tolist())
        return augment_batch(images, ids, epoch, seed)
    return augment_batch_recording


def watched_build_model(build_model):
    """build_model, recording each build and each forward pass of the models it builds (with its batch's size)."""
    def build_model_recording(*args, **kwargs):
        record("build_model")
        MODELS.append(build_model(*args, **kwargs))
        MODELS[-1].register_forward_pre_hook(lambda model, inputs: record("forward", images=len(inputs[0]),
                                                                          model=id(model)))
        return MODELS[-1]
    return build_model_recording


def watched_load_data(load_data):
    """load_data, recording the data asked for and handing out synthetic images instead (nothing downloads)."""
    def load_data_recording(name, data_dir, eval_images=None):
        record("load_data", data=name)
        return stand_in(load_data, name, data_dir, eval_images)
    return load_data_recording


def stand_in(load_data, name: str, data_dir, eval_images=None):
    """The synthetic images the watched load_data hands out for `name`: cifar10-val's hold out the last HELD_OUT
    training images to evaluate on, as the real split holds out the last 5,000, so that a check tells the splits
    apart by their images (image_digests); any other name gets the synthetic images as they are."""
    if name != "cifar10-val":
        return load_data("synthetic", data_dir, eval_images)
    from common.data import Data

    whole = load_data("synthetic", data_dir)
    cut = len(whole.train_labels) - HELD_OUT
    held_out = whole.train_images[cut:][:eval_images], whole.train_labels[cut:][:eval_images]
    return Data(whole.train_images[:cut], whole.train_labels[:cut], *held_out,
                f"synthetic stand-in for cifar10-val ({cut} train / {len(held_out[1])} validation images)")


def watched_evaluate(evaluate):
    """evaluate, recording a digest of each image it is given to score."""
    def evaluate_recording(model, images, labels, *args, **kwargs):
        record("evaluate", images=image_digests(images))
        return evaluate(model, images, labels, *args, **kwargs)
    return evaluate_recording


def image_digests(images) -> list[str]:
    """A short digest of each image of a batch: which split an image came from, whatever tensor holds it."""
    return [hashlib.blake2b(image.numpy().tobytes(), digest_size=8).hexdigest() for image in images.cpu()]


def watched_report(report):
    def report_recording(metrics, *args, **kwargs):
        checkpoint = kwargs.get("checkpoint", args[0] if args else None)
        record("report", checkpoint=checkpoint is not None, weights=weights_digest(),
               metrics={k: v for k, v in metrics.items() if isinstance(v, int | float | str)})
        return report(metrics, *args, **kwargs)
    return report_recording


def weights_digest() -> str | None:
    """A digest of the weights of the last model built in this process: the same on two ranks only if bit for bit."""
    return digest(MODELS[-1].state_dict()) if MODELS else None


def digest(state_dict: dict) -> str:
    """A digest of a state dict's tensors, in its order (a check's digest of a checkpoint is compared with it)."""
    hashed = hashlib.sha1()
    for value in state_dict.values():
        hashed.update(value.detach().cpu().numpy().tobytes())
    return hashed.hexdigest()


# What a check may watch: each function, by where it is defined, and where else a lab may find it.
WATCHERS = {
    "augment_batch": (watched_augment_batch, ["common.data"]),
    "build_model": (watched_build_model, ["common.model"]),
    "evaluate": (watched_evaluate, ["common.training"]),
    "load_data": (watched_load_data, ["common.data"]),
    "report": (watched_report, [REPORT_MODULE, "ray.train"]),
}


def replace_on_import(watchers: dict) -> None:
    """Each watched function replaced in its modules: now in those already imported, later in the others, as soon
    as they are."""
    by_module = {}
    for name, (watch, modules) in watchers.items():
        for module in modules:
            by_module.setdefault(module, {})[name] = watch
    for module in [m for m in by_module if m in sys.modules]:
        replace(sys.modules[module], by_module.pop(module))
    if by_module:
        sys.meta_path.insert(0, ReplacingFinder(by_module))


def replace(module, watchers: dict) -> None:
    for name, watch in watchers.items():
        function = getattr(module, name)
        if not getattr(function, "watched", False):  # a module that imported it from one already watched
            setattr(module, name, watch(function))
            getattr(module, name).watched = True


class ReplacingFinder(importlib.abc.MetaPathFinder):
    """Finds the watched modules as Python would, and replaces the watched functions once a module has run."""

    def __init__(self, by_module: dict):
        self.by_module = by_module

    def find_spec(self, name, path, target=None):
        if name not in self.by_module:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        execute, watchers = spec.loader.exec_module, self.by_module[name]

        def exec_module(module):
            execute(module)
            replace(module, watchers)

        spec.loader.exec_module = exec_module
        return spec
