"""The memory lesson, from the memory section of a compare_steps.py results.json: DDP vs FSDP2 on one machine.

Each bar is what all ranks hold together in the machine's RAM, one block per rank (parameters, gradients,
AdamW state); a run that was skipped or failed is drawn hatched at what it would need, from the exact
1-worker numbers (DDP: the same on every rank; FSDP2: 1/N per rank).

    python memory.py [RESULTS_JSON] [OUT_PNG]     # prints the PNG's path, nothing else
"""
import json
import re
import sys
from pathlib import Path

from matplotlib.patches import Patch
from matplotlib.lines import Line2D

from style import CRASH, GRADS, INK, OPTIM, STORAGE, WEIGHTS, plt, save

HERE = Path(__file__).parent
results = Path(sys.argv[1]) if len(sys.argv) > 1 else \
    HERE.parent.parent / "benchmarks/published/steps/results.json"
out = Path(sys.argv[2]) if len(sys.argv) > 2 else HERE / "memory.png"
doc = json.loads(results.read_text())
runs = [r for r in doc["runs"] if r["section"] == "memory" and not r["flags"]]
STRATEGIES = {"ray_ddp": "DDP", "ray_fsdp2": "FSDP2"}
PARTS = [("params_mb", "parameters", WEIGHTS), ("grads_mb", "gradients", GRADS),
         ("optimizer_mb", "AdamW state", OPTIM)]

# The machine's RAM: the skip reasons say it exactly ("... of 23.5 GiB of RAM"); else the machine line.
text = " ".join(r["skipped"] or "" for r in runs)
ram = re.search(r"([\d.]+) GiB of RAM", text) or re.search(r"([\d.]+) GiB RAM", doc["machine"])
ram = float(ram.group(1))


def state(rank_report):
    """A rank's (parameters, gradients, AdamW state) in GiB."""
    return [rank_report[key] / 1024 for key, _, _ in PARTS]


one = {r["step"]: state(r["summary"]["memory_per_rank"][0])
       for r in runs if r["workers"] == 1 and r["status"] == "ok"}

fig = plt.figure(figsize=(11, 4.5))
ax = fig.add_axes([0.075, 0.25, 0.6, 0.72])
YMAX, CLIP = 48, 40            # a bar taller than CLIP is cut there, its total written above it
workers = sorted({r["workers"] for r in runs})
ticks = []
for g, n in enumerate(workers):
    for s, (step, name) in enumerate(STRATEGIES.items()):
        run = next(r for r in runs if r["step"] == step and r["workers"] == n)
        x, ok = g * 3 + s, run["status"] == "ok"
        if ok:
            ranks = [state(m) for m in run["summary"]["memory_per_rank"]]
        else:  # what it would need, from the 1-worker run
            ranks = [[v if step == "ray_ddp" else v / n for v in one[step]]] * n
        y = 0
        for rank in ranks:
            for v, (_, _, color) in zip(rank, PARTS, strict=True):
                if y < CLIP:
                    ax.bar(x, min(v, CLIP - y), bottom=y, width=0.8, color=color[1], edgecolor=color[0],
                           hatch=None if ok else "//", lw=1.2)
                y += v
            if n > 1 and y < CLIP:  # a white gap between ranks
                ax.plot([x - 0.4, x + 0.4], [y, y], color="white", lw=3)
        top = min(y, CLIP)
        if y > CLIP:  # a break mark
            ax.plot([x - 0.45, x + 0.45], [CLIP - 2.5, CLIP - 1], color="white", lw=5)
        if ok:  # measured peak resident memory, all ranks together
            peak = sum(run["summary"]["peak_memory_mb"]) / 1024
            ax.plot([x - 0.48, x + 0.48], [peak, peak], color=INK, lw=3)
            top = max(top, peak)
        per_rank = sum(ranks[0])
        ticks.append((x, f"{name}\n{per_rank:.1f}" if n == 1 else f"{name}\n{n}×{per_rank:.1f}"))
        if not ok:
            why = f"{y:.1f}: does not fit" if run["status"] == "skipped" else \
                "killed:\nout of\nmemory" if "OutOfMemory" in (run["error"] or "") else "failed"
            ax.text(x, top + 0.8, why, ha="center", va="bottom", fontsize=14, color=CRASH, weight="bold",
                    linespacing=1.1, zorder=5, bbox=dict(fc="white", ec="none", pad=1))

ax.axhline(ram, color=CRASH, lw=2.5, ls="--")
ax.text(-0.5, ram + 0.6, f"RAM: {ram:g} GiB", color=CRASH, ha="left", va="bottom", fontsize=15,
        weight="bold")
ax.set_ylim(0, YMAX)
ax.set_xlim(-0.6, len(workers) * 3 - 1.4)
ax.set_xticks(*zip(*ticks, strict=True), fontsize=14)
for g, n in enumerate(workers):
    ax.text(g * 3 + 0.5, -0.2, f"{n} worker{'s' if n > 1 else ''}", ha="center", va="top", fontsize=15,
            weight="bold", transform=ax.get_xaxis_transform())
ax.set_ylabel("GiB, all ranks together", fontsize=15)
ax.tick_params(axis="y", labelsize=14)
ax.spines[["top", "right"]].set_visible(False)

handles = [Patch(fc=c[1], ec=c[0], label=label) for _, label, c in PARTS] + [
    Patch(fc="white", ec=STORAGE[0], hatch="//", label="not trained: would need"),
    Line2D([], [], color=INK, lw=3, label="measured peak")]
fig.legend(handles=handles, loc="center left", bbox_to_anchor=(0.7, 0.55), fontsize=15, frameon=False,
           handlelength=1.6)
fig.text(0.71, 0.1, "under a bar:\nGiB per rank", fontsize=15, color=STORAGE[0], linespacing=1.2)

save(fig, out.stem, out.parent)
print(out)
