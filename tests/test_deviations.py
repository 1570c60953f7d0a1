"""The deviations from the papers: each named in one line of one module docstring, argued in one row
of docs/paper_code.md's table, and the two lists the same.

A module docstring lists its deviations under a line that starts with "Deviations from", one line
each, `- name: what differs`, until a blank line or the docstring's end. The table's rows start
`| name | where | ...`, `where` naming the file whose docstring lists the name."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "paper_code.md"
NAME = r"[a-z0-9]+(?:-[a-z0-9]+)+"  # kebab-case, at least two words
LINE = re.compile(rf"- ({NAME}): \S")


def modules() -> list[Path]:
    """The project's code outside tests/: the top level, infra/, scripts/, benchmarks/."""
    files = sorted(ROOT.glob("*.py"))
    for folder in ("infra", "scripts", "benchmarks"):
        files += sorted((ROOT / folder).rglob("*.py"))
    return files


def docstring_deviations() -> dict[str, list[str]]:
    """name -> the files (relative paths) whose module docstring lists it; asserts the format."""
    found: dict[str, list[str]] = {}
    for file in modules():
        doc = ast.get_docstring(ast.parse(file.read_text(encoding="utf-8")), clean=False) or ""
        lines = doc.splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith("Deviations from")]
        assert len(starts) <= 1, f"{file.name}: more than one 'Deviations from' list"
        if not starts:
            continue
        rel = file.relative_to(ROOT).as_posix()
        block = []
        for line in lines[starts[0] + 1 :]:
            if not line.strip():
                break
            block.append(line)
        assert block, f"{rel}: a 'Deviations from' line with no deviation under it"
        for line in block:
            match = LINE.match(line)
            assert match, (
                f"{rel}: {line!r} is not one line '- name: what differs' (a deviation takes one "
                "line; its argument goes to docs/paper_code.md's table)"
            )
            assert len(line) <= 100, f"{rel}: {line!r} is {len(line)} characters (at most 100)"
            found.setdefault(match.group(1), []).append(rel)
    return found


def table_rows() -> dict[str, str]:
    """name -> the `where` cell of its row in docs/paper_code.md's deviation table."""
    lines = TABLE.read_text(encoding="utf-8").splitlines()
    header = [i for i, line in enumerate(lines) if re.match(r"\| name \| where \|", line)]
    assert len(header) == 1, "docs/paper_code.md: expected one table headed | name | where |"
    rows: dict[str, str] = {}
    for line in lines[header[0] + 2 :]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        name = cells[0].strip("`")
        assert re.fullmatch(NAME, name), f"docs/paper_code.md: row name {name!r} is not kebab-case"
        assert name not in rows, f"docs/paper_code.md: two rows for {name}"
        assert len(cells) == 5, f"docs/paper_code.md: row {name} has {len(cells)} cells, not 5"
        rows[name] = cells[1]
    return rows


def test_each_deviation_is_listed_once_in_one_line():
    found = docstring_deviations()
    assert len(found) >= 40, sorted(found)  # the lists were found at all
    twice = {name: files for name, files in found.items() if len(files) > 1}
    assert not twice, f"deviations listed in more than one module docstring: {twice}"


def test_docstrings_and_table_name_the_same_deviations():
    found, rows = docstring_deviations(), table_rows()
    missing = sorted(set(found) - set(rows))
    assert not missing, f"named in a module docstring, no row in docs/paper_code.md: {missing}"
    orphans = sorted(set(rows) - set(found))
    assert not orphans, f"a row in docs/paper_code.md, named in no module docstring: {orphans}"
    for name, (file,) in found.items():
        assert file in rows[name], f"{name}: the row's `where` ({rows[name]}) does not name {file}"


def test_citation_lists_name_existing_deviations():
    """A parenthesised list that cites one deviation, "(branch-waves, rsm-threshold)", cites only
    deviations: each of its kebab-case items is a listed name."""
    known = set(docstring_deviations())
    bad = []
    for file in modules():
        for group in re.findall(r"\(([^()]*)\)", file.read_text(encoding="utf-8")):
            items = [item.strip() for item in re.split(r"[,;:]", group)]
            kebab = [item for item in items if re.fullmatch(NAME, item)]
            if any(item in known for item in kebab):
                bad += [(file.name, item) for item in kebab if item not in known]
    assert not bad, f"citations of deviations that no module docstring lists: {bad}"
