"""Renders the table of benchmarks/published/cpu-share-niceness/README.md from its runs' results.json."""
import json
from pathlib import Path

P = Path("benchmarks/published/cpu-share-niceness")
DEFAULT = "15 (Ray's default)"
ORDER = [("torchrun_ddp", "torchrun DDP", "n/a"), ("ray_ddp", "Ray DDP", DEFAULT), ("ray_ddp_nice0", "Ray DDP", "0"),
         ("ray_ddp_2", "Ray DDP", DEFAULT), ("ray_ddp_nice0_2", "Ray DDP", "0"), ("ray_ddp_3", "Ray DDP", DEFAULT),
         ("ray_ddp_nice0_3", "Ray DDP", "0"), ("torchrun_ddp_2", "torchrun DDP", "n/a")]
lines = ["| run, in order | launcher | workers' nice | optimizer steps/s | training threads (cores) |"
         " kernel took a training thread's core (per s) | other processes (cores) |",
         "|---|---|---|---|---|---|---|"]
for folder, launcher, nice in ORDER:
    r = json.loads((P / folder / "results.json").read_text())
    threads = [p["training_thread"] for p in r["training_processes"]]
    taken = ", ".join("%.0f" % t["involuntary_switches_per_s"] for t in threads)
    others = sum(p["cores"] for p in r["other_processes"])
    lines.append(f"| `{folder}/` | {launcher} | {nice} | {r['steps_per_s']:.3f} | "
                 f"{sum(t['cores'] for t in threads):.3f} | {taken} | {others:.3f} |")
print("\n".join(lines))
