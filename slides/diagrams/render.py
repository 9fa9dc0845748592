"""Re-render every diagram in this folder: NAME.png (2x its display size) and NAME.svg beside each source.

    python slides/diagrams/render.py [--results PATH]     # --results: the memory chart's results.json

Needs matplotlib and Pillow (the repository's .venv has both) and Graphviz's `dot`. A .dot file names its
display size in a `// canvas: WxH` line; its drawing, rendered at 1 point = 1 display pixel, is centred on a
white canvas of that size, and a drawing larger than its canvas is an error (shrinking it would shrink
its fonts below the slides' minimum). A .py file is a matplotlib script that writes its own PNG and SVG.
"""
import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

from style import SCALE  # this folder's: a script's own folder is first on its import path

HERE = Path(__file__).resolve().parent

SCRIPTS = ["ddp.py", "fsdp.py", "ring-allreduce.py", "torchrun-vs-ray.py", "memory.py", "throughput.py", "sweep.py",
           "profile.py"]


def render_dot(src):
    width, height = map(int, re.search(r"^// canvas: (\d+)x(\d+)", src.read_text(), re.M).groups())
    subprocess.run(["dot", "-Tsvg", str(src), "-o", str(src.with_suffix(".svg"))], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.png"
        subprocess.run(["dot", "-Tpng", f"-Gdpi={72 * SCALE}", str(src), "-o", str(raw)], check=True)
        drawing = Image.open(raw).convert("RGB")
    canvas = Image.new("RGB", (width * SCALE, height * SCALE), "white")
    if drawing.width > canvas.width or drawing.height > canvas.height:
        sys.exit(f"{src.name}: the drawing, {drawing.width // SCALE}x{drawing.height // SCALE}, is larger "
                 f"than its canvas, {width}x{height}: make it smaller or the canvas larger")
    canvas.paste(drawing, ((canvas.width - drawing.width) // 2, (canvas.height - drawing.height) // 2))
    png = src.with_suffix(".png")
    canvas.save(png, optimize=True)
    return png


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", help="results.json for memory.py (default: "
                        "benchmarks/published/steps/results.json)")
    args = parser.parse_args()
    for src in sorted(HERE.glob("*.dot")):
        print(render_dot(src))
    for script in SCRIPTS:
        extra = [args.results] if script == "memory.py" and args.results else []
        out = subprocess.run([sys.executable, str(HERE / script), *extra], check=True,
                             capture_output=True, text=True).stdout
        print(out.strip())


if __name__ == "__main__":
    main()
