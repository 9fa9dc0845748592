"""How the CPU recipe was chosen: short runs of step 01's training on the validation split, one per variant.

    python benchmarks/recipe_search.py --data-dir DIR --epochs 3 --variants baseline stem

Each variant changes the `tiny` preset as it was when the search began (FIRST_TINY), the crop
padding or a training flag of train_single_machine.py, and runs that script's own training in a
fresh process with --data cifar10-val (never the test set). Every run appends its final JSON line,
with the variant's name and changes, to --out. The variants that won are what common/ now holds
(`stem_pad2` is `tiny`, `hybrid192_deep` is `hybrid`); the rest stay here so that the search can be
rerun and extended.
"""
import argparse
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

RUN_VARIANT = "--run-variant"  # internal: how the child process is told which variant it trains
ROOT = Path(__file__).resolve().parents[1]
SINGLE = ROOT / "01-vanilla-pytorch-ddp/train_single_machine.py"
STEM = ((32, 2), (64, 2))
# What every variant changes: `tiny` as the search began (a 4x4 patchify), so old variants still train what they did.
FIRST_TINY = dict(num_layers=6, num_heads=4, hidden_dim=128, mlp_dim=256)

# name: (changes to FIRST_TINY, crop padding, extra flags)
VARIANTS = {
    "baseline": ({"stem": None}, 4, []),
    "stem": ({"stem": STEM}, 4, []),
    "stem_pad2": ({"stem": STEM}, 2, []),
    "stem_no_smoothing": ({"stem": STEM}, 4, ["--label-smoothing", "0"]),
    "stem_lr3e-3": ({"stem": STEM}, 4, ["--lr", "3e-3"]),
    "stem_wd0.1": ({"stem": STEM}, 4, ["--weight-decay", "0.1"]),
    "stem_depth8": ({"stem": STEM, "num_layers": 8}, 4, []),
    "stem_width192": ({"stem": STEM, "hidden_dim": 192, "num_heads": 6, "mlp_dim": 384}, 4, []),
    "stem_mlp512": ({"stem": STEM, "mlp_dim": 512}, 4, []),
    "stem_batch256": ({"stem": STEM}, 4, ["--batch-size", "256", "--lr", "3e-3"]),
    "stem_warmup0.5": ({"stem": STEM}, 4, ["--warmup-epochs", "0.5"]),
    "stem_pad2_depth8": ({"stem": STEM, "num_layers": 8}, 2, []),
    "stem_pad2_lr3e-3": ({"stem": STEM}, 2, ["--lr", "3e-3"]),
    "stem_pad2_mlp512": ({"stem": STEM, "mlp_dim": 512}, 2, []),
    "stem_pad2_depth8_lr3e-3": ({"stem": STEM, "num_layers": 8}, 2, ["--lr", "3e-3"]),
    "stem_pad2_no_smoothing": ({"stem": STEM}, 2, ["--label-smoothing", "0"]),
    "stem_pad1_no_smoothing": ({"stem": STEM}, 1, ["--label-smoothing", "0"]),
    "stem_pad2_batch64": ({"stem": STEM}, 2, ["--batch-size", "64"]),
    # a third stride-2 convolution: 4x4 = 16 tokens, about 1.4x the images/s of tiny even at width 256
    "hybrid256": ({"stem": ((32, 2), (64, 2), (128, 2)), "hidden_dim": 256, "num_heads": 8, "mlp_dim": 512}, 2, []),
    # a deeper convolutional stem, a stride-1 convolution before each stride-2 one, ending at 4x4 = 16 tokens
    "hybrid192_deep": ({"stem": ((32, 1), (64, 2), (64, 1), (128, 2), (128, 1), (256, 2)), "hidden_dim": 192,
                        "num_heads": 6, "mlp_dim": 384}, 2, []),
    # the same without the full-resolution convolution: the stem starts at stride 2
    "hybrid192_deep_s2": ({"stem": ((32, 2), (64, 1), (128, 2), (128, 1), (256, 2)), "hidden_dim": 192,
                           "num_heads": 6, "mlp_dim": 384}, 2, []),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--data-dir", default="~/.cache/cifar10")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/recipe-search.jsonl")
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.variants:
        # Every variant changes the preset named tiny (run_variant), whatever the steps' default is.
        flags = ["--model", "tiny", "--data", "cifar10-val", "--data-dir", args.data_dir, "--epochs", str(args.epochs),
                 "--seed", str(args.seed), "--checkpoint-dir", f"/tmp/recipe-search-{name}", *VARIANTS[name][2]]
        command = [sys.executable, __file__, RUN_VARIANT, name, *flags]
        print("+", " ".join(command), flush=True)
        log = out.with_name(f"{out.stem}-{name}-seed{args.seed}-{args.epochs}ep.log")  # one line per epoch, as it runs
        with open(log, "w") as f:
            returncode = subprocess.run(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode
        if returncode:
            print(f"{name} failed, see {log}", file=sys.stderr)
            continue
        last_line = json.loads(log.read_text().strip().splitlines()[-1])
        summary = json.loads(Path(last_line["summary"]).read_text())  # the whole summary it names
        preset, padding, extra = VARIANTS[name]
        record = dict(variant=name, preset_changes=preset, crop_padding=padding, flags=extra, seed=args.seed,
                      validation_accuracy=summary["test_accuracy"], **summary)
        with open(out, "a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"{name}: validation accuracy {summary['test_accuracy']:.2%}, "
              f"{summary['images_per_s']:,.0f} img/s", flush=True)


def run_variant(name: str, train_flags: list) -> None:
    import common.data
    import common.model

    preset, padding, _ = VARIANTS[name]
    common.model.PRESETS["tiny"] = dict(FIRST_TINY, **preset)
    common.data.CROP_PADDING = padding
    sys.argv = [str(SINGLE), *train_flags]
    runpy.run_path(str(SINGLE), run_name="__main__")


if __name__ == "__main__":
    if sys.argv[1:2] == [RUN_VARIANT]:
        run_variant(sys.argv[2], sys.argv[3:])
    else:
        main()
