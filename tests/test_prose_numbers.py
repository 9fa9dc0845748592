"""Every number in a document's prose is tied to where it comes from, so that a new result cannot leave an old
sentence behind (#85).

A measurement-like number (tests/test_slides.py's rule: a decimal point, a unit, or an integer of 100 or more;
versions and dates count) outside code, links' targets and the generated tables (tests/test_tables.py renders those
again from their results) must be found in a source named by the last `<!-- numbers: PATH [PATH ...] -->` comment
above it, or on its line. A source is a published result (under benchmarks/published/ or tests/history/) or a file
of code that sets the value: the repository's (requirements.txt, pyproject.toml, a script), or an installed
package's for another tool's number (`ray:_private/ray_constants.py`), or the document's own table or output that
a test checks (`region:NAME`, `output:SCRIPT`); never a document in prose, which is what is checked here. A
published .md, .txt or .log must show the number as the sentence does, unit included (a signed difference as its
size); a .json, a file of code or a checked output must hold a value that rounds to it (to the sentence's decimals;
a percentage from a fraction, MiB as GiB, a count in M or B). Change the result and the sentence that quotes its old
value fails.

The deck has its own rule (test_slides.py), whose sources are these documents.
"""
import functools
import importlib.util
import json
import re
from pathlib import Path

import pytest

from conftest import ROOT
from test_docs import OUTPUT
from test_slides import as_published, measured_numbers

SOURCES = re.compile(r"<!--\s*numbers:\s*(.*?)\s*-->")
# Regions whose numbers a test renders or checks again: tables.py's tables (tests/test_tables.py), and the bytes per
# step that tests/test_communication.py and test_step07.py count.
CHECKED_REGION = re.compile(r"<!-- (table: [\w-]+|communication) -->")
# The documents whose prose is tied: README.md, every step's and the labs'. The deck has its own rule
# (test_slides.py), and the handout is rendered whole from published results and code (test_rehearsal.py).
TIED = ("README.md", "01-vanilla-pytorch-ddp/README.md", "02-ray-train-ddp/README.md", "03-ray-train-fsdp/README.md",
        "04-ray-train-fsdp2/README.md", "05-ray-tune/README.md", "06-ray-data-inference/README.md",
        "07-tensor-parallel/README.md", "labs/README.md")
PUBLISHED = ("benchmarks/published/", "tests/history/")
# A document's "what you'll see" of a script (`<!-- output: SCRIPT -->`) that a test holds to the script's output to
# the byte: its prose may quote that output, named as a source `output:SCRIPT`; and a checked region of the document
# (above), named `region:NAME` (a table's name, or communication).
OUTPUT_SOURCES = {"04-ray-train-fsdp2/will_it_fit.py": "tests/test_will_it_fit.py"}
CODE_NUMBER = re.compile(r"(?<![\w.])\d[\d_,]*(?:\.\d+)?")  # 300 in ${START_TIMEOUT_S:-300}, 20_000


def blanked(text: str, pattern: str) -> str:
    """The text with what the pattern matches blanked, its line breaks kept (so that line numbers stay)."""
    return re.sub(pattern, lambda match: re.sub(r"[^\n]", " ", match.group()), text, flags=re.M | re.S)


def prose_numbers(text: str) -> list[tuple[int, str, list[str]]]:
    """(line, number, the sources named for it) for every measured number outside code (blocks, and inline code
    that may run over a line break) and checked regions."""
    text = blanked(blanked(text, r"^```.*?^```"), r"`(?:[^`\n]|\n(?!\s*\n))+`")  # inline code ends in its paragraph
    found, sources, in_region = [], [], False
    for line_number, line in enumerate(text.splitlines(), 1):
        if CHECKED_REGION.match(line.strip()):
            in_region = True
        if in_region:
            in_region = not re.match(r"<!-- /(table|communication) -->", line.strip())
            continue
        if named := SOURCES.search(line):
            sources = named.group(1).split()
        prose = re.sub(r"<!--.*?-->", " ", line)
        found += [(line_number, number, sources) for number in measured_numbers(prose)]
    return found


def is_result(path: str) -> bool:
    return path.startswith(PUBLISHED)


def file_of(path: str) -> Path:
    """A source's file: in the repository, or in an installed package (ray:_private/ray_constants.py), for a
    number that is another tool's (its default port, its poll)."""
    package, _, inside = path.rpartition(":")
    if package:
        return Path(importlib.util.find_spec(package).submodule_search_locations[0]) / inside
    return ROOT / path


def is_source(path: str) -> bool:
    """A published result, a file of code (the repository's, or a package's) that is not a document in prose, or a
    checked output."""
    if path.startswith("output:"):
        return path.removeprefix("output:") in OUTPUT_SOURCES
    if path.startswith("region:"):
        return True  # found in the document, or its numbers are none
    return file_of(path).is_file() and (is_result(path) or Path(path).suffix != ".md")


def own_values(text: str, source: str) -> list[float]:
    """The numbers of a document's checked output of a script (output:SCRIPT, read as test_docs.py reads it), or of
    a checked region (region:NAME)."""
    kind, _, name = source.partition(":")
    if kind == "output":
        body = dict(OUTPUT.findall(text)).get(name, "")
    else:
        found = re.search(rf"<!-- (?:table: )?{re.escape(name)} -->\n(.*?)<!-- /(?:table|{re.escape(name)}) -->",
                          text, re.S)
        body = found.group(1) if found else ""
    return [float(n.replace(",", "")) for n in CODE_NUMBER.findall(body)]


def leaves(value) -> list:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in leaves(item)]
    return [value]


@functools.cache
def values_in(path: str) -> tuple[frozenset, list[float]]:
    """What a source shows: its numbers as text shows them, with units (a published page's; a .json's strings,
    "24 GiB RAM"), and its values (a .json's numbers, or the numbers in a file of code)."""
    text = file_of(path).read_text()
    if path.endswith(".json"):
        values = leaves(json.loads(text))
        strings = " ".join(value for value in values if isinstance(value, str))
        return (frozenset(as_published(n) for n in measured_numbers(strings)),
                [float(value) for value in values if isinstance(value, (int, float)) and not isinstance(value, bool)])
    if is_result(path):  # a signed difference (-16%) is quoted as its size (16% under)
        return frozenset(as_published(n) for n in measured_numbers(re.sub(r"(?<=\s)-(?=\d)", "", text))), []
    return frozenset(), [float(n.replace(",", "").replace("_", "")) for n in CODE_NUMBER.findall(text)]


# A number with these units may quote a value in another scale: a fraction as a percentage, a count in millions
# or billions, MiB (a result's _mb) in GiB.
SCALES = {"%": (1, 100), "M": (1, 1e-6), "B": (1, 1e-9), "GiB": (1, 1 / 1024)}


def rounds_to(number: str, values: list[float]) -> bool:
    """A value rounds to the number at the number's own decimals (in the scales of its unit)."""
    match = re.match(r"[\d,]+(?:\.\d+)?", number)
    digits = match.group().replace(",", "")
    places, target = len(digits.partition(".")[2]), float(digits)
    scales = SCALES.get(number[len(match.group()):].strip(), (1,))
    return any(abs(round(value * scale, places) - target) < 1e-9 for value in values for scale in scales)


def found_in(number: str, sources: list[str], text: str = "") -> bool:
    for path in sources:
        if path.startswith(("output:", "region:")):
            if rounds_to(number, own_values(text, path)):
                return True
            continue
        shown, values = values_in(path)
        if as_published(number) in shown or rounds_to(number, values):
            return True
    return False


def unsourced(document: str, text: str) -> list[str]:
    problems = []
    for line, number, sources in prose_numbers(text):
        if bad := [path for path in sources if not is_source(path)]:
            problems.append(f"{document}:{line}: {bad}: no such published result or file of code")
        elif not sources:
            problems.append(f"{document}:{line}: {number} has no source: name it above, <!-- numbers: PATH -->")
        elif not found_in(number, sources, text):
            problems.append(f"{document}:{line}: {number} is in none of {sources}")
    return problems


@pytest.mark.parametrize("document", TIED)
def test_every_number_in_a_documents_prose_is_in_a_source_it_names(document):
    problems = unsourced(document, (ROOT / document).read_text())
    assert not problems, "\n".join(problems)


def test_a_number_without_a_source_or_with_a_changed_one_fails():
    install = "benchmarks/published/install/results.json"
    quoted = json.loads((ROOT / install).read_text())["gb"]["readme"]
    sentence = f"<!-- numbers: {install} -->\nIt takes {quoted} GB of disk."
    assert unsourced("doc", sentence) == []
    assert unsourced("doc", sentence.replace(f"{quoted} GB", f"{quoted + 0.1:.1f} GB"))  # the result changed
    assert unsourced("doc", "It takes 6.4 GB of disk.") == ["doc:1: 6.4 GB has no source: name it above, "
                                                            "<!-- numbers: PATH -->"]
    assert unsourced("doc", "<!-- numbers: README.md -->\nIt takes 6.4 GB.")[0].endswith(
        "['README.md']: no such published result or file of code")


def test_the_reader_skips_code_and_tables_and_reads_each_sources_way():
    text = ("<!-- numbers: requirements.txt -->\nTorch 2.14.1, `--lr 2e-3`, 128 images:\n```bash\nrun --steps 500\n"
            "```\n<!-- table: steps -->\n| 42.5% |\n<!-- /table -->\n30.5 s")
    assert [(line, number) for line, number, _ in prose_numbers(text)] == [(2, "2.14"), (2, "128"), (9, "30.5 s")]
    assert rounds_to("4.6", [4.5917]) and rounds_to("78.86%", [0.78857]) and not rounds_to("4.6", [4.66])
    assert not rounds_to("96 s", [95.0]) and rounds_to("1.02B", [1020129802]) and not rounds_to("1.02", [1020129802])
