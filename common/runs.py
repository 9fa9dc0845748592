"""Ray Train runs by name: a new run's name, the newest run's for --resume (which makes Ray restore it), the run's
folder, and its best checkpoint at the end."""
import atexit
import contextlib
import itertools
import os
import posixpath
import time
from pathlib import Path

import pyarrow.fs
import ray.train

from .checkpoints import check_compatible
from .errors import fail, first_process


def print_best(result) -> None:
    """The run's folder, and the best of the checkpoints that CheckpointConfig kept (local mode keeps none). From
    the first process only: in local mode under torchrun, every process runs all of main()."""
    if result.best_checkpoints and first_process():
        best_checkpoint, best_metrics = result.best_checkpoints[-1]
        print(f"run {result.path}: best checkpoint {best_checkpoint.path} "
              f"(epoch {best_metrics['epoch']}, test acc {best_metrics['test_accuracy']:.2%})")


def run_folder(args) -> Path:
    """This Ray Train run's folder: its checkpoints, and the traces of --profile-steps."""
    return Path(args.checkpoint_dir) / ray.train.get_context().get_experiment_name()


def new_run_name(step: str, checkpoint_dir: str, claim: bool = True) -> str:
    """step-YYYYmmdd-HHMMSS, claimed by creating its folder: a second run started in the same second in the same
    --checkpoint-dir gets -2 (-3, ...), and never restores the first. Names sort in the order runs started. Local
    mode (claim=False) keeps no checkpoint to restore, so claims nothing (its summary.json makes the folder)."""
    stamp = f"{step}-{time.strftime('%Y%m%d-%H%M%S')}"
    if not claim:
        return stamp
    if "://" in checkpoint_dir:  # a URI: no folder to claim; the process id tells runs of one second apart
        return f"{stamp}-{os.getpid()}"
    for n in itertools.count(1):
        name = stamp if n == 1 else f"{stamp}-{n}"
        folder = Path(checkpoint_dir) / name
        try:
            folder.mkdir(parents=True)
        except FileExistsError:
            continue
        atexit.register(remove_if_empty, folder)  # a run refused before Ray wrote anything leaves no trace
        return name


def remove_if_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not empty: Ray ran there
        folder.rmdir()


def run_name(step: str, args) -> str:
    """A new run gets a fresh name; --resume reuses the newest run's name, which makes Ray restore it.
    Checked here, on the driver, from the checkpoints' metadata: an error inside a worker would count as
    a worker failure and be retried --max-failures times. --checkpoint-dir is read as Ray reads it, with
    pyarrow's filesystems: a folder, or a URI such as s3://bucket/runs."""
    if not args.resume:
        return new_run_name(step, args.checkpoint_dir, claim=getattr(args, "num_workers", 1) != 0)
    filesystem, folder = pyarrow.fs.FileSystem.from_uri(args.checkpoint_dir)
    runs = folders_in(filesystem, folder, f"{step}-")
    if not runs:
        raise fail(f"--resume but no {step} run in {args.checkpoint_dir}; run without --resume to start fresh")
    checkpoints = folders_in(filesystem, runs[-1], "checkpoint_")
    if checkpoints:
        saved = ray.train.Checkpoint(checkpoints[-1], filesystem=filesystem).get_metadata()
        check_compatible(checkpoints[-1], saved["model_preset"], saved["epoch"], args)
    return posixpath.basename(runs[-1])


def folders_in(filesystem: pyarrow.fs.FileSystem, folder: str, prefix: str) -> list[str]:
    """The folders in folder whose names start with prefix, in the order of their names (runs: as they started)."""
    found = filesystem.get_file_info(pyarrow.fs.FileSelector(folder, allow_not_found=True))
    return sorted(info.path for info in found if info.type == pyarrow.fs.FileType.Directory
                  and info.base_name.startswith(prefix))
