"""FSDP: each rank holds 1/N of every block; a block's full weights exist only while it runs."""
from matplotlib.patches import Rectangle

from style import COMM, GRADS, INK, OPTIM, STORAGE, WEIGHTS, arrow, canvas, out_dir_arg, save

fig, ax = canvas(1100, 450)


def outline(x, y, w, h, dashed=True):
    ax.add_patch(Rectangle((x, y), w, h, fc="none", ec=STORAGE[0], lw=1.8, ls="--" if dashed else "-"))


def strips(x, y, w, parts):
    """Stack filled strips upwards from (x, y): parts is [(height, colour), ...]."""
    for h, (line, fill) in parts:
        ax.add_patch(Rectangle((x, y), w, h, fc=fill, ec=line, lw=1.8))
        y += h


# Left: what each rank holds. Per block: weights, gradients, AdamW state (2x the weights' bytes).
SHARD = [(15, WEIGHTS), (15, GRADS), (30, OPTIM)]
for k in range(4):
    x = 120 + k * 86
    ax.text(x + 35, 418, f"block {k + 1}", ha="center", fontsize=14)
    for rank, y in ((0, 268), (1, 108)):
        outline(x, y, 70, 120)
        strips(x, y + 60 if rank == 0 else y, 70, SHARD)
for rank, y in ((0, 328), (1, 168)):
    ax.text(100, y, f"rank {rank}", ha="right", va="center", fontsize=16, weight="bold")
for i, (label, color) in enumerate([("weights", WEIGHTS), ("gradients", GRADS), ("AdamW state", OPTIM)]):
    x = 20 + i * 150 + (20 if i else 0)
    ax.add_patch(Rectangle((x, 38), 22, 22, fc=color[1], ec=color[0], lw=1.8))
    ax.text(x + 30, 49, label, va="center", fontsize=15)
ax.plot([475, 475], [90, 430], color=STORAGE[1], lw=2)


# Right: the sequence for each block, on every rank.
def icon(x, y, color, half):
    """A block: full (solid) or this rank's half (the other half dashed)."""
    outline(x, y, 46, 80, dashed=half)
    strips(x, y + 40 if half else y, 46, [(40 if half else 80, color)])


def step(x0, x1, y, label, color):
    arrow(ax, (x0, y), (x1, y), color=color[0] if color else INK)
    ax.text((x0 + x1) / 2, y + 58, label, ha="center", va="center", fontsize=15,
            color=color[0] if color else INK, weight="bold" if color else "normal")


X = (505, 676, 842, 1008)    # the icons of a row; arrows between them
rows = (("forward: each block in turn", 250), ("backward: each block, in reverse", 60))
for name, y in rows:
    ax.text(500, y + 135, name, fontsize=16, weight="bold", va="center")
    icon(X[0], y, WEIGHTS, half=True)
    step(X[0] + 56, X[1] - 10, y + 40, "all-gather", COMM)
    icon(X[1], y, WEIGHTS, half=False)

fy = 250 + 40
step(X[1] + 56, X[2] - 10, fy, "compute", None)
ax.text((X[1] + X[2] + 46) / 2, fy - 28, "then free", ha="center", va="center", fontsize=15,
        color=STORAGE[0])
icon(X[2], 250, WEIGHTS, half=True)
ax.text(X[2] + 62, fy, "back to\nmy shard", va="center", fontsize=15, color=STORAGE[0], linespacing=1.3)

by = 60 + 40
step(X[1] + 56, X[2] - 10, by, "grads", None)
icon(X[2], 60, GRADS, half=False)
step(X[2] + 56, X[3] - 10, by, "reduce-scatter", COMM)
icon(X[3], 60, GRADS, half=True)
ax.text(X[3] + 23, 60 - 22, "my shard", ha="center", va="center", fontsize=14, color=GRADS[0])

print(save(fig, "fsdp", out_dir_arg()))
