"""Where one training step's time goes, per strategy and rank, from benchmarks/published/profile/results.json (the
mean of the profiled steps): forward, backward, optimizer and the rest, stacked; the time the collectives took,
and how much of it overlapped compute, written beside each bar.

    python profile.py [OUT_DIR]     # prints the PNG's path, nothing else
"""
import json
import re
from pathlib import Path

from matplotlib.patches import Patch

from style import DATA, GRADS, INK, OPTIM, STORAGE, out_dir_arg, plt, save

HERE = Path(__file__).parent
doc = json.loads((HERE.parent.parent / "benchmarks/published/profile/results.json").read_text())
PARTS = [("forward_ms", "forward", DATA), ("backward_ms", "backward", GRADS), ("optimizer_ms", "optimizer", OPTIM),
         ("other_ms", "other", STORAGE)]


STEP = re.compile(r" [(]step \d+[)]")  # "DDP (step 02)" as "DDP": the legend line under the chart names the steps


def mean(steps, key):
    return sum(s[key] for s in steps) / len(steps)


rows = [(f"{STEP.sub('', v['title'])}, rank {r['rank']}", r["steps"]) for v in doc["variants"] if v["status"] == "ok"
        for r in v["ranks"]]
fig = plt.figure(figsize=(11, 4.6))
ax = fig.add_axes([0.27, 0.25, 0.47, 0.73])
for y, (_, steps) in enumerate(rows):
    left = 0.0
    for key, _, color in PARTS:
        width = mean(steps, key)
        ax.barh(y, width, left=left, height=0.72, color=color[1], edgecolor=color[0], lw=1.5)
        left += width
    comm, overlap = mean(steps, "communication_ms"), mean(steps, "overlapped_ms")
    ax.text(left + 20, y, f"comm. {comm:,.0f} ms, {overlap / comm:.0%} overlapped" if comm else "no comm.",
            va="center", fontsize=12)
ax.set_yticks(range(len(rows)))
ax.set_yticklabels([name for name, _ in rows], fontsize=12.5)
ax.invert_yaxis()
ax.set_xlabel("milliseconds per optimizer step", fontsize=14)
ax.tick_params(axis="x", labelsize=13)
for side in ("top", "right"):
    ax.spines[side].set_visible(False)
ax.legend(handles=[Patch(facecolor=c[1], edgecolor=c[0], label=label) for _, label, c in PARTS], fontsize=12.5,
          loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=4, frameon=False)
machine = re.sub(r" [(]family [^)]*[)]", "", doc["machine"].split("; torch")[0])
fig.text(0.01, 0.015, f"{doc['date']}, {machine}: hybrid, 2 workers, the mean of {doc['profile_steps']} steps; "
         "DDP is step 02, FSDP1 03, FSDP2 04", fontsize=12, color=INK)
print(save(fig, "profile", out_dir_arg()))
