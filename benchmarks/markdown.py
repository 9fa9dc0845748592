"""Markdown for the benchmarks' tables: the one table writer every renderer shares."""


def table(heading: list, rows) -> list:
    """A Markdown table's lines: the heading, its rule, a line per row (an empty cell is `| |`)."""
    def cells(row):
        return "|" + "".join(f" {cell} |" if cell != "" else " |" for cell in row)
    return [cells(heading), "|---" * len(heading) + "|"] + [cells(row) for row in rows]
