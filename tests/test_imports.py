"""The house's import rules (#73): no script outside tests/ edits sys.path (the packages are installed: `pip install
-e .`, pyproject.toml); the benchmarks import one another by package name only, so that no module is loaded twice
under two names; and their import graph, imports inside functions included, has no circle."""
import ast

from conftest import ROOT

OUTSIDE_TESTS = sorted(p for p in ROOT.glob("**/*.py") if not p.is_relative_to(ROOT / "tests")
                       and not any(part.startswith(".") for part in p.relative_to(ROOT).parts))
BENCHMARKS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__")


def imported_names(path) -> list:
    """Every module a file imports, anywhere in it: `import a.b` gives a.b, `from a import b` gives a and a.b."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return names


def edits_sys_path(path) -> bool:
    return any(isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys"
               for node in ast.walk(ast.parse(path.read_text())))


def test_no_script_outside_the_tests_edits_the_import_path():
    assert [str(p.relative_to(ROOT)) for p in OUTSIDE_TESTS if edits_sys_path(p)] == []


def benchmark_imports(stem: str) -> set:
    """The benchmarks a benchmark imports, by package name."""
    return {name.split(".")[1] for name in imported_names(ROOT / "benchmarks" / f"{stem}.py")
            if name.startswith("benchmarks.") and name.split(".")[1] in BENCHMARKS}


def test_the_benchmarks_import_each_other_by_package_name_only():
    bare = {stem: sorted(set(imported_names(ROOT / "benchmarks" / f"{stem}.py")) & set(BENCHMARKS))
            for stem in BENCHMARKS}
    assert {stem: names for stem, names in bare.items() if names} == {}, "import benchmarks.NAME, not NAME"


def test_the_benchmarks_import_graph_has_no_circle():
    graph = {stem: benchmark_imports(stem) for stem in BENCHMARKS}

    def circle_from(stem, path):
        for name in sorted(graph[stem]):
            if name in path:
                return [*path[path.index(name):], name]
            found = circle_from(name, [*path, name])
            if found:
                return found
        return None
    circles = [c for c in (circle_from(stem, [stem]) for stem in BENCHMARKS) if c]
    assert circles == [], " -> ".join(circles[0])
