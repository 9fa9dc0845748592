"""What you launch and what runs: torchrun (one command per node) vs Ray (one command, from anywhere)."""
from matplotlib.patches import Ellipse

from style import COMM, CRASH, STORAGE, arrow, box, canvas, out_dir_arg, save

fig, ax = canvas(1100, 450)
MONO = dict(family="DejaVu Sans Mono")
NODES = (15, 285)          # x of the two node boxes, within a panel


def node(x0, x, title, procs):
    """A machine with its two processes."""
    box(ax, x0 + x, 105, 230, 120, color=STORAGE, fill="white", lw=2)
    ax.text(x0 + x + 115, 200, title, ha="center", va="center", fontsize=15)
    for i, p in enumerate(procs):
        box(ax, x0 + x + 7 + i * 112, 120, 104, 46, p, color=STORAGE, size=14)


def crash(x0, bold, rest):
    ax.text(x0 + 275, 68, bold, ha="center", va="center", fontsize=16, color=CRASH, weight="bold")
    ax.text(x0 + 275, 36, rest, ha="center", va="center", fontsize=16, color=CRASH)


# torchrun: one command per node, meeting at a rendezvous endpoint
ax.text(275, 422, "torchrun", ha="center", va="center", fontsize=20, weight="bold")
for n, x in enumerate(NODES):
    box(ax, x + 25, 310, 180, 70, "torchrun\n--nnodes 1:2", fill="white", size=15, fontdict=MONO)
    arrow(ax, (x + 115, 308), (x + 115, 228))
    node(0, x, f"node {n}", (f"rank {2 * n}", f"rank {2 * n + 1}"))
ax.add_patch(Ellipse((275, 262), 210, 62, fc=COMM[1], ec=COMM[0], lw=2))
ax.text(275, 262, "rendezvous\nnode 0:29500", ha="center", va="center", fontsize=15, color=COMM[0])
for x in (225, 325):
    ax.plot([x, x + (-30 if x < 275 else 30)], [286, 308], color=COMM[0], lw=2, ls="--")
crash(0, "a crash restarts every rank", "with --max-restarts; the script resumes itself")

ax.plot([550, 550], [20, 440], color=STORAGE[1], lw=2)

# Ray: ray start once per node; one python command from anywhere; Ray places the workers
X = 555
ax.text(X + 275, 422, "Ray", ha="center", va="center", fontsize=20, weight="bold")
box(ax, X + 70, 315, 410, 70, fill="white")
ax.text(X + 275, 365, "python train_ray_ddp.py", ha="center", va="center", fontsize=15, **MONO)
ax.text(X + 275, 333, "once, from any node", ha="center", va="center", fontsize=15, color=STORAGE[0])
box(ax, X + 110, 244, 330, 46, "TorchTrainer places workers", color=COMM, size=15)
arrow(ax, (X + 275, 313), (X + 275, 292))
for n, x in enumerate(NODES):
    arrow(ax, (X + 275 + (n * 2 - 1) * 60, 242), (X + x + 115, 228))
    node(X, x, f"node {n}: ray start", (f"worker {2 * n}", f"worker {2 * n + 1}"))
crash(X, "a crash restarts the worker group", "from the last checkpoint")

print(save(fig, "torchrun-vs-ray", out_dir_arg()))
