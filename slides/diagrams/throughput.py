"""Training images/s of every run of the steps benchmark (benchmarks/published/steps/results.json), one bar per
run, named as the slides name them; grey: no Ray, blue: Ray Train DDP, green: FSDP.

    python throughput.py [OUT_DIR]     # prints the PNG's path, nothing else
"""
import json
from pathlib import Path

from style import DATA, INK, STORAGE, WEIGHTS, out_dir_arg, plt, save

HERE = Path(__file__).parent
doc = json.loads((HERE.parent.parent / "benchmarks/published/steps/results.json").read_text())
NAMES = {  # the slides' names (benchmarks/tables.py, SLIDE_RUN_NAMES), and the colour of each kind of run
    "single_machine": ("01 one process", STORAGE), "ddp": ("01 torchrun DDP", STORAGE),
    "ray_ddp_local": ("02 local mode", STORAGE), "ray_ddp_local_torchrun": ("02 local, torchrun", STORAGE),
    "ray_ddp_1_worker": ("02 Ray DDP, 1 worker", DATA), "ray_ddp": ("02 Ray DDP", DATA),
    "ray_ddp_poll_2s": ("02 Ray DDP, 2 s poll", DATA), "ray_ddp_data": ("02 Ray Data", DATA),
    "ray_fsdp": ("03 FSDP1", WEIGHTS), "ray_fsdp2": ("04 FSDP2", WEIGHTS),
    "ray_fsdp2_mp_offload": ("04 bf16 + offload", WEIGHTS)}
runs = [r for r in doc["runs"] if r["section"] == "steps" and r["status"] == "ok" and r["name"] in NAMES]


def steady(summary):
    """benchmarks.record.steady_images_per_s: the epochs after the first, when there are several."""
    later = summary["history"][1:] or summary["history"]
    return sum(h["images_per_s"] for h in later) / len(later)


fig = plt.figure(figsize=(11, 4.6))
ax = fig.add_axes([0.26, 0.17, 0.7, 0.8])
for y, run in enumerate(runs):
    name, color = NAMES[run["name"]]
    value = steady(run["summary"])
    ax.barh(y, value, height=0.72, color=color[1], edgecolor=color[0], lw=2)
    ax.text(value + 2, y, f"{value:,.0f}", va="center", fontsize=14)
ax.set_yticks(range(len(runs)))
ax.set_yticklabels([f"{NAMES[r['name']][0]} ({r['summary']['world_size']})" for r in runs], fontsize=14)
ax.invert_yaxis()
ax.set_xlim(0, max(steady(r["summary"]) for r in runs) * 1.12)
ax.set_xlabel("training images/s, steady state (processes in brackets)", fontsize=14)
ax.tick_params(axis="x", labelsize=13)
for side in ("top", "right"):
    ax.spines[side].set_visible(False)
epochs, cut = runs[0]["summary"]["epochs"], doc["steps_per_epoch"]
trained = f"{epochs} epochs of {cut} steps" if epochs > 1 else f"an epoch cut to {cut} steps"
fig.text(0.01, 0.015, f"{doc['date']}, {doc['machine'].split('; torch')[0]}: hybrid, {trained}, global batch 128",
         fontsize=12, color=INK)
print(save(fig, "throughput", out_dir_arg()))
