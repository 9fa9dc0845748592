"""The core talk, rehearsed: every command that the core's slides or notes tell the presenter or the room to run,
in the deck's order, timed against its slot.

    python slides/rehearse.py --out /tmp/rehearsal                       # synthetic data
    python slides/rehearse.py --data-dir DIR --out /tmp/rehearsal        # real CIFAR-10, as the room runs it
    python slides/rehearse.py --list                                     # the commands and their slots, no run
    python slides/rehearse.py --handout --out benchmarks/published/rehearsal   # slides/handout.md from a rehearsal

--out gets results.json and results.md only; the runs' checkpoints, outputs and logs go to --work (default: a
new temporary folder, kept, its path printed).

A slide's time is its minutes (the "~N min" of its presenter notes, read from slides/workshop.md at each run). What
fills it: the words on the slide and in its notes, said; its commands, typed and run; its diffs, walked through (the
rates: slide_budget below). REHEARSAL lists the commands as the deck shows them; tests/test_rehearsal.py fails when
the core shows a command that is not listed here, when a listed command no longer parses with its step's own parser,
or when a core slide, its words as the deck has them now and its runs as published, outgrows its minutes.

Each command runs as the deck shows it from the repository root, with four things added so that a rehearsal leaves
the tree as it found it and reads the data it is given: --data-dir DIR (or --data synthetic) on the steps that read
CIFAR-10, --checkpoint-dir and --out under the rehearsal's own folder, and a `checkpoints/` path of an earlier
command rewritten to that folder. RAY_ADDRESS is unset: every Ray command starts its own Ray, as in the room. Each
run waits until the 1-minute load average is below 1 (nothing else wants the cores, as on an attendee's laptop), at
most 10 minutes; the load at its start is recorded, and the load average before and after the rehearsal.

Writes OUT/results.json (the machine as benchmarks/compare_steps.py describes it, the date, the commit, the load
averages, and per command: its slide, slot, the command, what ran, the seconds it took, its exit code and the last
lines it printed), OUT/results.md (the same as a table) and WORK/logs/NN.log (each command's whole output).
"""
import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.record import ROOT, describe_commit, describe_machine, wait_until_quiet
from benchmarks.tables import changed_lines as counted_lines

DECK = ROOT / "slides" / "workshop.md"
APPENDIX = "Appendix"
MINUTES = re.compile(r"~\s*(\d+(?:\.\d+)?)\s*min\b")

# In the deck's order: (the title of the slide the command is run on, the command as the deck shows it).
REHEARSAL = [
    ("Step 01: the baseline",
     "python 01-vanilla-pytorch-ddp/train_single_machine.py --epochs 2 --steps-per-epoch 20 --lr 1e-3 "
     "--eval-images 1000"),
    ("Step 01: DDP by hand, under torchrun",
     "diff -u 01-vanilla-pytorch-ddp/train_single_machine.py 01-vanilla-pytorch-ddp/train_ddp.py"),
    ("Your turn: step 01, DDP under torchrun",
     "torchrun --nproc_per_node=2 01-vanilla-pytorch-ddp/train_ddp.py --epochs 2 --steps-per-epoch 20 --lr 1e-3 "
     "--eval-images 1000"),
    ("Step 02: Ray Train runs the same loop",
     "python 02-ray-train-ddp/train_ray_ddp.py --num-workers 2 --epochs 2 --steps-per-epoch 20 --lr 1e-3 "
     "--eval-images 1000"),
    ("Step 02: Ray Train runs the same loop",
     "diff -u 01-vanilla-pytorch-ddp/train_ddp.py 02-ray-train-ddp/train_ray_ddp.py"),
    ("Your turn: step 02, a crash and a restart",
     "python 02-ray-train-ddp/train_ray_ddp.py --num-workers 2 --epochs 2 --fail-at-epoch 1 --steps-per-epoch 20 "
     "--lr 1e-3 --eval-images 1000"),
    ("Step 04: FSDP2 `fully_shard`",
     "diff -u 02-ray-train-ddp/train_ray_ddp.py 04-ray-train-fsdp2/train_ray_fsdp2.py"),
    ("Your turn: step 04, FSDP2 on two workers",
     "python 04-ray-train-fsdp2/train_ray_fsdp2.py --num-workers 2 --epochs 2 --steps-per-epoch 20 --lr 1e-3 "
     "--eval-images 1000"),
    ("Step 05, live: a sweep cut to fit",
     "python 05-ray-tune/tune_ray_ddp.py --num-workers 1 --num-samples 2 --epochs 2 --steps-per-epoch 20 "
     "--lr 1e-3 --eval-images 500"),
    ("Your turn: step 06, classify with your model",
     "python 06-ray-data-inference/batch_inference.py --checkpoint checkpoints/ddp --actors 2 --eval-images 1000"),
]
# Commands the core shows that are not run during the talk, and why.
NOT_TIMED = {
    "python3 -m venv .venv": "before the workshop (the invitation)",
    ". .venv/bin/activate": "before the workshop (the invitation)",
    "pip install -r requirements.txt": "before the workshop (the invitation)",
    "pip install torch==2.14.1 torchvision==0.29.1 --index-url https://download.pytorch.org/whl/cpu":
        "before the workshop (the invitation)",
}
READS_DATA = ("train_single_machine.py", "train_ddp.py", "train_ray_ddp.py", "train_ray_fsdp2.py", "train_ray_fsdp.py",
              "tune_ray_ddp.py", "batch_inference.py", "train_ray_ddp_with_ray_data.py")
WRITES_OUT = ("tune_ray_ddp.py", "batch_inference.py")


@dataclass
class Slide:
    number: int
    title: str
    minutes: float
    text: str  # everything on the slide and in its notes, code included


def parse_deck(text: str) -> list:
    """The slides of the Marp deck: split at `---` lines outside code blocks and comments, after the front matter."""
    lines = text.splitlines()
    end = lines.index("---", 1)
    slides, current, fence, comment = [], [], False, False
    for line in lines[end + 1:]:
        if line.startswith("```"):
            fence = not fence
        elif not fence and "<!--" in line and "-->" not in line.split("<!--", 1)[1]:
            comment = True
        elif comment and "-->" in line:
            comment = False
        if line == "---" and not fence and not comment:
            slides.append(current)
            current = []
        else:
            current.append(line)
    slides.append(current)
    parsed = []
    for number, body in enumerate(slides, 1):
        title = next((line[2:].strip() for line in body if line.startswith("# ")), "")
        text = "\n".join(body)
        parsed.append(Slide(number, title, sum(float(m) for m in MINUTES.findall(text)), text))
    return parsed


def core(slides: list) -> list:
    divider = next(s.number for s in slides if s.title == APPENDIX)
    return slides[:divider - 1]


def deck_commands(slide: Slide) -> list:
    """The commands a slide tells someone to run: each command of its bash blocks (continuations joined, comments
    dropped, split at && and ;), and each presenter-note line that starts with `Live:`."""
    found = []
    for block in re.findall(r"^```bash\n(.*?)^```", slide.text, re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                found += [" ".join(part.split()) for part in re.split(r"&&|;", line) if part.strip()]
    for line in slide.text.splitlines():
        if line.strip().startswith("Live:"):
            found.append(" ".join(line.strip()[len("Live:"):].split()))
    return found


# A core slide's time: its words (on the slide and in its notes) said at a presenter's pace, its commands typed and
# run, and its diffs walked through. The rates are assumptions, stated here and in slides/README.md.
WORDS_PER_MINUTE = 130  # a presenter's pace (120-150 is common); every word of the notes, said
CHARACTERS_PER_MINUTE = 150  # a command copied from the slide by hand, about 30 words a minute
DIFF_LINES_PER_SECOND = 4  # changed lines of a diff, scrolled and pointed at hunk by hunk


def talk_words(slide: Slide) -> int:
    """Words the presenter says: the slide's prose and tables, and its notes, less code, markers and Live: lines."""
    notes = " ".join(re.findall(r"<!--(.*?)-->", slide.text, re.S))
    notes = re.sub(r"^\s*(_\w+:.*|Live:.*|numbers:.*|~\s*\d.*min)\s*$", "", notes, flags=re.M)
    body = re.sub(r"```.*?```", "", re.sub(r"<!--.*?-->", "", slide.text, flags=re.S), flags=re.S)
    return sum(any(c.isalnum() for c in word) for word in (notes + " " + body).split())  # not "#", "-", "|---|"


def changed_lines(diff_command: str) -> int:
    """The changed lines of a `diff -u OLD NEW` command, counted as the README's comparison table counts them."""
    return counted_lines(*shlex.split(diff_command)[-2:])


def slide_budget(slide: Slide, runs: list) -> dict:
    """Seconds of talk, typing, runs and diffs for one core slide, given its commands' measured runs."""
    commands = [r for r in runs if not r["command"].startswith("diff")]
    diffs = [r["command"] for r in runs if r["command"].startswith("diff")]
    parts = dict(talk_s=60 * talk_words(slide) / WORDS_PER_MINUTE,
                 typing_s=sum(60 * len(r["command"]) / CHARACTERS_PER_MINUTE for r in commands),
                 run_s=sum(r["seconds"] for r in commands),
                 diff_s=sum(changed_lines(d) for d in diffs) / DIFF_LINES_PER_SECOND)
    return dict(slide=slide.number, title=slide.title, slot_s=60 * slide.minutes,
                **{k: round(v, 1) for k, v in parts.items()}, total_s=round(sum(parts.values()), 1))


def budgets(slides: list, runs: list) -> list:
    """slide_budget for every core slide."""
    return [slide_budget(s, [r for r in runs if r["title"] == s.title]) for s in core(slides)]


def script_of(words: list) -> str | None:
    return next((w for w in words if re.fullmatch(r"0\d-[\w-]+/\w+\.py", w)), None)


def as_run(command: str, out: Path, data_dir: str | None) -> list:
    """The command as the rehearsal runs it: its data, checkpoints and outputs under `out` (see the docstring)."""
    words = shlex.split(command)
    words = [str(out / "checkpoints" / w[len("checkpoints/"):]) if w.startswith("checkpoints/") else w for w in words]
    script = script_of(words)
    if script is None or words[0] == "diff":  # a diff names two scripts: it runs neither
        return words
    name = Path(script).name
    if name in READS_DATA and "--data" not in words and "--data-dir" not in words:
        words += ["--data-dir", data_dir] if data_dir else ["--data", "synthetic"]
    if name != "batch_inference.py" and "--checkpoint-dir" not in words:
        step = re.search(r'^STEP = "(\w+)"', (ROOT / script).read_text(), re.M).group(1)
        words += ["--checkpoint-dir", str(out / "checkpoints" / step)]
    if name in WRITES_OUT and "--out" not in words:
        words += ["--out", str(out / "results" / Path(script).parent.name)]
    return words


RUN_DEADLINE_S = 600  # twice the longest slot: a run past it is stopped, with everything it started, and fails


def run_to_deadline(words: list, env: dict) -> subprocess.CompletedProcess:
    """The command's exit code and output (stderr in stdout); past RUN_DEADLINE_S its process group is killed (Ray's
    processes with it) and its exit code is 124, as timeout(1) says."""
    process = subprocess.Popen(words, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        out, _ = process.communicate(timeout=RUN_DEADLINE_S)
        return subprocess.CompletedProcess(words, process.returncode, out)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, _ = process.communicate()
        return subprocess.CompletedProcess(words, 124, out + f"\nkilled after {RUN_DEADLINE_S} s\n")


@dataclass
class Timed:
    slide: int
    title: str
    slot_min: float
    command: str
    ran: str
    seconds: float
    returncode: int
    ok: bool
    load_average_at_start: float  # the 1-minute load average as the command started
    last_lines: list


def last_lines(text: str, n: int = 50) -> list:
    """The last lines a command printed, progress bars dropped (tqdm redraws with carriage returns)."""
    lines = [line.split("\r")[-1].rstrip() for line in text.splitlines()]
    return [line for line in lines if line.strip() and "it/s]" not in line and "s/it]" not in line][-n:]


def rehearse(out: Path, data_dir: str | None, only: list | None = None) -> list:
    slides = {s.title: s for s in core(parse_deck(DECK.read_text()))}
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    (out / "logs").mkdir(parents=True, exist_ok=True)
    timed = []
    for i, (title, command) in enumerate(REHEARSAL, 1):
        if only and i not in only:
            continue
        slide = slides.get(title) or Slide(0, title, 0, "")  # a title the deck lost: tests/test_rehearsal.py says
        words = as_run(command, out, data_dir)
        print(f"[{i}/{len(REHEARSAL)}] slide {slide.number} ({slide.minutes:g} min): {command}", flush=True)
        load = round(os.getloadavg()[0], 2) if words[0] == "diff" else wait_until_quiet()
        start = time.monotonic()
        done = run_to_deadline(words, env)
        seconds = time.monotonic() - start
        (out / "logs" / f"{i:02d}.log").write_text(f"$ {shlex.join(words)}\n{done.stdout}")
        ok = done.returncode == 0 or (words[0] == "diff" and done.returncode == 1)  # diff: 1 means they differ
        ran = shlex.join(words).replace(str(out), "WORK").replace(data_dir or "WORK", "DIR")  # no machine's paths
        timed.append(Timed(slide.number, title, slide.minutes, command, ran, round(seconds, 1),
                           done.returncode, ok, load, last_lines(done.stdout)))
        print(f"    {seconds:.1f} s, exit code {done.returncode}", flush=True)
    return timed


def results_markdown(results: dict) -> str:
    lines = ["# The core talk, rehearsed", "",
             f"Measured on {results['machine']}; {results['date']}, commit {results['commit']}; "
             f"{results['data']}.", "",
             f"Load average (1, 5, 15 min) before: {results['load_average_before']}, after: "
             f"{results['load_average_after']}; {results['note']}", "",
             "| slide | command | slot | measured | load average at its start |", "|---|---|---|---|---|"]
    for c in results["commands"]:
        lines.append(f"| {c['slide']} {c['title']} | `{c['command']}` | {c['slot_min']:g} min | "
                     f"{c['seconds']:.1f} s{'' if c['ok'] else ', exit code ' + str(c['returncode'])} | "
                     f"{c['load_average_at_start']} |")
    lines += ["", f"Per core slide: its words said at {WORDS_PER_MINUTE} a minute, its commands typed at "
              f"{CHARACTERS_PER_MINUTE} characters a minute and run, its diffs walked through at "
              f"{DIFF_LINES_PER_SECOND} changed lines a second; the sum against the slide's minutes.", "",
              "| slide | talk | typing | runs | diffs | in all | its time |", "|---|---|---|---|---|---|---|"]
    for b in results["slides"]:
        lines.append(f"| {b['slide']} {b['title']} | {b['talk_s']:.0f} s | {b['typing_s']:.0f} s | {b['run_s']:.0f} s "
                     f"| {b['diff_s']:.0f} s | {b['total_s']:.0f} s | {b['slot_s']:.0f} s |")
    lines += ["", "Made by `python slides/rehearse.py` (its docstring says what it adds to each command).", ""]
    for c in results["commands"]:
        if c["last_lines"] and not c["command"].startswith("diff"):
            lines += [f"## Slide {c['slide']}: `{c['command']}`", "", "```text", *c["last_lines"], "```", ""]
    return "\n".join(lines)


HANDOUT = ROOT / "slides" / "handout.md"
INSTALL = ROOT / "benchmarks" / "published" / "install" / "results.json"  # benchmarks/install_size.py
# The lines of a run's output that say it is healthy; the rest of what it prints is cut (`...`).
HEALTHY = re.compile(r"^(epoch \d+/\d+ \||resumed from |accuracy |[\d,]+ images in |trial \S+ \(.*epoch|"
                     r"trial \S+: stopped|Best: |memory per rank|rank \d+ +\||.*A worker died)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def cpu_install() -> str:
    """README's install without an NVIDIA GPU: its second bash block, the CPU wheels first."""
    return re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)[1]


def handout_markdown(results: dict) -> str:
    """Every command of the core in the deck's order, who runs it, the lines a healthy run prints, and its time."""
    python = re.search(r'requires-python = ">=(\S+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    disk = json.loads(INSTALL.read_text())["gb"]
    lines = ["# Handout: the workshop's commands, in order", "",
             f"Before the day, from the repository root (Python {python} or later). Without an NVIDIA GPU, as on "
             f"most laptops, PyTorch's CPU wheels first (README's second block; about {disk['cpu']} GB on disk, not "
             f"{disk['readme']} GB):", "",
             "```bash", cpu_install(), "```", "",
             "With an NVIDIA GPU, README's first command instead, and on the day `export CUDA_VISIBLE_DEVICES=` "
             "in the shell you run the commands from: the room runs on CPUs (on one GPU, two processes or workers "
             "are refused, one per GPU; and a GPU's runs, in bf16, print other numbers than these). "
             "Then, in that venv, the commands below. With each: the lines a healthy run "
             "prints (the rest cut), and how long it took in the rehearsal on "
             f"{results['machine']} ({results['date']}, each run started at a 1-minute load average below 1). "
             "Your machine prints the same lines up to float rounding, in its own time.", "", *ray_start_line()]
    numbers = {slide.title: slide.number for slide in parse_deck(DECK.read_text())}  # the deck's, as it is now
    for c in results["commands"]:
        who = "you" if c["title"].startswith("Your turn") else "the presenter (follow along if you like)"
        lines += [f"## Slide {numbers[c['title']]}: {c['title']}", "", f"Run by {who}; {c['seconds']:.0f} s.", "",
                  "```bash", c["command"], "```", ""]
        plain = [ANSI.sub("", line) for line in c["last_lines"]]
        healthy = [re.sub(r"/\S*/checkpoints/", ".../checkpoints/", line) for line in plain if HEALTHY.match(line)]
        if healthy:
            lines += ["```text", *healthy, "```", ""]
    return "\n".join(lines)


def ray_start_line() -> list:
    """What a Ray command waits before it trains: the medians of benchmarks/ray_start.py --levers, if published."""
    path = ROOT / "benchmarks" / "published" / "ray-start-levers" / "results.json"
    if not path.exists():
        return []
    ray_start = json.loads(path.read_text())
    medians = {lever["name"]: lever["median_first_step_s"] for lever in ray_start["levers"]}
    return [f"Each Ray command waits before it trains: Ray Train starts a controller, helpers and workers for every "
            f"run, each importing Ray Train. On {ray_start['machine']} ({ray_start['date']}, `--model tiny`, medians "
            f"of {ray_start['rounds']} runs), step 02's first step came {medians['Ray, fresh']:.1f} s after its "
            f"launch, {medians['Ray, running cluster']:.1f} s on a Ray cluster already running, torchrun's "
            f"{medians['torchrun']:.1f} s (benchmarks/README.md, \"Ray's start\").", ""]


def machine() -> tuple:
    """The machine and the code, as benchmarks/compare_steps.py records them for its runs."""
    return describe_machine(), describe_commit()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", help="a folder holding CIFAR-10's cifar10_train.npz and cifar10_test.npz "
                                           "(default: synthetic data)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "rehearsal")
    parser.add_argument("--work", type=Path, help="the runs' checkpoints, outputs and logs (default: a temporary "
                                                  "folder)")
    parser.add_argument("--only", type=int, nargs="+", help="run only these commands (numbers from --list)")
    parser.add_argument("--note", default="", help="a line for results.md, such as who else used the machine")
    parser.add_argument("--list", action="store_true", help="print the commands and their slots, run nothing")
    parser.add_argument("--handout", action="store_true", help=f"write {HANDOUT.relative_to(ROOT)} from "
                                                                "OUT/results.json, run nothing")
    args = parser.parse_args()
    if args.handout:
        HANDOUT.write_text(handout_markdown(json.loads((args.out / "results.json").read_text())))
        return
    if args.list:
        slides = {s.title: s for s in core(parse_deck(DECK.read_text()))}
        for i, (title, command) in enumerate(REHEARSAL, 1):
            slide = slides.get(title) or Slide(0, f"not in the deck: {title}", 0, "")
            print(f"{i:2d}. slide {slide.number} ({slide.minutes:g} min): {command}")
        return
    if args.data_dir and not (Path(args.data_dir) / "cifar10_train.npz").is_file():
        raise SystemExit(f"error: --data-dir {args.data_dir} holds no cifar10_train.npz")
    described, commit = machine()  # at the start: the code that runs
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    before, started = [round(x, 2) for x in os.getloadavg()], datetime.now(timezone.utc)
    work = args.work or Path(tempfile.mkdtemp(prefix="rehearsal-"))
    print(f"checkpoints, outputs and logs: {work}", flush=True)
    timed = rehearse(work, args.data_dir, args.only)
    args.out.mkdir(parents=True, exist_ok=True)
    results = dict(machine=described, date=started.strftime("%Y-%m-%d"),
                   started_utc=started.strftime("%Y-%m-%d %H:%M UTC"), commit=commit,
                   data="CIFAR-10" if args.data_dir else "synthetic data",
                   uptime_before=uptime, load_average_before=before,
                   load_average_after=[round(x, 2) for x in os.getloadavg()],
                   note=args.note, commands=[asdict(t) for t in timed])
    results["slides"] = budgets(parse_deck(DECK.read_text()), results["commands"])
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "results.md").write_text(results_markdown(results))
    over = [t for t in timed if not t.ok] + [b for b in results["slides"] if b["total_s"] > b["slot_s"]]
    print(f"wrote {args.out / 'results.json'}; " + (f"{len(over)} over their slot or failed" if over
                                                     else "every slide within its minutes"))


if __name__ == "__main__":
    main()
