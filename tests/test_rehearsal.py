"""The core talk's live commands, rehearsed (slides/rehearse.py): every command that the core's slides or notes tell
the presenter or the room to run is in the rehearsal's list, still parses with its step's own parser, and took no
longer than its slot in the published rehearsal (benchmarks/published/rehearsal/results.json). Fast: nothing runs.

A slot is the minutes of the slide a command is run on ("~N min" in its notes); the commands of one slide share it.
"""
import argparse
import json
import re
import sys

import pytest

from benchmarks.record import QUIET_BELOW
from checks import load_script
from conftest import ROOT

rehearse = load_script("slides/rehearse.py")
SLIDES = rehearse.parse_deck(rehearse.DECK.read_text())
CORE = rehearse.core(SLIDES)
BY_TITLE = {slide.title: slide for slide in CORE}
PUBLISHED = ROOT / "benchmarks/published/rehearsal/results.json"
LISTED = {command for _, command in rehearse.REHEARSAL}


def shown_in_the_core():
    return [(slide, command) for slide in CORE for command in rehearse.deck_commands(slide)]


def test_the_rehearsal_reads_the_deck_as_the_slide_tests_do():
    from test_slides import SLIDES as SLIDE_TESTS_SLIDES, minutes
    assert [(s.number, s.title) for s in SLIDES] == [(s.number, s.title) for s in SLIDE_TESTS_SLIDES]
    assert [s.minutes for s in SLIDES] == [minutes(s) for s in SLIDE_TESTS_SLIDES]


@pytest.mark.parametrize("slide, command", shown_in_the_core(),
                         ids=[f"{s.number}: {c}"[:70] for s, c in shown_in_the_core()])
def test_every_command_of_the_core_is_rehearsed(slide, command):
    assert command in LISTED or command in rehearse.NOT_TIMED, \
        f"slide {slide.number} ({slide.title}) runs `{command}`: add it to REHEARSAL in slides/rehearse.py, with the " \
        f"title of the slide it runs on, or to NOT_TIMED with the reason"


@pytest.mark.parametrize("title, command", rehearse.REHEARSAL, ids=[c[:60] for _, c in rehearse.REHEARSAL])
def test_every_rehearsed_command_is_shown_on_its_slide(title, command):
    assert title in BY_TITLE, f"no core slide titled {title!r} (renamed? moved into the appendix?)"
    assert command in rehearse.deck_commands(BY_TITLE[title]), f"slide {title!r} does not show `{command}`"


def test_the_rehearsal_runs_in_the_decks_order():
    numbers = [BY_TITLE[title].number for title, _ in rehearse.REHEARSAL if title in BY_TITLE]
    assert numbers == sorted(numbers)


def test_the_command_extraction_sees_blocks_continuations_and_live_notes():
    deck = rehearse.parse_deck("---\nmarp: true\n---\n\n# A\n\n```bash\npython x.py \\\n    --epochs 1  # why\n"
                               "ls && pwd\n```\n\n<!--\nLive: diff -u a  b\n~2 min\n-->\n\n---\n\n# B\n\n"
                               "<!-- ~1 min -->\n")
    assert [s.title for s in deck] == ["A", "B"] and deck[0].minutes == 2
    assert rehearse.deck_commands(deck[0]) == ["python x.py --epochs 1", "ls", "pwd", "diff -u a b"]


class Parsed(Exception):
    """Raised instead of running a script, once its parser has accepted the flags."""


ARGPARSE = argparse.ArgumentParser.parse_args


def parse_only(self, args=None, namespace=None):
    raise Parsed(ARGPARSE(self, args, namespace))


@pytest.mark.parametrize("command", sorted(LISTED))
def test_every_rehearsed_command_parses_as_shown_and_as_run(command, monkeypatch, capsys, tmp_path):
    shown = command.split()
    if shown[0] == "diff":
        assert all((ROOT / path).is_file() for path in shown[2:]), f"`{command}`: no such file"
        return
    script = rehearse.script_of(shown)
    assert script and (ROOT / script).is_file(), f"`{command}` runs no step script"
    if shown[0] == "torchrun":
        from torch.distributed.run import get_args_parser
        get_args_parser().parse_args(shown[1:shown.index(script) + 1])  # exits with a usage error on a bad option
    from common import flags as common_flags
    monkeypatch.setattr(common_flags.Parser, "parse_args", parse_only)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    for words in (shown, rehearse.as_run(command, tmp_path, str(tmp_path))):
        monkeypatch.setattr(sys, "argv", [script, *words[words.index(script) + 1:]])
        with pytest.raises((Parsed, SystemExit)) as outcome:
            load_script(script).main()
        assert outcome.type is Parsed, f"`{' '.join(words)}`: {capsys.readouterr().err}"


def published() -> dict:
    if not PUBLISHED.is_file():
        pytest.fail(f"no {PUBLISHED.relative_to(ROOT)}: run python slides/rehearse.py (its docstring says how)")
    return json.loads(PUBLISHED.read_text())


def test_the_published_rehearsal_ran_every_listed_command_and_each_succeeded():
    results = published()
    ran = [c["command"] for c in results["commands"]]
    assert ran == [command for _, command in rehearse.REHEARSAL], "the rehearsal's list changed: run it again"
    assert [c["command"] for c in results["commands"] if not c["ok"]] == []
    for key in ("machine", "date", "commit", "load_average_before", "load_average_after"):
        assert results.get(key), f"results.json records no {key}"


def test_every_published_time_fits_its_slot_in_the_deck_as_it_is():
    by_slide = {}
    for c in published()["commands"]:
        by_slide.setdefault(c["title"], []).append(c)
    over = []
    for title, commands in by_slide.items():
        slot = BY_TITLE[title].minutes if title in BY_TITLE else 0
        seconds = sum(c["seconds"] for c in commands)
        if seconds > 60 * slot:
            over.append(f"slide {title!r}: {seconds:.0f} s measured, its slot {slot:g} min")
    assert not over, "cut the runs or give them a longer slot:\n" + "\n".join(over)


def test_every_core_slide_fits_its_minutes_with_its_words_said_and_its_commands_typed_and_run():
    """The deck as it is now against the published runs: a note that grows, or a run that slows, fails here."""
    over = [f"slide {b['slide']} ({b['title']}): {b['total_s']:.0f} s (talk {b['talk_s']:.0f}, typing "
            f"{b['typing_s']:.0f}, runs {b['run_s']:.0f}, diffs {b['diff_s']:.0f}) in {b['slot_s']:.0f} s"
            for b in rehearse.budgets(SLIDES, published()["commands"]) if b["total_s"] > b["slot_s"]]
    assert not over, "cut the words or the runs, or give the slide more minutes:\n" + "\n".join(over)


def test_a_slide_budget_counts_the_notes_the_typing_the_run_and_the_diff():
    slide = rehearse.Slide(1, "A", 1, "# A\n\n- two words\n\n<!--\nthree more words\nLive: x\n~1 min\n-->")
    assert rehearse.talk_words(slide) == 3 + 3  # "A two words", "three more words": not "#", "-", Live:, minutes
    diff = "diff -u 01-vanilla-pytorch-ddp/train_single_machine.py 01-vanilla-pytorch-ddp/train_ddp.py"
    budget = rehearse.slide_budget(slide, [dict(command="python x.py", seconds=40.0), dict(command=diff, seconds=0)])
    assert budget["typing_s"] == round(60 * len("python x.py") / rehearse.CHARACTERS_PER_MINUTE, 1)
    assert budget["run_s"] == 40.0 and budget["diff_s"] == round(rehearse.changed_lines(diff) / 4, 1) > 10
    assert budget["total_s"] > budget["slot_s"] == 60


def test_every_published_run_started_with_the_cores_to_itself():
    busy = [f"{c['command']}: load average {c['load_average_at_start']}" for c in published()["commands"]
            if not c["command"].startswith("diff") and c["load_average_at_start"] >= QUIET_BELOW]
    assert not busy, "rehearse again on a quiet machine:\n" + "\n".join(busy)


def quoted(slide) -> list:
    """The lines of the slide's ```text blocks."""
    return [line for block in re.findall(r"^```text\n(.*?)^```", slide.text, re.M | re.S)
            for line in block.splitlines() if line.strip()]


def printed(line: str, output: list) -> bool:
    """Whether a quoted line is a printed one: its parts between `...` (cut out to fit the slide) appear in this
    order in one line of the output."""
    parts = [part.strip() for part in line.split("...") if part.strip()]
    for out in output:
        at = 0
        for part in parts:
            at = out.find(part, at)
            if at < 0:
                break
            at += len(part)
        else:
            return True
    return False


def test_the_quoting_check_tells_a_changed_line_apart():
    output = ["epoch 1/1 | 2 processes | train loss 2.3063 | test acc 11.20% | 20.5 s | 187 img/s"]
    assert printed("epoch 1/1 | 2 processes | train loss 2.3063 | ... | 187 img/s", output)
    assert not printed("epoch 1/1 | 2 processes | train loss 2.3064 | ...", output)
    assert not printed("187 img/s ... epoch 1/1", output)


@pytest.mark.parametrize("slide", [s for s in CORE if quoted(s) and any(t == s.title for t, _ in rehearse.REHEARSAL)],
                         ids=lambda s: s.title)
def test_what_a_slide_says_a_run_prints_is_what_the_published_rehearsal_printed(slide):
    output = [line for c in published()["commands"] if c["title"] == slide.title for line in c["last_lines"]]
    wrong = [line for line in quoted(slide) if not printed(line, output)]
    assert not wrong, f"slide {slide.number} ({slide.title}) quotes lines its command did not print in the " \
                      f"published rehearsal (copy them from benchmarks/published/rehearsal/results.md):\n" + \
                      "\n".join(wrong)


def test_the_handout_is_the_published_rehearsal():
    handout = ROOT / "slides" / "handout.md"
    assert handout.read_text() == rehearse.handout_markdown(published()), \
        "run python slides/rehearse.py --handout --out benchmarks/published/rehearsal"
    for c in published()["commands"]:
        assert f"```bash\n{c['command']}\n```" in handout.read_text()


def test_the_invitation_slide_and_the_handout_install_the_cpu_wheels():
    """Slide 2 goes out with the invitation and the handout is what the room follows: both carry README's install
    without an NVIDIA GPU (PyTorch's CPU wheels first), or every such laptop downloads PyPI's CUDA build, 3.3 GB,
    on the venue's network."""
    install = rehearse.cpu_install()
    [cpu_wheels] = [line for line in install.splitlines() if "download.pytorch.org/whl/cpu" in line]
    invitation = rehearse.parse_deck(rehearse.DECK.read_text())[1]
    commands = [" ".join(line.split()) for line in invitation.text.replace("\\\n", " ").splitlines()]
    assert invitation.number == 2 and cpu_wheels in commands, "slide 2 lost README's CPU-wheel install"
    assert f"```bash\n{install}\n```" in (ROOT / "slides" / "handout.md").read_text()


def test_the_handout_keeps_the_lines_that_say_a_run_is_healthy():
    results = dict(machine="M", date="D", commands=[dict(
        slide=15, title="Your turn: step 02, a crash and a restart", seconds=37.5, command="python x.py", last_lines=[
            "model hybrid: ...", "epoch 1/2 | 2 processes | train loss 2.2695 | test acc 17.20% | 5.0 s",
            "\x1b[33m(raylet)\x1b[0m A worker died or was killed", "Error in training function: RuntimeError: x",
            "resumed from /tmp/w/checkpoints/ray_ddp/r/checkpoint_1 after epoch 1", '{"step": "ray_ddp"}'])])
    text = rehearse.handout_markdown(results)
    assert "Run by you; 38 s." in text
    assert ("```text\nepoch 1/2 | 2 processes | train loss 2.2695 | test acc 17.20% | 5.0 s\n(raylet) A worker died or "
            "was killed\nresumed from .../checkpoints/ray_ddp/r/checkpoint_1 after epoch 1\n```") in text


def test_the_decks_handout_page_lists_the_rooms_commands_in_the_talks_order():
    page = next(slide for slide in SLIDES if slide.title == "Handout: the room's commands")
    typed = [command for title, command in rehearse.REHEARSAL
             if title.startswith("Your turn") or title == "Step 01: the baseline"]
    assert rehearse.deck_commands(page) == typed


SLIDE_NUMBER = re.compile(r"\b[Ss]lides? \d+")
NAMED_BY_TITLE = ["README.md", "TROUBLESHOOTING.md", "slides/README.md", "labs/README.md", "benchmarks/README.md",
                  *(str(p.relative_to(ROOT)) for p in sorted(ROOT.glob("0*/README.md")))]


def prose(text: str) -> str:
    """What a person wrote: links to slides (checked by test_slides.py) and generated tables taken out."""
    text = re.sub(r"<!-- table: [\w-]+ -->\n.*?<!-- /table -->", "", text, flags=re.S)
    return re.sub(r"\[[^\]]*\]\(#\d+\)", "", text)


def test_prose_never_names_a_slide_by_its_number():
    """A number goes stale when a slide moves: the deck, its notes and the documents name a slide by what it shows
    ("step 01's turn"); numbers come only from the deck as it is (links, the handout) or from the rehearsal."""
    stale = [f"{path}: {found!r}" for path in ["slides/workshop.md", *NAMED_BY_TITLE]
             for found in SLIDE_NUMBER.findall(prose((ROOT / path).read_text()))]
    assert not stale, "name the slide by its title or what it shows:\n" + "\n".join(stale)


def test_the_prose_check_sees_a_slide_number_and_lets_links_and_tables_be():
    assert SLIDE_NUMBER.findall(prose("as slide 10's run")) == ["slide 10"]
    assert SLIDE_NUMBER.findall(prose("[slide 10](#10) <!-- table: x -->\n| Slide 7 |\n<!-- /table -->")) == []


def test_the_published_rehearsal_numbers_each_slide_as_the_deck_does():
    """results.json, and the tables made from it (results.md, slides/README.md), number slides as the deck did when
    it ran: once a slide moves, the rehearsal is of another deck."""
    numbers = {slide.title: slide.number for slide in SLIDES}
    results = published()
    moved = [f"{row['slide']} {row['title']!r}: now {numbers.get(row['title'], 'gone')}"
             for row in results["commands"] + results["slides"] if numbers.get(row["title"]) != row["slide"]]
    assert not moved, "the deck changed since its rehearsal: run python slides/rehearse.py again\n" + "\n".join(moved)
