"""The slide deck, slides/workshop.md: true to the scripts and to the measurements, with presenter notes, and
within a 16:9 frame. Text only: nothing here renders the deck (slides/README.md says how, with Marp).

Code on a slide is the scripts' code:

- Every ```python block comes right after `<!-- code: PATH -->` and every ```diff block right after
  `<!-- diff: OLD NEW -->` (paths from the repository root); a block without one fails. Marp shows these
  comments in the presenter notes too, which tells the presenter which file to open.
- A python block is an excerpt of PATH: consecutive lines of the file, in the file's order. A line that is
  only `...` marks a gap: what follows comes later in the file. Three liberties, and no others:
  the whole block may lose a common indentation (every line the same number of leading spaces, so the
  relative indentation is the file's); a trailing comment may be cut (`x = f(y)  # why` shown as
  `x = f(y)`); and a line too long for the slide may be broken where Python allows it (between two tokens,
  inside brackets, not in a string), its continuation indented deeper than the line it continues; rejoined,
  it is the file's line. Every token of code on a slide is then the file's, in the file's order.
- In a diff block, a `+` line is a line that `diff -u OLD NEW` adds and a `-` line one it removes, with the
  same liberties (a continuation line carries the marker of the line it continues); lines that are
  neither must be in NEW. A diff block need not follow the diff's order.
- A bash block runs scripts that exist, and each `--flag` after a script is one that script or common/
  defines (a `01-*` glob must name exactly one folder).

Numbers on a slide are measured ones. A number in prose, bullets, tables, headings or presenter notes (not in
code: neither code blocks nor `inline code`, which hold flag values, commands and code; nor Marp's image syntax,
`![w:1100](...)`, nor a link's target) must appear, with its unit, in a source that the slide names in a
`<!-- numbers: PATH [PATH ...] -->` comment (README.md, benchmarks/README.md, a step's README.md, or a published
result under benchmarks/published/; of the rehearsal's results.json, the lines its runs printed, not the slide
titles it copies), if it is a measurement-like number: one with a decimal point (42.55%, 0.887,
1.68x, 24.1 s, 7.60 GiB), one with a unit (%, x, s, ms, MB, GB, GiB, M, B, images/s), or an integer of 100 or
more (266 images/s, 2,066 s). Integers below 100 without a unit (step numbers, "2 workers", "10 epochs") are not
checked, nor the minutes of the presenter notes. A table of results is a generated region instead, between
`<!-- table: NAME -->` and `<!-- /table -->`: benchmarks/tables.py renders it from a published results.json and
tests/test_tables.py fails when it differs, so its numbers are not checked here (NAME must be one of its TABLES).

Pictures: an image on a slide is Marp's `![w:W](PATH)` or `![h:H](PATH)` (PATH relative to slides/), and the
file exists. A diagram under slides/diagrams/ has its source beside it (NAME.py or NAME.dot, rendered by
slides/diagrams/render.py). An image counts in the slide's height: H pixels (from h:, or from w: and the PNG's
own proportions) plus IMAGE_EXTRA, measured in Chromium, and it is at most as wide as the text.

The talk and its appendix: a divider slide titled exactly "Appendix" ends the core talk, whose minutes add up to at
most CORE_MINUTES. Every slide after it is a deep dive that a core slide links to (a Markdown link to Marp's page
anchor, `[ring all-reduce](#52)`, which works in the HTML and in the PDF; in a `_footer` directive or in the
slide's text), and it links back to a core slide that links to it, so a renumbered deck fails here.

Presenter notes: Marp shows every HTML comment that is not a directive as a presenter note. Every slide has
at least one note (besides the code attributions) that says how long the slide takes: "~N min". The total of
the core and that of the appendix are stated in slides/README.md.

The budget: Marp's default theme shrinks a code block whose longest line is wider than the slide (measured:
at 1280x720, 72 columns fit at full size, 75 are shrunk to 0.98), and a slide whose content is taller than
the frame is cut at the bottom. So code lines have at most MAX_CODE_COLUMNS characters, a code block at most
MAX_CODE_LINES lines, and a slide's estimated height is at most SLIDE_HEIGHT, the 563 pixels between the
default theme's top and bottom padding. estimated_height adds up headings, bullets and paragraphs (wrapped at
the measured width of text and inline code), code lines and table rows, with the theme's margins; its
constants were measured in Chromium with slides/measure.cjs, and on this deck it agrees with Chromium to
2 pixels or errs high (a bullet close to the edge is counted as wrapped).
"""
import collections
import functools
import glob
import io
import json
import math
import re
import subprocess
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from PIL import Image

from checks import load_script
from conftest import ROOT

DECK = ROOT / "slides/workshop.md"
SLIDES_DIR = ROOT / "slides"
CORE_MINUTES = 80  # the core talk, before the "Appendix" divider
APPENDIX = "Appendix"
MAX_CODE_COLUMNS = 72
MAX_CODE_LINES = 14
SLIDE_HEIGHT = 563  # px: 720 minus the default theme's top and bottom padding

# Marp's default theme at 1280x720, measured in Chromium on renders of this deck: line heights and margins in
# pixels, and the width of text (a character of text, of inline code, and each inline code's padding).
GAP = 16  # between two blocks (headings, paragraphs, lists, code blocks, tables)
H1_LINE, H1_CODE_LINE, H1_PADDING, H1_CHAR = 58, 62, 14, 23.5  # a heading line with inline code is taller
TEXT_LINE, ITEM_GAP, TEXT_CHAR, CODE_CHAR, CODE_PADDING = 43.5, 7, 14, 15, 14
LIST_WIDTH, TEXT_WIDTH = 1065, 1123  # a bullet's text, a paragraph's
CODE_LINE, CODE_PADDING_Y = 28.35, 34.3
ROW_HEIGHT, CELL_PADDING = 57, 26  # a table row of one line; the padding of each cell
WRAP_MARGIN = 0.95  # text wraps at a word: count a line as full a little early
# An image of height H on its own line: a paragraph H + IMAGE_EXTRA high (measured: a one-line title and an image
# take H + 100 px, the title being H1_LINE + H1_PADDING and a GAP).
IMAGE_EXTRA = 12

MARP_DIRECTIVES = {"theme", "style", "headingDivider", "size", "math", "title", "description", "author", "image",
                   "keywords", "url", "marp", "paginate", "header", "footer", "class", "backgroundColor",
                   "backgroundImage", "backgroundPosition", "backgroundRepeat", "backgroundSize", "color", "lang"}
MINUTES = re.compile(r"~\s*(\d+(?:\.\d+)?)\s*min\b")
NUMBER = re.compile(r"(?<![\w.\-/])(\d[\d,]*(?:\.\d+)?)(?![\d])")
IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")  # Marp: ![w:1100](diagrams/ddp.png)
LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")
REGION_START, REGION_END = re.compile(r"table: ([\w-]+)"), "/table"
UNIT = re.compile(r"\s?(%|x(?![\w])|s\b|ms\b|MB\b|GB\b|GiB\b|M\b|B\b|images/s|img/s)")


@dataclass
class Block:
    """A fenced code block: its language, its lines, and the attribution comment just before it (if any)."""
    lang: str
    lines: list
    source: str | None


@dataclass
class Slide:
    number: int
    title: str = ""
    prose: list = field(default_factory=list)  # markdown lines outside code blocks and comments
    blocks: list = field(default_factory=list)
    notes: list = field(default_factory=list)  # presenter notes: comments that are neither directives nor sources
    sources: list = field(default_factory=list)  # where its numbers come from: <!-- numbers: PATH ... -->
    generated: set = field(default_factory=set)  # indices into prose of the lines in <!-- table: NAME --> regions
    regions: list = field(default_factory=list)  # the NAMEs of those regions
    footer: str = ""  # a `_footer` (or `footer`) directive's text

    @property
    def images(self) -> list:
        """(directive, path) of every image in the slide's text: `![w:1100](diagrams/ddp.png)`."""
        return [m.groups() for line in self.prose for m in IMAGE.finditer(line)]

    @property
    def links(self) -> list:
        """The slide numbers that the slide's text and footer link to (`[text](#N)`)."""
        return [int(target[1:]) for line in self.prose + [self.footer] for _, target in LINK.findall(line)
                if re.fullmatch(r"#\d+", target)]


def parse_deck(text: str) -> list:
    """The slides of a Marp deck: front matter dropped, split at `---` lines outside code and comments."""
    lines = text.splitlines()
    assert lines[0] == "---", "the deck starts with Marp front matter"
    end = lines.index("---", 1)
    slides, slide, i = [], Slide(1), end + 1
    attribution = None  # the last comment, if nothing but blank lines came after it
    in_region = False  # between <!-- table: NAME --> and <!-- /table -->
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            lang, body = line[3:].strip(), []
            i += 1
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            slide.blocks.append(Block(lang, body, attribution))
            attribution = None
        elif line.lstrip().startswith("<!--"):
            comment = [line]
            while "-->" not in comment[-1]:
                i += 1
                comment.append(lines[i])
            content = "\n".join(comment).strip()[4:-3].strip()
            attribution = None
            if re.fullmatch(r"(code|diff):.*", content):
                attribution = content
            elif content.startswith("numbers:"):
                slide.sources += content.split(":", 1)[1].split()
            elif region := REGION_START.fullmatch(content):
                slide.regions.append(region.group(1))
                in_region = True
            elif content == REGION_END:
                in_region = False
            elif re.fullmatch(r"_?footer:.*", content, flags=re.S):
                slide.footer = content.split(":", 1)[1].strip().strip("\"'")
            elif not re.fullmatch(r"_?(\w+):.*", content) or content.lstrip("_").split(":")[0] not in MARP_DIRECTIVES:
                slide.notes.append(content)
        elif line == "---":
            slides.append(slide)
            slide, attribution = Slide(slide.number + 1), None
        elif line.strip():
            slide.prose.append(line)
            if in_region:
                slide.generated.add(len(slide.prose) - 1)
            slide.title = slide.title or line.lstrip("# ").strip()
            attribution = None
        i += 1
    slides.append(slide)
    return slides


SLIDES = parse_deck(DECK.read_text())
BLOCKS = [(slide, block) for slide in SLIDES for block in slide.blocks]
DIVIDER = next((slide.number for slide in SLIDES if slide.title == APPENDIX), len(SLIDES) + 1)
CORE, APPENDIX_SLIDES = SLIDES[:DIVIDER - 1], SLIDES[DIVIDER:]


def slide_id(slide) -> str:
    return f"{slide.number}: {slide.title}"


def assert_every(check, cases: list):
    """One test for many slides: check(*case) on every case, then one failure that names each slide whose check
    failed (the first line of its message), rather than a test per slide."""
    failed = []
    for case in cases:
        try:
            check(*case)
        except AssertionError as error:
            failed.append(str(error).splitlines()[0])
    assert not failed, f"{len(failed)} of {len(cases)} failed:\n" + "\n".join(failed)


# --- code excerpts ---------------------------------------------------------------------------------------------

@dataclass
class Source:
    """A Python file's lines, where each line may be broken (after a token, inside brackets, outside any
    f-string) and where its trailing comment starts."""
    lines: list
    breaks: dict
    comments: dict


@functools.cache
def python_source(path: str) -> Source:
    return parse_source((ROOT / path).read_text())


def parse_source(text: str) -> Source:
    breaks, comments, depth, fstrings = collections.defaultdict(set), {}, 0, 0
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    for token, following in zip(tokens, tokens[1:], strict=False):
        if token.type == tokenize.OP and token.string in "([{":
            depth += 1
        elif token.type == tokenize.OP and token.string in ")]}":
            depth -= 1
        elif token.type == getattr(tokenize, "FSTRING_START", None):
            fstrings += 1
        elif token.type == getattr(tokenize, "FSTRING_END", None):
            fstrings -= 1
        elif token.type == tokenize.COMMENT:
            comments[token.start[0] - 1] = token.start[1]
        if depth > 0 and not fstrings and following.start[0] == token.end[0] and \
                following.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE):
            breaks[token.end[0] - 1].add(token.end[1])
    return Source(text.splitlines(), breaks, comments)


def matches(source: Source, i: int, shown: list, k: int, dedent: int):
    """How many slide lines, from shown[k], show line i of the source (dedented); None if they do not.

    shown[k] is the line; or its start, cut before a trailing comment; or its start, broken where Python
    allows (inside brackets, between tokens) and continued on the next slide lines, each indented deeper
    than shown[k]."""
    line = source.lines[i]
    if not line.startswith(" " * dedent):
        return None
    want, first = line[dedent:], shown[k].rstrip()
    if not first or not want.startswith(first):
        return None
    indent = len(shown[k]) - len(shown[k].lstrip())
    used, done = 1, len(first)
    while want[done:].strip():
        stripped = want[done:].lstrip()
        if stripped.startswith("#") and source.comments.get(i) == dedent + len(want) - len(stripped):
            return used  # a cut trailing comment
        follows = shown[k + used].rstrip() if k + used < len(shown) else ""
        continuation = follows.strip()
        deeper = len(follows) - len(continuation) > indent
        if not (deeper and continuation and stripped.startswith(continuation) and dedent + done in source.breaks[i]):
            return None
        done, used = len(want) - len(stripped) + len(continuation), used + 1  # a broken line, continued
    return used


def find_segment(source: Source, segment: list, start: int, dedent: int):
    """The end (exclusive) of the first run of source lines from `start` that the segment shows; None if none."""
    for first in range(start, len(source.lines)):
        i, k = first, 0
        while k < len(segment) and i < len(source.lines):
            used = matches(source, i, segment, k, dedent)
            if used is None:
                break
            i, k = i + 1, k + used
        if k == len(segment):
            return i
    return None


def excerpt_problem(block_lines: list, source: Source):
    """None if the block is an excerpt of the source (see the module docstring), else what is wrong."""
    segments, segment = [], []
    for line in block_lines:
        if line.strip() == "...":
            segments.append(segment)
            segment = []
        elif line.strip():
            segment.append(line)
    segments = [s for s in segments + [segment] if s]
    for dedent in range(0, 41):
        start = 0
        for segment in segments:
            start = find_segment(source, segment, start, dedent)
            if start is None:
                break
        else:
            return None
    lost = [line for segment in segments for k, line in enumerate(segment)
            if not any(matches(source, i, segment, k, d) for i in range(len(source.lines)) for d in range(41))]
    if lost:
        return f"not a line of the file, nor its start: {lost[0]!r}"
    return "lines of the file, but not consecutive or not in the file's order (mark a gap with a '...' line)"


def changed_lines(old: str, new: str) -> dict:
    """Line numbers (from 0) of what `diff -u old new` removes from old ("-") and adds to new ("+")."""
    diff = subprocess.run(["diff", "-u", old, new], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout
    changed, at = {"+": [], "-": []}, {}
    for line in diff.splitlines():
        if hunk := re.match(r"@@ -(\d+)(?:,\d+)? \+(\d+)", line):
            at = {"-": int(hunk.group(1)) - 1, "+": int(hunk.group(2)) - 1}
        elif line[:1] in "+-" and line[:3] not in ("+++", "---"):
            changed[line[0]].append(at[line[0]])
            at[line[0]] += 1
        elif line[:1] == " ":
            at = {sign: n + 1 for sign, n in at.items()}
    return changed


def diff_problem(block_lines: list, old: str, new: str):
    """None if every +/- line of the block is a line the diff adds/removes, and every other line is in NEW."""
    changed = changed_lines(old, new)
    sources = {"+": python_source(new), "-": python_source(old), " ": python_source(new)}
    candidates = {**changed, " ": range(len(sources[" "].lines))}
    marked = [line for line in block_lines if line.strip()]
    if any(line[0] not in "+- " for line in marked):
        return "every line of a diff block starts with '+', '-' or ' '"
    stuck = 0
    for dedent in range(0, 41):
        k = 0
        while k < len(marked):
            sign = marked[k][0]
            run = [line[1:] for line in marked[k:]]
            run = run[:next((j for j, line in enumerate(marked[k:]) if line[0] != sign), len(run))]
            used = next((u for i in candidates[sign] if (u := matches(sources[sign], i, run, 0, dedent))), None)
            if used is None:
                stuck = max(stuck, k)
                break
            k += used
        else:
            return None
    return f"`diff -u {old} {new}` does not show this line with that marker: {marked[stuck]!r}"


def check_excerpt(slide, block):
    kind = "code" if block.lang == "python" else "diff"
    assert block.source and block.source.startswith(f"{kind}:"), \
        f"slide {slide_id(slide)}: a ```{block.lang} block needs `<!-- {kind}: ... -->` right before it"
    paths = block.source.split(":", 1)[1].split()
    for path in paths:
        assert (ROOT / path).is_file(), f"slide {slide_id(slide)}: no file {path}"
    if kind == "code":
        assert len(paths) == 1, f"slide {slide_id(slide)}: `<!-- code: PATH -->` names one file"
        problem = excerpt_problem(block.lines, python_source(paths[0]))
    else:
        assert len(paths) == 2, f"slide {slide_id(slide)}: `<!-- diff: OLD NEW -->` names two files"
        problem = diff_problem(block.lines, *paths)
    assert problem is None, f"slide {slide_id(slide)}, {block.source}: {problem}"


def test_every_excerpt_names_its_script_and_is_its_code():
    assert_every(check_excerpt, [(s, b) for s, b in BLOCKS if b.lang in ("python", "diff")])


def test_the_excerpt_check_allows_its_three_liberties_and_nothing_else():
    source = parse_source("def f(a, b):\n    x = g(a, b, c)  # why\n    y = h(1,\n          2)\n    return x + y\n")
    assert excerpt_problem(["x = g(a, b, c)"], source) is None  # dedented, comment cut
    assert excerpt_problem(["x = g(a,", "      b, c)"], source) is None  # broken inside brackets
    assert excerpt_problem(["def f(a, b):", "...", "    return x + y"], source) is None  # a marked gap
    assert excerpt_problem(["x = g(a, b, c)  # why", "y = h(1,", "      2)"], source) is None  # verbatim
    assert excerpt_problem(["x = g(a, b,", "c)"], source)  # a continuation not indented deeper
    assert excerpt_problem(["x = g(a, b, c)", "    # why"], source)  # a comment moved to the next line
    assert excerpt_problem(["x = g(a, b, c)  # why not"], source)  # another comment
    assert excerpt_problem(["def f(a, b):", "    return x + y"], source)  # a gap not marked
    assert excerpt_problem(["    return x + y", "...", "def f(a, b):"], source)  # out of order
    assert excerpt_problem(["x = g(a, b, d)"], source)  # not the code


def test_only_known_kinds_of_code_blocks():
    """A block of another language would escape the checks above (text blocks quote program output)."""
    for slide, block in BLOCKS:
        assert block.lang in ("python", "diff", "bash", "text"), f"slide {slide_id(slide)}: ```{block.lang}"


def commands(block_lines: list) -> list:
    """The commands of a bash block, continuation lines joined, comments dropped."""
    joined = "\n".join(line for line in block_lines).replace("\\\n", " ")
    return [line.split(" #")[0].strip() for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def defines(script, flag: str) -> bool:
    """Whether the script (a Python step: or common/, which holds the shared flags) defines the flag."""
    text = script.read_text()
    if script.suffix == ".py":
        text += "".join(p.read_text() for p in sorted((ROOT / "common").glob("*.py")))
        return f'"{flag}"' in text
    return re.search(rf"^\s*(\S+\|)?{re.escape(flag)}(\|\S+)?\)", text, flags=re.M) is not None  # a case label


def check_commands(slide, block):
    """A shell launcher's flags are its own; those after a bare `--` go to the Python script it starts."""
    for command in commands(block.lines):
        for part in re.split(r"&&|;|\|", command):
            words = part.split()
            for script in [w for w in words if w.endswith((".py", ".sh")) and "/" in w]:
                found = glob.glob(script, root_dir=ROOT)
                assert len(found) == 1 and (ROOT / found[0]).is_file(), f"slide {slide_id(slide)}: no {script}"
                target = ROOT / found[0]
                for word in words[words.index(script) + 1:]:
                    if word == "--" and target.suffix == ".sh":
                        started = re.findall(r"(\w+\.py)", target.read_text())
                        assert len(set(started)) == 1, f"{found[0]} starts {started}: which one gets the flags?"
                        target = target.parent / started[0]
                    elif word.startswith("--"):
                        flag = word.split("=")[0]
                        assert defines(target, flag), f"slide {slide_id(slide)}: {target.name} defines no {flag}"


def test_commands_run_scripts_that_exist_with_flags_they_define():
    assert_every(check_commands, [(s, b) for s, b in BLOCKS if b.lang == "bash"])


# --- numbers ---------------------------------------------------------------------------------------------------

def without_code(text: str) -> str:
    """The text without inline code, without Marp's images (`![w:1100](...)`: a size, not a measurement) and with
    each link shown as its text (`[more](#52)`: a slide number)."""
    text = IMAGE.sub(" ", re.sub(r"`[^`]*`", " ", text))
    return LINK.sub(r"\1", text)


def measured_numbers(text: str) -> list:
    """The measurement-like numbers in a text (see the module docstring), with their units."""
    text, found = without_code(text), []
    for match in NUMBER.finditer(text):
        number = match.group(1).rstrip(",")
        unit = UNIT.match(text, match.end())
        if "." in number or unit or int(number.replace(",", "")) >= 100:
            found.append(number + (unit.group() if unit else ""))
    return found


def as_published(number: str) -> str:
    """A measured number as the check compares it: its digits and its unit, thousands separators and spacing aside."""
    return re.sub(r"\s+", " ", number.replace(",", ""))


REHEARSAL_RESULTS = ROOT / "benchmarks/published/rehearsal/results.json"


def is_source(path: Path) -> bool:
    """A document or a published result that a slide may quote: not the slides, nor the rehearsal's results.md,
    which copies the slides' titles."""
    name = str(path.relative_to(ROOT))
    return path.is_file() and path != REHEARSAL_RESULTS.with_suffix(".md") and (
        name in ("README.md", "benchmarks/README.md") or re.fullmatch(r"0\d-[\w-]+/README\.md", name) is not None
        or name.startswith("benchmarks/published/") and path.suffix in (".md", ".json", ".txt"))


@functools.cache
def source_numbers(path: Path) -> frozenset:
    """The measured numbers a source publishes, with their units (a slide's 23.60% must be a percentage there, not
    any 23.60): of the rehearsal's results.json, those of the lines its runs printed."""
    if path == REHEARSAL_RESULTS:
        text = "\n".join(line for c in json.loads(path.read_text())["commands"] for line in c["last_lines"])
    else:
        text = path.read_text()
    return frozenset(as_published(number) for number in measured_numbers(text))


def slide_numbers(slide) -> list:
    """The measured numbers a slide states outside its generated regions (their numbers are rendered from a
    results.json: tests/test_tables.py checks them), in its text and its notes."""
    texts = [line for i, line in enumerate(slide.prose) if i not in slide.generated]
    texts += [MINUTES.sub(" ", note) for note in slide.notes]
    return [number for text in texts for number in measured_numbers(text)]


def check_numbers(slide):
    numbers = slide_numbers(slide)
    assert slide.sources or not numbers, \
        f"slide {slide_id(slide)}: name the sources of {numbers}: <!-- numbers: PATH ... -->"
    for source in slide.sources:
        assert is_source(ROOT / source), f"slide {slide_id(slide)}: {source} is no document or published result"
    published = set().union(*(source_numbers(ROOT / source) for source in slide.sources))
    published |= {as_published(n) for i in slide.generated for n in measured_numbers(slide.prose[i])}  # its tables
    missing = [number for number in numbers if as_published(number) not in published]
    assert not missing, f"slide {slide_id(slide)}: {missing} in none of {slide.sources}"


def test_every_measured_number_on_a_slide_is_in_the_sources_it_names():
    assert_every(check_numbers, [(slide,) for slide in SLIDES])


def test_a_number_counts_as_published_only_in_a_named_source_and_with_its_unit():
    rehearsal = source_numbers(REHEARSAL_RESULTS)
    assert "23.60%" in rehearsal and "23.60 s" not in rehearsal  # the digits alone are not enough
    assert "1.02B" not in rehearsal  # a slide's title, copied into the results: not a measurement
    slide = Slide(1, "t", prose=["# t", "- test acc 23.60% and 1.02B"], sources=[str(REHEARSAL_RESULTS.relative_to(
        ROOT))])
    with pytest.raises(AssertionError, match=r"\['1.02B'\] in none of"):
        check_numbers(slide)
    with pytest.raises(AssertionError, match="name the sources"):
        check_numbers(Slide(1, "t", prose=["# t", "- 23.60%"]))
    assert not is_source(ROOT / "slides/workshop.md") and not is_source(REHEARSAL_RESULTS.with_suffix(".md"))


def test_the_number_check_sees_what_it_should():
    assert measured_numbers("acc 42.55%, 0.887 of it, 1.68x, 24.1 s, 266 images/s, 7.60 GiB, 2,066 s") == \
        ["42.55%", "0.887", "1.68x", "24.1 s", "266 images/s", "7.60 GiB", "2,066 s"]
    assert measured_numbers("step 02, FSDP2, 2 workers, 10 epochs, CIFAR-10, 3x3 convs, `--epochs 100`") == []
    assert measured_numbers("Ray 2.60, 57 lines, 122 lines") == ["2.60", "122"]
    assert measured_numbers("![w:1100](diagrams/ddp.png) ![h:400](../benchmarks/published/x/y.png)") == []
    assert measured_numbers("[ring all-reduce](#152), [2.41M parameters](#3)") == ["2.41M"]


def test_generated_regions_are_tables_that_benchmarks_tables_py_renders():
    """Their numbers are left to tests/test_tables.py, which renders every region again from its results.json."""
    names = load_script("benchmarks/tables.py").TABLES
    for slide in SLIDES:
        for name in slide.regions:
            assert name in names, f"slide {slide_id(slide)}: no table {name!r} in benchmarks/tables.py's TABLES"


def test_the_parser_sees_regions_images_footers_and_links():
    deck = parse_deck("---\nmarp: true\n---\n\n# A\n\n<!-- _footer: \"More: [ring](#2)\" -->\n\n![h:300](x.png)\n\n"
                      "<!-- table: steps-slide -->\n| a | 1.5% |\n<!-- /table -->\n\n<!--\n~2 min\n-->\n\n---\n\n"
                      "# B\n\n[back](#1)\n\n<!-- ~1 min -->\n")
    a, b = deck
    assert (a.footer, a.links, a.images, a.regions, [a.prose[i] for i in a.generated]) == \
        ("More: [ring](#2)", [2], [("h:300", "x.png")], ["steps-slide"], ["| a | 1.5% |"])
    assert a.notes == ["~2 min"] and b.links == [1] and minutes(a) == 2


# --- presenter notes -------------------------------------------------------------------------------------------

def minutes(slide) -> float:
    return sum(float(m) for note in slide.notes for m in MINUTES.findall(note))


def check_notes(slide):
    assert slide.notes, f"slide {slide_id(slide)}: no presenter note (an HTML comment)"
    assert minutes(slide) > 0, f"slide {slide_id(slide)}: no '~N min' in its presenter notes"


def test_every_slide_has_presenter_notes_with_its_minutes():
    assert_every(check_notes, [(slide,) for slide in SLIDES])


def test_the_core_talk_fits_its_time_and_an_appendix_follows_it():
    dividers = [slide for slide in SLIDES if slide.title == APPENDIX]
    assert len(dividers) == 1, f"one divider slide titled exactly {APPENDIX!r} ends the core talk"
    core = sum(minutes(slide) for slide in CORE)
    assert core <= CORE_MINUTES, f"the core talk's notes add up to {core:g} minutes, more than {CORE_MINUTES}: " \
                                 f"move a deep dive into the appendix"
    assert APPENDIX_SLIDES, "the appendix holds the deep dives"


def test_the_agenda_times_are_the_notes_minutes():
    """The agenda slide's table: `| H:MM | what | A-B |`, each row starting at the minutes of the slides before A (and
    of any break row before it: `| H:MM | **Break**, N minutes | |`), and the rows cover the core, slide after slide."""
    agenda = next(slide for slide in CORE if slide.title == "Agenda")
    clock, covered = 0.0, []
    for line in agenda.prose:
        row = re.fullmatch(r"\|\s*(\d+):(\d\d)\s*\|(.*)\|\s*(?:(\d+)-(\d+))?\s*\|", line.strip())
        if not row:
            continue
        hours, mins, what, first, last = row.groups()
        if first is None:  # a break
            clock += float(re.search(r"(\d+) minutes", what).group(1))
            continue
        before = sum(minutes(slide) for slide in CORE if slide.number < int(first))
        assert int(hours) * 60 + int(mins) == clock + before, \
            f"agenda: {line.strip()} starts at {clock + before:g} minutes"
        covered += list(range(int(first), int(last) + 1))
    assert covered == [slide.number for slide in CORE], "the agenda's rows cover the core, slide after slide"
    end = re.search(r"end at (\d+):(\d\d)", "\n".join(agenda.prose))
    total = sum(minutes(slide) for slide in CORE) + clock
    assert end and int(end.group(1)) * 60 + int(end.group(2)) == total, f"the agenda ends at {total:g} minutes"


def test_the_core_has_hands_on_turns_and_recaps():
    turns = [slide for slide in CORE if slide.title.startswith("Your turn:")]
    steps = {re.search(r"step (\d\d)", slide.title).group(1) for slide in turns}
    assert len(turns) >= 4 and {"01", "02", "04"} <= steps and steps & {"05", "06"}, [s.title for s in turns]
    for slide in turns:
        assert [b.lang for b in slide.blocks] == ["bash", "text"], \
            f"slide {slide_id(slide)}: a command, then what it prints"
        assert any(line.lstrip("- ").startswith("Look for:") for line in slide.prose), f"slide {slide_id(slide)}"
    recaps = [slide.number for slide in CORE if slide.title.startswith("Recap")]
    step04 = max(slide.number for slide in CORE if slide.title.startswith("Step 04"))
    assert any(step04 < n < min(s.number for s in CORE if s.title.startswith("Step 05")) for n in recaps)
    assert recaps[-1] == CORE[-1].number, "the core ends with a recap"


def test_slides_readme_states_the_total_of_the_minutes():
    core = sum(minutes(slide) for slide in CORE)
    appendix = sum(minutes(slide) for slide in SLIDES[DIVIDER - 1:])
    readme = " ".join((ROOT / "slides/README.md").read_text().lower().split())
    for said in (f"the core talk's notes add up to about {core:g} minutes",
                 f"the appendix's (the divider included) to about {appendix:g} minutes"):
        assert said in readme, f"slides/README.md should say: {said!r}"


def test_every_link_to_a_slide_names_one_that_exists():
    for slide in SLIDES:
        for target in slide.links:
            assert 1 <= target <= len(SLIDES), f"slide {slide_id(slide)}: a link to slide {target}, the deck has " \
                                               f"{len(SLIDES)}"


def test_the_slides_readmes_example_link_is_one_the_deck_makes():
    """slides/README.md shows how a slide links to another with a link the deck has: renumbered, the deck's changes."""
    example = re.search(r"`\[([^\]]+)\]\(#(\d+)\)`", (ROOT / "slides/README.md").read_text())
    text, number = example.group(1), int(example.group(2))
    assert any(f"[{text}](#{number})" in line for slide in SLIDES for line in slide.prose + [slide.footer]), \
        f"slides/README.md's example [{text}](#{number}): no slide links so; the deck's link to {text!r} moved"


def check_appendix_links(slide):
    linked_from = [core.number for core in CORE if slide.number in core.links]
    assert linked_from, f"slide {slide_id(slide)}: no core slide links to it ([text](#{slide.number}))"
    assert set(slide.links) & set(linked_from), \
        f"slide {slide_id(slide)}: link back to a core slide that links to it (one of {linked_from}); " \
        f"it links to {slide.links}: was the deck renumbered?"


def test_every_appendix_slide_is_linked_from_the_core_slide_it_deepens_and_back():
    assert_every(check_appendix_links, [(slide,) for slide in APPENDIX_SLIDES])


def test_the_first_content_slide_is_what_to_install_before_the_workshop():
    slide = SLIDES[1]
    assert slide.title == "What you need installed before the workshop"
    text = "\n".join(slide.prose + [line for block in slide.blocks for line in block.lines])
    for needed in ("Python 3.10", "pip install -r requirements.txt", "--data-dir", "cifar10_train.npz",
                   "cifar10_test.npz", "--data synthetic"):
        assert needed in text, f"the install slide does not say {needed!r}"


# --- pictures --------------------------------------------------------------------------------------------------

IMAGES = [(slide, directive, path) for slide in SLIDES for directive, path in slide.images]


def image_size(directive: str, path: str) -> tuple:
    """The width and height (CSS pixels) at which Marp shows an image: `w:W` or `h:H`, the other side from the
    PNG's proportions (an `h:` image that does not exist yet is given its height alone, and width 0)."""
    sizes = dict(re.findall(r"\b([wh]):(\d+)", directive))
    assert sizes, f"{path}: give Marp a size, ![w:1100]({path}) or ![h:400]({path}); a PNG's own size is 2x"
    file = SLIDES_DIR / path
    if "w" in sizes and "h" in sizes:
        return int(sizes["w"]), int(sizes["h"])
    if not file.is_file():
        assert "h" in sizes, f"{path} does not exist: its height is unknown from w: alone"
        return 0, int(sizes["h"])
    with Image.open(file) as image:
        width, height = image.size
    if "w" in sizes:
        return int(sizes["w"]), int(sizes["w"]) * height / width
    return int(sizes["h"]) * width / height, int(sizes["h"])


def check_image(slide, directive, path):
    assert (SLIDES_DIR / path).is_file(), f"slide {slide_id(slide)}: no image slides/{path}"
    width, _ = image_size(directive, path)
    assert width <= TEXT_WIDTH, f"slide {slide_id(slide)}: {path} is {width:.0f} px wide at {directive}, the " \
                                f"slide's text {TEXT_WIDTH}"


def test_every_image_on_a_slide_exists_and_fits_the_width():
    assert_every(check_image, IMAGES)


def test_every_diagram_the_deck_uses_has_its_source_beside_it():
    for slide, _, path in IMAGES:
        file = (SLIDES_DIR / path).resolve()
        if file.parent == (SLIDES_DIR / "diagrams").resolve():
            sources = [file.with_suffix(suffix) for suffix in (".py", ".dot")]
            assert any(source.is_file() for source in sources), \
                f"slide {slide_id(slide)}: {path} has no source beside it ({file.stem}.py or {file.stem}.dot)"


def test_the_deck_shows_pictures():
    diagrams = {path for _, _, path in IMAGES if path.startswith("diagrams/")}
    assert len(diagrams) >= 5, f"the deck shows {len(diagrams)} of the diagrams in slides/diagrams/"


# --- the budget ------------------------------------------------------------------------------------------------

def text_px(markdown: str, char: float = TEXT_CHAR) -> float:
    """The width of a line of markdown on the slide, in pixels: markup dropped, inline code wider."""
    markdown = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", markdown)  # links show their text
    code = re.findall(r"`([^`]*)`", markdown)
    text = re.sub(r"`[^`]*`", "", markdown).replace("**", "").replace("*", "")
    return len(text) * char + sum(len(c) * CODE_CHAR * char / TEXT_CHAR + CODE_PADDING for c in code)


def wrapped(px: float, width: float) -> int:
    return max(1, math.ceil(px / (width * WRAP_MARGIN)))


def estimated_height(slide) -> float:
    """The height of the slide's content in pixels: its blocks, and a GAP between two blocks."""
    blocks, tables, previous = [], [], None
    for line in slide.prose:
        stripped = line.strip()
        item = re.match(r"(\s*)([-*]|\d+\.)\s+(.*)", line)
        if stripped.startswith("# "):
            line_height = H1_CODE_LINE if "`" in stripped else H1_LINE
            blocks.append(wrapped(text_px(stripped[2:], H1_CHAR), TEXT_WIDTH) * line_height + H1_PADDING)
            kind = "heading"
        elif stripped.startswith("## "):
            blocks.append(wrapped(text_px(stripped[3:], H1_CHAR * 0.8), TEXT_WIDTH) * H1_LINE * 0.8 + 24)
            kind = "heading"
        elif stripped.startswith("|"):
            kind = "table"
            if re.fullmatch(r"\|[\s:|-]+\|", stripped):
                continue
            cells = [c.strip() for c in stripped.strip("|").split("|")]
            if previous == "table":
                tables[-1].append(cells)
            else:
                tables.append([cells])
                blocks.append(tables[-1])  # its height, once all its rows are in

        elif IMAGE.fullmatch(stripped):
            kind = "image"
            blocks.append(image_size(*IMAGE.fullmatch(stripped).groups())[1] + IMAGE_EXTRA)
        elif item:
            kind = "list"
            height = wrapped(text_px(item.group(3)), LIST_WIDTH - 40 * len(item.group(1)) // 2) * TEXT_LINE
            blocks[-1:] = [blocks[-1] + ITEM_GAP + height] if previous == "list" else blocks[-1:] + [height]
        else:
            kind = "paragraph"
            blocks.append(wrapped(text_px(stripped), TEXT_WIDTH) * TEXT_LINE)
        previous = kind
    blocks = [table_height(block) if isinstance(block, list) else block for block in blocks]
    blocks += [len(block.lines) * CODE_LINE + CODE_PADDING_Y for block in slide.blocks]
    return sum(blocks) + GAP * (len(blocks) - 1)


def table_height(rows: list) -> float:
    """A table's height: ROW_HEIGHT a row, and a TEXT_LINE more for each line its tallest cell wraps onto. Chromium
    makes each column as wide as its widest cell; when the columns do not fit side by side, each gets a share of
    the width in proportion to its widest cell, and a cell wider than its share wraps (header cells too)."""
    widths = [[text_px(cell) for cell in row] for row in rows]
    columns = [max(row[i] for row in widths if i < len(row)) + CELL_PADDING for i in range(max(map(len, widths)))]
    share = min(1.0, TEXT_WIDTH * WRAP_MARGIN / sum(columns))
    height = 0.0
    for row in widths:
        lines = [1 if share == 1 else math.ceil(px / (columns[i] * share - CELL_PADDING)) for i, px in enumerate(row)]
        height += ROW_HEIGHT + (max(lines) - 1) * TEXT_LINE
    return height


def test_the_height_estimate_counts_pictures_and_tables_that_wrap():
    def height(body):
        return estimated_height(parse_deck(f"---\nmarp: true\n---\n\n# T\n\n{body}\n\n<!-- ~1 min -->\n")[0])
    title = H1_LINE + H1_PADDING
    assert height("![h:400](diagrams/ddp.png)") == title + GAP + 400 + IMAGE_EXTRA
    assert height("![w:1100](diagrams/ddp.png)") == pytest.approx(title + GAP + 450 + IMAGE_EXTRA)  # 2200x900
    assert height("| a | b |\n|---|---|\n| 1 | 2 |") == title + GAP + 2 * ROW_HEIGHT
    row = "| " + " | ".join(["a long column heading"] * 5) + " |"
    wide = f"{row}\n|---|---|---|---|---|\n| " + " | ".join("x" * 5) + " |"
    assert height(wide) > title + GAP + 2 * ROW_HEIGHT  # too wide for the slide: the headings wrap


def check_frame(slide):
    for block in slide.blocks:
        assert len(block.lines) <= MAX_CODE_LINES, \
            f"slide {slide_id(slide)}: a code block of {len(block.lines)} lines (at most {MAX_CODE_LINES})"
        for line in block.lines:
            assert len(line) <= MAX_CODE_COLUMNS, \
                f"slide {slide_id(slide)}: a {len(line)}-column code line (Marp would shrink the block): {line!r}"
    height = estimated_height(slide)
    assert height <= SLIDE_HEIGHT, f"slide {slide_id(slide)}: about {height:.0f} px of content, the frame holds " \
                                   f"{SLIDE_HEIGHT}: split it"


def test_every_slide_fits_the_frame_at_full_size():
    assert_every(check_frame, [(slide,) for slide in SLIDES])
