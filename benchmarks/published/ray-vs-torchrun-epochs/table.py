"""Renders the table of benchmarks/published/ray-vs-torchrun-epochs/README.md from its runs' results.json."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.compare_steps import steady_images_per_s  # noqa: E402  img/s as compare_steps counts it

P = Path("benchmarks/published/ray-vs-torchrun-epochs")
lines = ["| run, in order | epochs | torchrun DDP img/s | Ray DDP img/s | Ray / torchrun |"
         " Ray DDP, 2 s poll, img/s | 2 s poll / torchrun |",
         "|---|---|---|---|---|---|---|"]
for folder in sorted(p for p in P.iterdir() if (p / "results.json").exists()):
    results = json.loads((folder / "results.json").read_text())
    runs = {r["name"]: r["summary"] for r in results["runs"] if r["status"] == "ok"}
    rate = {name: steady_images_per_s(summary) for name, summary in runs.items()}
    ddp = rate["ddp"]
    poll = rate.get("ray_ddp_poll_2s")
    lines.append(f"| `{folder.name}/` | {runs['ddp']['epochs']} | {ddp:.1f} | {rate['ray_ddp']:.1f} | "
                 f"{rate['ray_ddp'] / ddp:.3f} | "
                 + (f"{poll:.1f} | {poll / ddp:.3f} |" if poll else "| |"))
print("\n".join(lines))
