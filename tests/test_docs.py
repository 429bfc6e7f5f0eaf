"""The README and docs/ hold: complete snippets, links that resolve, tables that match the rows, every error listed."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_tables import TABLES, block

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ERRORS = {
    "AddressError",
    "LayoutError",
    "RendezvousError",
    "SettingError",
    "MixedImportError",
    "StrategyImportError",
    "JobIdError",
    "CheckpointError",
    "FailureRecordError",
    "ProgressRecordError",
    "CommandError",
    "MpirunNotFoundError",
    "ApproximateNodeRankWarning",
    "MixedImportWarning",
}


def snippets() -> list[tuple[str, int, str, bool]]:
    """``(page, line, code, runs)`` for every Python block; ``runs`` when ``<!-- run -->`` follows it."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"```python\n(.*?)```\n(<!-- run -->)?", text, flags=re.DOTALL):
            line = text[: match.start()].count("\n") + 1
            found.append((page.name, line, match.group(1), match.group(2) is not None))
    return found


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, len(lines)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_relative_links_resolve(page):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" not in target:
            assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


@pytest.mark.parametrize(("page", "line", "code", "runs"), snippets(), ids=lambda value: str(value)[:20])
def test_every_python_snippet_compiles(page, line, code, runs):
    compile(code, f"{page}:{line}", "exec")
    assert "import " in code, f"{page}:{line}: a snippet states its imports"


@pytest.mark.parametrize(
    ("page", "line", "code"),
    [(page, line, code) for page, line, code, runs in snippets() if runs],
    ids=lambda value: str(value)[:20],
)
def test_runnable_snippets_run(page, line, code, tmp_path):
    # A fresh interpreter each: some snippets are about what a process imports first.
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 0, f"{page}:{line}\n{result.stderr[-3000:]}"


def test_the_docs_snippets_that_print_say_what_they_print():
    # The layout snippet's comment is its output.
    ((_, _, code, _),) = [s for s in snippets() if s[0] == "launchers.md" and "from_env" in s[2]]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.splitlines() == [
        "RankLayout(rank=5/8, local=1/4, node=1~/2~, main=g0001:24513, from=Open MPI)",
        "OMPI_COMM_WORLD_RANK // OMPI_COMM_WORLD_LOCAL_SIZE (assumed block placement)",
    ]


@pytest.mark.parametrize("name", TABLES)
def test_tables_are_generated_from_the_rows(name):
    file, render = TABLES[name]
    match = block(name).search((ROOT / file).read_text())
    assert match is not None, f"{file} has no <!-- {name}:begin --> block"
    assert match.group(2) == render() + "\n", f"run `.venv/bin/python -m tests.docs_tables` to rewrite {file}"


def _static_pieces(node: ast.AST) -> list[str]:
    """The literal text of a message argument (an f-string's constant parts), in order."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [value.value for value in node.values if isinstance(value, ast.Constant)]
    if isinstance(node, ast.BinOp):
        return _static_pieces(node.left) + _static_pieces(node.right)
    return []


def test_troubleshooting_covers_every_error():
    table = (ROOT / "docs" / "troubleshooting.md").read_text()
    missing = []
    for module in sorted((ROOT / "lightning_mpi_env").rglob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ERRORS and node.args:
                pieces = [piece.strip(" .:,'()") for piece in _static_pieces(node.args[0])]
                words = [piece for piece in pieces if len(piece) >= 8]
                if words and not any(piece in table for piece in words):
                    missing.append(f"{module.name}:{node.lineno}: {words}")
    assert not missing, "troubleshooting rows missing for:\n" + "\n".join(missing)


def test_every_example_is_documented_and_exists():
    text = "".join(page.read_text() for page in PAGES)
    mentioned = set(re.findall(r"examples/[\w/.-]+\.(?:py|sh|sbatch|bsub)", text))
    present = {str(path.relative_to(ROOT)) for path in (ROOT / "examples").rglob("*") if path.is_file()}
    present = {path for path in present if "__pycache__" not in path}
    assert mentioned == present


def test_no_figure_is_left_to_fill_in():
    for page in PAGES:
        assert not re.search(r"\bFIGURES-[A-Z-]+\b|\bSUITE-TIME\b", page.read_text()), page.name
