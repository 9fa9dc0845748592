"""Ring all-reduce over 4 ranks, the gradient in 4 chunks: reduce-scatter, then all-gather."""
from matplotlib.patches import Rectangle

from style import COMM, GRADS, INK, arrow, canvas, out_dir_arg, save

N, CELL = 4, 44
TOP, BOT = 330, 190     # y of the two rows of the ring
fig, ax = canvas(1100, 450)
SHADES = {1: GRADS[1], 2: "#F8D68F", 3: "#F2BE55", N: GRADS[0]}   # ranks summed into a chunk


def ring(x0, counts, title, caption):
    """One panel: 4 ranks in a ring, each with its 4 chunks shaded by how many ranks they sum."""
    ax.text(x0 + 270, 420, title, ha="center", va="center", fontsize=17, weight="bold")
    centres = [(x0 + 140, TOP), (x0 + 400, TOP), (x0 + 400, BOT), (x0 + 140, BOT)]
    for rank, (cx, cy) in enumerate(centres):
        left = cx - N * CELL / 2
        for c in range(N):
            n = counts(rank, c)
            ax.add_patch(Rectangle((left + c * CELL, cy - CELL / 2), CELL, CELL, fc=SHADES[n], ec=INK, lw=1.5))
            if n == N:
                ax.text(left + (c + 0.5) * CELL, cy, "Σ", ha="center", va="center", fontsize=18,
                        color="white", weight="bold")
        ax.text(cx, cy + (40 if rank < 2 else -40), f"rank {rank}", ha="center", va="center", fontsize=15)
    # the ring: each rank sends to the next
    half = N * CELL / 2 + 8
    arrow(ax, (x0 + 140 + half, TOP), (x0 + 400 - half, TOP), color=COMM[0], lw=3)
    arrow(ax, (x0 + 400, TOP - CELL / 2 - 14), (x0 + 400, BOT + CELL / 2 + 14), color=COMM[0], lw=3)
    arrow(ax, (x0 + 400 - half, BOT), (x0 + 140 + half, BOT), color=COMM[0], lw=3)
    arrow(ax, (x0 + 140, BOT + CELL / 2 + 14), (x0 + 140, TOP - CELL / 2 - 14), color=COMM[0], lw=3)
    ax.text(x0 + 270, 80, caption, ha="center", va="center", fontsize=15, linespacing=1.3)


# after reduce-scatter, rank r's chunk c sums (r - c) mod N + 1 ranks: chunk r+1 is complete
ring(0, lambda r, c: (r - c) % N + 1, "1. reduce-scatter: N−1 = 3 steps",
     "each step: pass a chunk on, add yours\n→ each rank owns one full sum Σ")
ring(560, lambda r, c: N, "2. all-gather: N−1 = 3 steps",
     "each step: pass a finished Σ on\n→ every rank has every sum")
ax.plot([550, 550], [60, 440], color="#E6E6E6", lw=2)
ax.text(550, 22, "each rank sends and receives 2(N−1)/N of the tensor: under 2×, whatever N",
        ha="center", va="center", fontsize=15, color=COMM[0], weight="bold")

print(save(fig, "ring-allreduce", out_dir_arg()))
