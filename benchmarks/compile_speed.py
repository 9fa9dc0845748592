"""Does torch.compile pay for itself on this machine? The recipe's training step, eager and compiled.

    python benchmarks/compile_speed.py --out benchmarks/published/compile-speed

Each measurement runs in a fresh process, with an empty compile cache, as a user's first run would:
--steps training steps of --model (`tiny` by default) at the recipe's batch (augmentation, forward,
label-smoothed loss, backward, AdamW) on random uint8 images, after one warm-up step, then one
evaluation call. The compiled model is compiled in place (`model.compile()`, so its state_dict keys
stay the same); its warm-up step and its first evaluation include its two compilations (training,
then evaluation). Eager and compiled alternate for --rounds rounds, so a drift in the machine's
speed hits both. results.json holds the images/s of each round, the compile time, and the images a run
must train before compiling has paid for itself, against the 500,000 of a 10-epoch CIFAR-10 run; tables.py
renders it as results.md.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # common/ and benchmarks/, also without `pip install -e .`
from benchmarks.compare_steps import describe_machine, last_line_printed  # noqa: E402
from benchmarks.tables import compile_speed_markdown  # noqa: E402
from common.flags import TRAIN_SIZES, make_parser  # noqa: E402
from common.model import PRESETS  # noqa: E402

RECIPE = make_parser(__doc__, "single_machine").parse_args([])  # the steps' defaults: lr, weight decay, smoothing
FULL_RUN_IMAGES = RECIPE.epochs * TRAIN_SIZES["cifar10"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=RECIPE.batch_size)
    parser.add_argument("--model", default=RECIPE.model, choices=PRESETS)
    parser.add_argument("--out", type=Path, default=Path("results/compile-speed"))
    parser.add_argument("--measure", choices=("eager", "compiled"), help=argparse.SUPPRESS)  # one, in this process
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure == "compiled", args.model, args.steps, args.batch_size)))
        return
    rows = [measure_in_fresh_process(mode, args) for _ in range(args.rounds) for mode in ("eager", "compiled")]
    write(rows, args)


def measure_in_fresh_process(mode: str, args) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        cmd = [sys.executable, __file__, "--measure", mode, "--model", args.model, "--steps", str(args.steps),
               "--batch-size", str(args.batch_size)]
        row = json.loads(last_line_printed(cmd, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}))
    print(json.dumps(row), flush=True)
    return row


def measure(compiled: bool, preset: str, steps: int, batch_size: int) -> dict:
    import torch
    from torch import nn

    from common.data import augment_batch
    from common.model import build_model
    from common.training import make_optimizer, predict

    torch.manual_seed(0)
    model = build_model(preset)
    optimizer = make_optimizer(model, RECIPE, torch.device("cpu"))
    if compiled:
        model.compile()
    criterion = nn.CrossEntropyLoss(label_smoothing=RECIPE.label_smoothing)
    images = torch.randint(0, 256, (batch_size, 3, 32, 32), dtype=torch.uint8)
    labels, ids = torch.randint(0, 10, (batch_size,)), torch.arange(batch_size)

    def train_step(step: int):
        loss = criterion(model(augment_batch(images, ids, step, 0)), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    start = time.perf_counter()
    train_step(0)
    first_step_s = time.perf_counter() - start
    start = time.perf_counter()
    for step in range(1, steps + 1):
        train_step(step)
    seconds = time.perf_counter() - start
    model.eval()  # evaluation needs a graph of its own: a second compilation
    start = time.perf_counter()
    with torch.no_grad():
        predict(model, images)
    first_evaluation_s = time.perf_counter() - start
    return dict(mode="compiled" if compiled else "eager", first_step_s=first_step_s,
                first_evaluation_s=first_evaluation_s, steps=steps, batch_size=batch_size,
                images_per_s=steps * batch_size / seconds, threads=torch.get_num_threads())


def write(rows: list, args) -> None:
    """results.json: every round, and the medians that say whether compiling pays for itself; results.md from it."""
    by_mode = {mode: [r for r in rows if r["mode"] == mode] for mode in ("eager", "compiled")}
    eager = statistics.median(r["images_per_s"] for r in by_mode["eager"])
    compiled = statistics.median(r["images_per_s"] for r in by_mode["compiled"])
    compile_s = sum(statistics.median(r[first] for r in by_mode["compiled"])
                    - statistics.median(r[first] for r in by_mode["eager"])
                    for first in ("first_step_s", "first_evaluation_s"))
    saved_per_image = 1 / eager - 1 / compiled
    command = (f"python benchmarks/compile_speed.py --model {args.model} --rounds {args.rounds} --steps {args.steps} "
               f"--out {args.out}")
    results = dict(command=command, machine=describe_machine(), model=args.model, batch_size=args.batch_size,
                   steps=args.steps, full_run_images=FULL_RUN_IMAGES, rows=rows, eager_images_per_s=eager,
                   compiled_images_per_s=compiled, compile_s=compile_s,
                   break_even_images=compile_s / saved_per_image if saved_per_image > 0 else None)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    table = compile_speed_markdown(results)
    (args.out / "results.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
