"""What the documents tell an attendee to paste, and what they say it prints, is true of the scripts.

- Every command in a fenced bash block of the READMEs, TROUBLESHOOTING.md and the slides names a script that
  exists, with flags that the script's own parser accepts (parsed by it, its checks skipped: placeholders such as
  DIR stand for the attendee's folders). A shell launcher's flags are its case labels.
- Every command is safe to paste on an attendee's machine: no path into this repository's offline copy of
  CIFAR-10, no flag value meaningful only for it, no output into benchmarks/published/ (benchmarks/README.md's
  maintainer section excepted).
- Every `diff -u OLD NEW` the documents name compares two files that exist.
- Every "what you'll see" block (a ```text block right after `<!-- output: SCRIPT -->`) is what SCRIPT prints:
  each line is one that a print of the script or of common/ can produce (matched against the f-strings in their
  source), a progress bar, or the JSON summary with keys the script writes, in its order.
"""
import argparse
import ast
import glob
import re
import sys
from pathlib import Path

import pytest

from conftest import ROOT, load_script

DOCUMENTS = sorted({p for pattern in ("README.md", "0*/README.md", "TROUBLESHOOTING.md", "tests/README.md",
                                      "benchmarks/README.md", "slides/README.md", "slides/workshop.md")
                    for p in ROOT.glob(pattern)})
MAINTAINERS = "## Maintainers"  # benchmarks/README.md's section that may write into benchmarks/published/
UNSAFE = ["../shared", "shared/data", "--eval-images 1017", "--out benchmarks/published"]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(document: Path, lang: str) -> list[str]:
    return [body for kind, body in FENCE.findall(document.read_text()) if kind == lang]


def commands(block: str) -> list[list[str]]:
    """The commands of a bash block, continuations joined, comments dropped, split at && ; |."""
    joined = block.replace("\\\n", " ")
    found = []
    for line in joined.splitlines():
        line = line.split(" #")[0].strip()
        if line and not line.startswith("#"):
            found += [part.split() for part in re.split(r"&&|;|\|", line) if part.strip()]
    return found


def script_commands():
    for document in DOCUMENTS:
        for block in blocks(document, "bash"):
            for words in commands(block):
                if words[0] in ("diff", "git", "cat", "ls", "cd"):  # they name files, not a script to run
                    continue
                for i, word in enumerate(words):
                    if word.endswith((".py", ".sh")) and "/" in word:
                        yield pytest.param(document, word, words[i + 1:],
                                           id=f"{document.relative_to(ROOT)}: {' '.join(words)[:70]}")


class Parsed(Exception):
    """Raised instead of running a script, once its parser has accepted the flags."""


ARGPARSE = argparse.ArgumentParser.parse_args


def parse_only(self, args=None, namespace=None):
    raise Parsed(ARGPARSE(self, args, namespace))


@pytest.mark.parametrize("document, script, flags", list(script_commands()))
def test_every_pasted_command_runs_a_script_with_flags_it_accepts(document, script, flags, monkeypatch, capsys):
    found = glob.glob(script, root_dir=ROOT)
    assert len(found) == 1 and (ROOT / found[0]).is_file(), f"{document.name}: no script {script}"
    path = ROOT / found[0]
    if path.suffix == ".sh":
        labels = set(re.findall(r"^\s*([-\w|]+)\)", path.read_text(), re.M))
        accepted = {flag for label in labels for flag in label.split("|")}
        for flag in [f for f in flags if f.startswith("--") and f != "--"]:
            assert flag.split("=")[0] in accepted or "--" in flags[:flags.index(flag)], f"{path.name}: no {flag}"
        return
    from common import flags as common_flags

    monkeypatch.setattr(common_flags.Parser, "parse_args", parse_only)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    monkeypatch.setattr(sys, "argv", [str(path), *flags])
    monkeypatch.syspath_prepend(str(path.parent))  # the benchmarks import each other
    with pytest.raises((Parsed, SystemExit)) as outcome:
        load_script(found[0]).main()
    assert outcome.type is Parsed, f"{document.name}: {path.name} {' '.join(flags)}: {capsys.readouterr().err}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_is_safe_to_paste_on_an_attendees_machine(document):
    text = document.read_text()
    if document == ROOT / "benchmarks/README.md" and MAINTAINERS in text:
        text = text.split(MAINTAINERS)[0]
    assert [unsafe for unsafe in UNSAFE if unsafe in text] == []


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_diff_compares_files_that_exist(document):
    for old, new in re.findall(r"diff -u ([^\s`]+) ([^\s`]+)", document.read_text()):
        if old.isupper():  # diff -u OLD NEW: the form, not a pair
            continue
        for path in (old, new):
            assert len(glob.glob(path, root_dir=ROOT)) == 1, f"{document.name}: diff -u names {path}"


# --- "what you'll see" ------------------------------------------------------------------------------------------

OUTPUT = re.compile(r"<!-- output: (\S+) -->\n```text\n(.*?)^```", re.M | re.S)
RAY_PREFIX = re.compile(r"^\((?:\w+ )?pid=\d+(?:, ip=[\d.]+)?\) ")
PROGRESS = re.compile(r"^epoch \d+: +\d+%\|.*\| [\d.]+/[\d.]+ \[")


def printed_patterns(path: Path) -> list[re.Pattern]:
    """A regular expression for every f-string and string constant in the file: its text, with any value where
    the f-string formats one. Strings with little text of their own (at most 8 characters) are left out: they
    would match nearly anything."""
    patterns = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.JoinedStr):
            parts = [re.escape(v.value) if isinstance(v, ast.Constant) else ".+?" for v in node.values]
            literal = sum(len(v.value) for v in node.values if isinstance(v, ast.Constant))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts, literal = [re.escape(node.value)], len(node.value)
        else:
            continue
        if literal > 8:
            patterns.append(re.compile("".join(parts)))
    return patterns


def summary_keys(path: Path) -> list[str]:
    """The keys of the JSON summary a script prints: the keywords of its dict(step=...) calls, in order."""
    keys = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict" and \
                any(k.arg == "step" for k in node.keywords):
            keys += [k.arg for k in node.keywords if k.arg]
    return keys


def quoted_outputs():
    for document in DOCUMENTS:
        for script, body in OUTPUT.findall(document.read_text()):
            yield pytest.param(script, body.splitlines(), id=f"{document.relative_to(ROOT)}: {script}")


def line_problem(line: str, patterns: list, keys: list):
    line = RAY_PREFIX.sub("", line)
    if line.strip() in ("", "...") or PROGRESS.match(line):
        return None
    if line.startswith("{"):
        shown = re.findall(r'"(\w+)":', line)
        in_order = [key for key in keys if key in shown]
        return None if shown and shown == in_order[:len(shown)] else f"JSON keys {shown} not in the order {keys}"
    if any(p.fullmatch(line) for p in patterns):
        return None
    # A line cut short with "..." shows the start of a printed line.
    if line.endswith("...") and any(p.match(line[:-3].rstrip(", ")) for p in patterns):
        return None
    return "no print of the script or of common/ makes this line"


@pytest.mark.parametrize("script, lines", list(quoted_outputs()))
def test_what_youll_see_is_what_the_script_prints(script, lines):
    path = ROOT / script
    patterns = [p for source in [path, *sorted((ROOT / "common").glob("*.py"))] for p in printed_patterns(source)]
    problems = [(line, why) for line in lines if (why := line_problem(line, patterns, summary_keys(path)))]
    assert problems == [], f"{script}: lines that it does not print: {problems}"


def test_the_output_check_tells_a_changed_format_apart():
    path = ROOT / "01-vanilla-pytorch-ddp/train_ddp.py"
    patterns = [p for source in [path, ROOT / "common/training.py"] for p in printed_patterns(source)]
    keys = summary_keys(path)
    epoch = "epoch 1/1 | 2 processes | train loss 1.7735 | test acc 47.86% | 262.0 s | 191 img/s | peak mem 1,554 MB"
    assert line_problem(epoch, patterns, keys) is None
    assert line_problem(epoch.replace("2 processes", "1 process"), patterns, keys) is None
    assert line_problem(epoch.replace("train loss", "loss"), patterns, keys)
    assert line_problem('{"step": "ddp", "world_size": 2, ...}', patterns, keys) is None
    assert line_problem('{"world_size": 2, "step": "ddp"}', patterns, keys)
    assert line_problem("memory per rank (MB) | parameters | gradients | optimizer state | peak", patterns, keys) \
        is None
    assert line_problem("epoch 1: 100%|████| 390/390 [04:29<00:00, 1.45it/s]", patterns, keys) is None
