"""What every lab's check shares: the lab's settings and the attendee's file. Beside it: labs/outcome.py (a check's
outcome), labs/ranks.py (a lab's ranks, started as torchrun starts them), labs/patching.py (common/'s functions
watched in the lab's run), labs/cache.py (the reference runs kept), labs/ray_runs.py (Ray for a check), labs/watch.py
(what Ray's processes watch). Each check module (labs/checks/) holds only what its lab checks."""
import importlib.util
from pathlib import Path

from common.flags import make_parser

ROOT = Path(__file__).resolve().parents[1]
# The smoke tests' settings, shorter: the tiny preset learns the synthetic images within a few steps. A seed other
# than 0, DistributedSampler's default, and a test set that 2 ranks split unevenly (32 and 31 images): neither then
# hides a sampler that ignores --seed, or accuracies averaged over the ranks instead of counted (a/32 and b/31 are
# equal only when a = b = 0 or every image is right, 31 and 32 being coprime; with 64 images the mean of the ranks'
# accuracies passed lab 01's check, tried). Scoring takes most of a rank's time in the checks that train in float64:
# 63 images, not 255, took lab 01's check from 6.5 to 4 s (tests/history/account/README.md, "Cuts").
LAB_FLAGS = ["--data", "synthetic", "--model", "tiny", "--epochs", "2", "--steps-per-epoch", "4",
             "--batch-size", "32", "--lr", "1e-3", "--eval-images", "63", "--seed", "1"]


def lab_args(*flags: str):
    """The step scripts' flags and defaults, at the lab's sizes."""
    return make_parser("lab", "lab").parse_args([*LAB_FLAGS, *flags])


def load_lab(path):
    """The attendee's file as a module; its main() does not run."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
