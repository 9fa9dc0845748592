"""The designed pairs of step scripts: `diff -u` between them must show that pair's lesson and little else.
README.md lists these commands. Each bound is about 10% over the pair's size when it was set (2026-11-27: 59, 115,
74, 43, 60 and 134 changed lines), so a comment that teaches fits; a pair that grows past it is noticed."""
import subprocess

import pytest

from benchmarks.steps import designed_pairs
from conftest import ROOT

# (older script, newer script, most changed lines, lines that must be in the diff: the lesson itself), from the
# registry of the steps (benchmarks/steps.py)
DESIGNED_PAIRS = designed_pairs()

# Read on a projector: the step scripts stay within 100 columns (common/, tests/ and benchmarks/ within ruff's 120).
STEP_SCRIPTS = sorted(ROOT.glob("0[1-9]-*/*.py"))
PROJECTOR_COLUMNS = 100


def changed_lines(old: str, new: str) -> list:
    diff = subprocess.run(["diff", "-u", old, new], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout
    return [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]


@pytest.mark.parametrize("old, new, bound, lesson", DESIGNED_PAIRS, ids=[new for _, new, _, _ in DESIGNED_PAIRS])
def test_designed_pair_shows_its_lesson_and_stays_small(old, new, bound, lesson):
    changed = changed_lines(old, new)
    assert [line for line in lesson if line not in changed] == []
    assert len(changed) <= bound, f"diff -u {old} {new}: {len(changed)} changed lines, bound {bound}"


@pytest.mark.parametrize("script", STEP_SCRIPTS, ids=lambda p: p.name)
def test_step_scripts_fit_a_projector(script):
    long = [f"{n}: {len(line)}" for n, line in enumerate(script.read_text().splitlines(), 1)
            if len(line) > PROJECTOR_COLUMNS]
    assert long == [], f"{script.name}: lines over {PROJECTOR_COLUMNS} columns"


def test_readme_names_every_designed_pair():
    readme = (ROOT / "README.md").read_text()
    for old, new, _, _ in DESIGNED_PAIRS:
        assert f"diff -u {old} {new}" in readme


def test_the_slides_readme_has_a_coloured_command_for_every_designed_pair():
    """slide 37's notes send the instructor to slides/README.md for each pair's diff on a projector."""
    commands = " ".join((ROOT / "slides" / "README.md").read_text().replace("\\\n", " ").split())
    for old, new, _, _ in DESIGNED_PAIRS:
        assert f"git diff --no-index --color=always --stat=100 -p -U5 {old} {new} | less -R" in commands, \
            f"slides/README.md: no coloured diff of {old} against {new}"
