r"""Step 06: after training. Inspect a run, then classify images with Ray Data from any checkpoint.

    python 06-ray-data-inference/batch_inference.py --checkpoint checkpoints/ray_ddp/RUN_NAME
    python 06-ray-data-inference/batch_inference.py --checkpoint checkpoints/single_machine \
        --actors 2
    python 06-ray-data-inference/batch_inference.py --checkpoint checkpoints/single_machine \
        --images my_photos/

RUN_NAME is the run folder a step 02 run printed. --checkpoint takes a Ray run folder of steps
02-04, <checkpoint-dir>/<step>-<date>-<time>: the script prints its per-epoch metrics
(ray.train.Result.from_path) and picks the best checkpoint by test accuracy
(Result.get_best_checkpoint). Or one checkpoint, loaded as it is: step 01's checkpoint.pt (or its
folder), a Ray checkpoint folder of steps 02-04 (checkpoint.pt, step 04's model.pt export, or step
04's sharded torch.distributed.checkpoint files), or a model.pt file. The model preset comes from
the checkpoint itself.

What Ray Data does here: it streams the images (the CIFAR-10 evaluation split of --data, or every
file of --images, read and decoded by parallel tasks) through a pool of --actors actors (map_batches
with a callable class and ActorPoolStrategy). Each actor builds the model and loads the weights
once, then classifies --batch-size images per call, on one CPU or one GPU, on any node of the
cluster; reading, classifying and writing overlap, and the predictions are written as Parquet by
Ray Data. What it does not do: make one forward pass faster (a model too large for one device needs
sharding, as in step 04); compute accuracy or draw plots (the driver reads the Parquet back for
those, on one machine); or start for free: Ray and the actors start before the first image is
classified. It pays off with many files to decode, or many GPUs to keep busy.
"""
import json
import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd
import ray
import ray.data
import torch

import common
from common.data import load_data
from common.errors import fail
from common.model import build_model
from common.training import predict
# What the step does beyond its lesson: any checkpoint, image files, the report and its plots.
from common.flags import Parser, REPOSITORY, add_cluster_flags, add_data_flags, check_data_flags
from common.flags import flag_value
from common.inference import CLASSES, check_a_cpu_is_left_to_read, decode_image, find_checkpoint
from common.inference import image_files, load_weights, report_evaluation, report_folder
from common.ray_setup import check_cluster_and_choose_gpu, init_options, worker_setup

STEP = "ray_data_inference"


def main():
    parser = Parser(__doc__, check_flags)
    parser.add_argument("--checkpoint", required=True,
                        help="a Ray run folder of steps 02-04, or one checkpoint")
    add_data_flags(parser)
    # The checkpoint names its preset: --model only checks it,
    # or names the preset of a bare model.pt.
    parser.set_defaults(model=None)
    parser.add_argument("--images", help="classify every file in this folder (PNG, JPEG, ...: "
                                         "any size) instead")
    parser.add_argument("--actors", type=int, default=1,
                        help="model replicas: Ray Data actors, one CPU or GPU each")
    parser.add_argument("--batch-size", type=int, default=256,
                        help="images per model call in each actor")
    add_cluster_flags(parser)
    parser.add_argument("--out", default=str(REPOSITORY / "results" / "06-inference"),
                        help="predictions (Parquet) and plots go here")
    args = parser.parse_args()
    # Everything that can be wrong is checked here, before Ray starts, each with a one-line error.
    weights, preset = load_weights(find_checkpoint(Path(args.checkpoint)), args.model)
    if args.images:
        files = image_files(Path(args.images), args.eval_images)
        description = f"{len(files)} files in {args.images}"
    else:
        data = load_data(args.data, args.data_dir, args.eval_images)
        description = data.description

    # Not Ray's defaults: init_options (README.md in step 02: Console).
    ray.init(address=args.address, **init_options(args.address),
             runtime_env={"py_modules": common.__path__, **worker_setup()})
    # Ray Data's INFO and WARNING lines; not its progress bar.
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    use_gpu = check_cluster_and_choose_gpu(args, "--actors", cpu_each=True)
    if args.images:
        check_a_cpu_is_left_to_read(args.actors)
    context = ray.data.DataContext.get_current()
    # One progress bar for the whole pipeline, not one per stage:
    context.enable_operator_progress_bars = False
    context.print_on_execution_start = False  # nor its execution plan
    dataset = read_image_folder(files) if args.images else evaluation_set(data)
    device = "cuda" if use_gpu else "cpu"
    print(f"model {preset} | data: {description} | {args.actors} actor(s) x {device}, "
          f"{args.batch_size} images per call")
    weights_ref = ray.put(weights)  # into the object store once; every actor reads them from there
    predictions = dataset.map_batches(
        Classifier,
        fn_constructor_args=(preset, weights_ref, device),
        compute=ray.data.ActorPoolStrategy(size=args.actors),
        batch_size=args.batch_size,
        num_cpus=1, num_gpus=1 if use_gpu else 0)

    out = Path(args.out)
    start = time.perf_counter()
    # Nothing has run yet (Ray Data is lazy): writing pulls every image
    # through reading, the actors and Parquet.
    predictions.write_parquet(str((out / "predictions").resolve()), mode="overwrite")
    seconds = time.perf_counter() - start
    ray.shutdown()  # no more Ray output: the JSON below stays the last line
    if not any((out / "predictions").glob("*.parquet")):  # only possible with --images
        raise fail(f"none of the {len(files)} files in --images {args.images} is an image "
                   f"Pillow can read; pass a folder of PNG or JPEG files")
    table = pd.read_parquet(out / "predictions")
    print(f"{len(table):,} images in {seconds:.1f} s: {len(table) / seconds:,.0f} images/s "
          f"(Ray Data's whole run: starting the actors, reading, classifying, writing)")
    summary = dict(step=STEP, checkpoint=args.checkpoint, model=preset,
                   data=args.images or args.data, images=len(table), actors=args.actors,
                   device=device, batch_size=args.batch_size, seconds=seconds,
                   images_per_s=len(table) / seconds, predictions=str(out / "predictions"))
    if args.images:
        report_folder(table, files, out)
    else:
        summary.update(report_evaluation(table, data, out))
    print(f"predictions: {out / 'predictions'} (Parquet) | "
          f"plots: {', '.join(map(str, sorted(out.glob('*.png'))))}")
    # The last line: the headline, and where the whole summary is.
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    headline = {key: round(summary[key], 4) for key in ("images_per_s", "accuracy")
                if key in summary}
    print(json.dumps(dict(step=STEP, model=preset, images=len(table), **headline,
                          summary=str((out / "summary.json").resolve()))))


def check_flags(parser: Parser, args) -> None:
    check_data_flags(parser, args)
    for flag in ("--actors", "--batch-size"):
        if flag_value(args, flag) < 1:
            parser.reject(args, flag, "must be at least 1")


def evaluation_set(data) -> ray.data.Dataset:
    """The evaluation images of --data as a Ray Dataset of rows
    {id, label, image (3, 32, 32) uint8}."""
    rows = [dict(id=i, label=label, image=image)
            for i, (image, label) in enumerate(zip(data.test_images.numpy(),
                                                   data.test_labels.numpy(), strict=True))]
    return ray.data.from_items(rows)


def read_image_folder(files: list[Path]) -> ray.data.Dataset:
    """Rows {path, image (3, 32, 32) uint8}, read and decoded by Ray Data tasks.
    ray.data.read_images would stop the whole run at the first file that is not an image:
    reading the bytes and decoding each file ourselves drops such a file instead, and the driver
    names it."""
    return (ray.data.read_binary_files([str(f) for f in files], include_paths=True)
            .flat_map(decode_image))


class Classifier:
    """One per actor: builds the model and loads the weights once,
    then classifies batch after batch."""

    def __init__(self, preset: str, weights_ref: ray.ObjectRef, device: str):
        self.device = torch.device(device)  # with a GPU, Ray shows the actor its own one as cuda:0
        self.model = build_model(preset)
        self.model.load_state_dict(ray.get(weights_ref))
        self.model.to(self.device).eval()

    @torch.inference_mode()
    def __call__(self, batch: dict) -> dict:
        # A copy: Ray's batch is read-only.
        images = torch.tensor(batch.pop("image"), device=self.device)
        with torch.autocast(self.device.type, dtype=torch.bfloat16,
                            enabled=self.device.type == "cuda"):
            # As common.evaluate does, so accuracies agree exactly.
            probabilities = predict(self.model, images)
        probability, predicted = probabilities.max(1)
        predicted = predicted.cpu().numpy()
        # Every other column (id and label, or path) goes through untouched, to the Parquet files.
        return dict(batch, predicted=predicted, predicted_class=np.array(CLASSES)[predicted],
                    probability=probability.cpu().numpy())


if __name__ == "__main__":
    main()
