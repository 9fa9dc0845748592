"""What step 06 does beyond its lesson (a Ray Data pipeline through a pool of actors): reading any step's checkpoint
on the driver (a Ray run's best, step 01's file, step 04's shards), listing and decoding image files, and the
accuracy report and plots drawn from the predictions. Checked on the driver, each with a one-line error: in the
actors, a wrong checkpoint would be a traceback per actor."""
import io
import json
import logging
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import ray
import ray.train
import torch
import torch.distributed.checkpoint as dcp
from matplotlib.figure import Figure
from PIL import Image

from .errors import fail
from .model import build_model

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
SAMPLES = 32  # images in the sample grid


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
    summary = json.loads((path / "summary.json").read_text())
    history = pd.DataFrame(summary["history"])
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


def decode_image(row: dict) -> list[dict]:
    """One row per readable image, none for anything else;
    any size and mode, resized to 32x32 RGB."""
    try:
        with Image.open(io.BytesIO(row["bytes"])) as image:
            pixels = np.asarray(image.convert("RGB").resize((32, 32), Image.Resampling.BILINEAR))
    except (OSError, ValueError, Image.DecompressionBombError):
        return []  # not an image, truncated, or absurdly large
    return [dict(path=row["path"], image=pixels.transpose(2, 0, 1))]


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
