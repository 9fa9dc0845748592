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
import io
import json
import logging
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import ray
import ray.data
import ray.train
import torch
import torch.distributed.checkpoint as dcp
from matplotlib.figure import Figure
from PIL import Image

import common
from common import build_model, load_data, predict
from common.errors import fail
from common.flags import REPOSITORY, Parser, add_data_flags, check_data_flags, flag_value
from common.ray_setup import WORKER_SETUP, add_cluster_flags, check_cluster_and_choose_gpu
from common.ray_setup import init_options

STEP = "ray_data_inference"
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
SAMPLES = 32  # images in the sample grid


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
             runtime_env={"py_modules": [common], **WORKER_SETUP})
    # Ray Data's INFO and WARNING lines; not its progress bar.
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    use_gpu = check_cluster_and_choose_gpu(args, "--actors")
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
    print(json.dumps(summary))


def check_flags(parser: Parser, args) -> None:
    check_data_flags(parser, args)
    for flag in ("--actors", "--batch-size"):
        if flag_value(args, flag) < 1:
            parser.reject(args, flag, "must be at least 1")


def find_checkpoint(path: Path) -> Path:
    """A checkpoint file or folder is used as it is;
    a Ray run folder is inspected and gives its best checkpoint."""
    path = path.expanduser().resolve()  # Ray takes a relative path for a URI with no scheme
    if not path.exists():
        raise fail(f"no checkpoint at --checkpoint {path}; pass a checkpoint file or folder, "
                   f"or a Ray run folder (<checkpoint-dir>/<step>-<date>-<time>)")
    if path.is_file() or any((path / name).exists()
                             for name in ("checkpoint.pt", "model.pt", ".metadata")):
        return path
    return inspect_run(path)


def inspect_run(path: Path) -> Path:
    """Print a Ray run's metrics, epoch by epoch,
    and return its best checkpoint by test accuracy."""
    # Not "a run snapshot was found ... will be loaded".
    logging.getLogger("ray.train").setLevel(logging.WARNING)
    try:
        result = ray.train.Result.from_path(path)
    except RuntimeError:  # no run snapshot: not a Ray run folder
        runs = sorted({p.parent for p in path.glob("*/checkpoint_*/")})
        hint = (f"pass one of its runs, e.g. {runs[-1]}" if runs
                else "pass a checkpoint or a Ray run folder")
        raise fail(f"--checkpoint {path} holds no checkpoint and no Ray run; {hint}")
    if result.metrics is None:
        raise fail(f"the run in {path} has no checkpoint yet; pass a run that finished an epoch")
    # metrics_dataframe: one row per checkpoint Ray kept (steps 02-04 keep the best 2) with the
    # metrics reported with it. Every epoch's metrics are in the summary.json these steps keep
    # in the run's folder.
    kept = result.metrics_dataframe["epoch"]
    history = pd.DataFrame(json.loads((path / "summary.json").read_text())["history"])
    history["checkpoint kept"] = history["epoch"].isin(kept)
    best = result.get_best_checkpoint("test_accuracy", mode="max")
    print(f"run {result.path}:\n{history.to_string(index=False, float_format='{:.4f}'.format)}")
    epoch = best.get_metadata()["epoch"]
    print(f"best checkpoint by test accuracy: {best.path} (epoch {epoch}, "
          f"test acc {history.set_index('epoch').loc[epoch, 'test_accuracy']:.2%})")
    return Path(best.path)


def load_weights(path: Path, model_flag: str | None) -> tuple[dict, str]:
    """The model's state dict and preset from any step's checkpoint, on the driver's CPU."""
    path = path.expanduser().resolve()  # Ray takes a relative path for a URI with no scheme
    folder = path if path.is_dir() else path.parent
    # Steps 02-04 write the preset into Ray's checkpoint metadata;
    # step 01's checkpoint.pt holds it itself.
    saved_preset = ray.train.Checkpoint(str(folder)).get_metadata().get("model_preset")
    file = next((f for f in (folder / "checkpoint.pt", folder / "model.pt") if f.exists()), None)
    file = path if path.is_file() else file
    # None: step 04's sharded checkpoint (torch.distributed.checkpoint), without its model.pt
    if file is None:
        preset = check_preset(path, saved_preset, model_flag)
        return load_sharded(folder, preset), preset
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:
        raise fail(f"{file} is not a PyTorch checkpoint ({type(e).__name__}); "
                   f"pass a checkpoint.pt, a model.pt or a checkpoint folder")
    # Steps 01-03: model, optimizer, scheduler, epoch, history, model_preset
    if isinstance(state, dict) and "model_preset" in state:
        state, saved_preset = state.get("model"), state["model_preset"]
    if not (isinstance(state, dict) and all(isinstance(t, torch.Tensor) for t in state.values())):
        raise fail(f"{file} holds no model weights (a {type(state).__name__}, not a state dict of "
                   f"tensors); pass a checkpoint.pt, a model.pt or a checkpoint folder")
    preset = check_preset(path, saved_preset, model_flag)
    check_fits(state, preset, file)
    return state, preset


def check_preset(path: Path, saved: str | None, model_flag: str | None) -> str:
    if saved is None and model_flag is None:
        raise fail(f"{path} does not say which model it holds; "
                   f"pass --model (the preset it was trained with)")
    if saved and model_flag and saved != model_flag:
        raise fail(f"{path} holds a --model {saved} checkpoint, not {model_flag}; "
                   f"pass --model {saved} or leave --model out")
    return saved or model_flag


def check_fits(state: dict, preset: str, path: Path) -> None:
    """Checked here, on the driver: in the actors, a wrong preset would be a traceback per actor."""
    with torch.device("meta"):  # shapes only, no memory
        expected = {name: t.shape for name, t in build_model(preset).state_dict().items()}
    if {name: t.shape for name, t in state.items()} != expected:
        raise fail(f"{path} does not hold a --model {preset} model; "
                   f"pass the --model it was trained with")


def load_sharded(folder: Path, preset: str) -> dict:
    """Step 04's checkpoint as saved by dcp.save({"app": AppState(...)}), in this one process:
    DCP fills the tensors it is given from every rank's file, and reads only the keys asked for
    (not the optimizer's)."""
    state = build_model(preset).state_dict()
    with warnings.catch_warnings():
        # One process, on purpose.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"app": {"model": state}}, checkpoint_id=str(folder), no_dist=True)
    return state


def image_files(folder: Path, limit: int | None) -> list[Path]:
    """Every file in the folder and below. Listed here, not by Ray Data, which would leave out names
    starting with "." or "_" without a word; files that are not images are named after the run."""
    files = sorted(p.resolve() for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
    if not files:
        raise fail(f"--images {folder} is not a folder with files in it; pass a folder of images")
    if limit is not None and not 0 < limit <= len(files):
        raise fail(f"--eval-images {limit} must be between 1 and {len(files)}")
    files = files[:limit]
    # Up to the first image Pillow reads (the first file, in a folder of images): with none, Ray
    # and its actors would start for nothing.
    if not any(decode_image(dict(path=str(f), bytes=read_bytes(f))) for f in files):
        raise fail(f"none of the {len(files)} files in --images {folder} is an image Pillow can "
                   f"read; pass a folder of PNG or JPEG files")
    return files


def read_bytes(path: Path) -> bytes:
    """The file's bytes; none for a file that cannot be read (decode_image drops it)."""
    try:
        return path.read_bytes()
    except OSError:
        return b""


def check_a_cpu_is_left_to_read(actors: int) -> None:
    """The actors hold their CPUs for the whole run: with none left, the tasks that read and
    decode the files never start, and Ray Data waits forever."""
    cpus = int(ray.cluster_resources().get("CPU", 0))
    if actors >= cpus:
        fix = f"use --actors {cpus - 1}" if cpus > 1 else "give the cluster a second CPU"
        raise fail(f"--actors {actors} would hold all {cpus} CPUs of the cluster and leave none "
                   f"to read --images; {fix}")


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


def decode_image(row: dict) -> list[dict]:
    """One row per readable image, none for anything else;
    any size and mode, resized to 32x32 RGB."""
    try:
        with Image.open(io.BytesIO(row["bytes"])) as image:
            pixels = np.asarray(image.convert("RGB").resize((32, 32), Image.Resampling.BILINEAR))
    except (OSError, ValueError, Image.DecompressionBombError):
        return []  # not an image, truncated, or absurdly large
    return [dict(path=row["path"], image=pixels.transpose(2, 0, 1))]


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


def report_evaluation(table: pd.DataFrame, data, out: Path) -> dict:
    """Overall and per-class accuracy, the confusion matrix
    and a grid of the first images with their labels."""
    table = table.sort_values("id", ignore_index=True)
    confusion = np.zeros((len(CLASSES), len(CLASSES)), dtype=np.int64)
    # Rows: true class, columns: predicted.
    np.add.at(confusion, (table["label"], table["predicted"]), 1)
    correct, counted = int(confusion.trace()), int(confusion.sum())
    per_class = dict(zip(CLASSES, (confusion.diagonal() / confusion.sum(1).clip(min=1)).tolist(),
                         strict=True))
    print(f"accuracy {correct / counted:.2%} ({correct:,} / {counted:,}) | per class: "
          + ", ".join(f"{name} {accuracy:.1%}" for name, accuracy in per_class.items()))
    save_confusion_matrix(confusion, out / "confusion_matrix.png")
    samples = table[:SAMPLES]
    save_sample_grid(data.test_images[samples["id"].tolist()].numpy(), samples,
                     ["true: " + CLASSES[label] for label in samples["label"]], out / "samples.png")
    return dict(correct=correct, counted=counted, accuracy=correct / counted,
                per_class_accuracy=per_class)


def report_folder(table: pd.DataFrame, files: list[Path], out: Path) -> None:
    """Name the files that were not images, in one line,
    and draw the first images with their predictions."""
    table = table.sort_values("path", ignore_index=True)
    skipped = sorted(set(map(str, files)) - set(table["path"]))
    if skipped:
        more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        print(f"skipped {len(skipped)} file(s) that Pillow cannot read as images: "
              f"{', '.join(Path(f).name for f in skipped[:5])}{more}")
    samples = table[:SAMPLES]
    images = [decode_image(dict(path=path, bytes=Path(path).read_bytes()))[0]["image"]
              for path in samples["path"]]
    save_sample_grid(np.stack(images), samples, [Path(path).name for path in samples["path"]],
                     out / "samples.png")


def save_confusion_matrix(confusion: np.ndarray, path: Path) -> None:
    fig = Figure(figsize=(7, 6))
    ax = fig.subplots()
    ax.imshow(confusion, cmap="Blues")
    for (true, predicted), count in np.ndenumerate(confusion):
        ax.text(predicted, true, count, ha="center", va="center", fontsize=7,
                color="white" if count > confusion.max() / 2 else "black")
    ax.set_xticks(range(len(CLASSES)), CLASSES, rotation=45, ha="right")
    ax.set_yticks(range(len(CLASSES)), CLASSES)
    ax.set(xlabel="predicted", ylabel="true", title="confusion matrix")
    fig.savefig(path, dpi=110, bbox_inches="tight")


def save_sample_grid(images: np.ndarray, rows: pd.DataFrame, titles: list[str], path: Path) -> None:
    """Each image under its predicted class and probability, and a caption;
    mistakes framed in red."""
    columns, lines = 8, -(-len(images) // 8)
    fig = Figure(figsize=(2 * columns, 2.3 * lines))
    axes = fig.subplots(lines, columns, squeeze=False).flatten()
    for ax, image, row, title in zip(axes[:len(images)], images, rows.itertuples(), titles,
                                     strict=True):
        ax.imshow(image.transpose(1, 2, 0))
        wrong = "label" in rows and row.predicted != row.label
        ax.set_title(f"{row.predicted_class} {row.probability:.0%}\n{title}", fontsize=8,
                     color="red" if wrong else "black")
        ax.set(xticks=[], yticks=[])
        for spine in ax.spines.values():
            spine.set(color="red" if wrong else "none", linewidth=3)
    for ax in axes[len(images):]:
        ax.set_axis_off()
    fig.savefig(path, dpi=80, bbox_inches="tight")


if __name__ == "__main__":
    main()
