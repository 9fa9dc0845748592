"""The published sweep of step 05 (benchmarks/published/tune-sweep/results.json): validation accuracy after each
epoch, one line per trial, labelled by its searched flags; a trial ASHA stopped ends in a cross.

    python sweep.py [OUT_DIR]     # prints the PNG's path, nothing else
"""
import json
from pathlib import Path

from style import COMM, DATA, GRADS, INK, OPTIM, STORAGE, WEIGHTS, out_dir_arg, plt, save

HERE = Path(__file__).parent
doc = json.loads((HERE.parent.parent / "benchmarks/published/tune-sweep/results.json").read_text())
COLOURS = [INK, DATA[0], GRADS[0], WEIGHTS[0], OPTIM[0], COMM[0], STORAGE[0], "#C62828"]


def label(trial):
    """`--lr 0.002 --warmup-epochs 1 --weight-decay 0.05` as `lr 0.002, warmup 1, decay 0.05`."""
    words = trial["searched"].split()
    short = {"--lr": "lr", "--warmup-epochs": "warmup", "--weight-decay": "decay"}
    text = ", ".join(f"{short.get(k, k)} {v}" for k, v in zip(words[::2], words[1::2], strict=True))
    return text + (" (the recipe)" if trial["trial_id"].endswith("00000") else "")


fig = plt.figure(figsize=(11, 4.6))
ax = fig.add_axes([0.08, 0.17, 0.45, 0.8])
for i, trial in enumerate(sorted(doc["trials"], key=lambda t: t["trial_id"])):
    epochs = [h["epoch"] for h in trial["history"]]
    accuracy = [100 * h["validation_accuracy"] for h in trial["history"]]
    recipe = trial["trial_id"].endswith("00000")
    ax.plot(epochs, accuracy, color=COLOURS[i % len(COLOURS)], lw=4 if recipe else 2.5, marker="o", ms=7,
            label=label(trial), zorder=3 if recipe else 2)
    if trial["stopped_early"]:
        ax.plot(epochs[-1], accuracy[-1], marker="x", ms=16, mew=3, color=COLOURS[i % len(COLOURS)])
epochs = max(t["epochs_run"] for t in doc["trials"])
ax.set_xticks(range(1, epochs + 1))
ax.set_xlabel("epoch", fontsize=14)
ax.set_ylabel("validation accuracy (%)", fontsize=14)
ax.tick_params(labelsize=13)
for side in ("top", "right"):
    ax.spines[side].set_visible(False)
ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=12.5, frameon=False,
          title="searched flags (x: stopped by ASHA)", title_fontsize=12.5)
cfg = doc["trials"][0]["config"]
fig.text(0.01, 0.015, f"{len(doc['trials'])} trials of `{cfg['model']}`, {cfg['epochs']} epochs of "
         f"{cfg['steps_per_epoch']} steps, {doc['cluster']}".replace("`", ""), fontsize=12, color=INK)
print(save(fig, "sweep", out_dir_arg()))
