"""DDP: every rank a full replica, its own shard of the batch; gradients all-reduced during backward."""
from style import COMM, DATA, GRADS, STORAGE, WEIGHTS, arrow, box, canvas, out_dir_arg, save

fig, ax = canvas(1100, 450)
BUCKETS = (580, 690, 800)     # x of each gradient bucket's all-reduce

ax.text(20, 418, "global batch, split in 2", ha="left", va="center", fontsize=15, color=DATA[0], weight="bold")
for rank, y in ((0, 280), (1, 80)):           # y: bottom of the rank's row
    # its shard of the batch: 4 of the 8 images
    for i in range(4):
        box(ax, 26, y + 4 + i * 24, 22, 20, color=DATA, lw=1.5, rounding=3)
    arrow(ax, (58, y + 50), (88, y + 50), color=DATA[0])
    # a full replica of the model
    box(ax, 92, y, 160, 100, f"rank {rank}\nfull model", color=WEIGHTS, size=16)
    arrow(ax, (256, y + 50), (290, y + 50))

    # its timeline
    main = y + 25                                   # forward | backward | step bar
    box(ax, 296, main, 170, 50, "forward", color=STORAGE, size=16)
    box(ax, 466, main, 330, 50, "backward", color=GRADS, size=16)
    box(ax, 900, main, 170, 50, "AdamW step", color=WEIGHTS, size=16)
    # all-reduce buckets: start while backward still runs
    ar_y = main - 38 if rank == 0 else main + 58
    for x in BUCKETS:
        box(ax, x, ar_y, 62, 30, color=COMM, lw=1.5, rounding=4)

# the exchange between the ranks, bucket by bucket
for x in BUCKETS:
    arrow(ax, (x + 31, 265), (x + 31, 195), color=COMM[0], style="<|-|>", ms=16)
ax.text(555, 230, "all-reduce (average)\nbucket by bucket,\nwhile backward runs", ha="right",
        va="center", fontsize=15, color=COMM[0], weight="bold", linespacing=1.3)
ax.text(985, 230, "same update,\nsame weights", ha="center", va="center", fontsize=15,
        color=WEIGHTS[0], weight="bold", linespacing=1.3)

# time axis
arrow(ax, (296, 40), (1070, 40), color=STORAGE[0], lw=2)
ax.text(1070, 16, "time", ha="right", va="center", fontsize=14, color=STORAGE[0])

print(save(fig, "ddp", out_dir_arg()))
