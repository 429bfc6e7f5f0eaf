"""The share of the package's lines that are docstrings or whole-line comments, per folder and in all.

Run: python benchmarks/doc_share.py [PACKAGE_DIR]

A docstring is a string literal that is a statement of its own (module, class, function or attribute docstring);
its lines count in full. A comment line is a line whose first token is ``#``. Blank lines count as neither.
"""

from __future__ import annotations

import ast
import sys
import tokenize
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def doc_and_comment_lines(path: Path) -> tuple[int, int, int]:
    """(lines, docstring lines, whole-line comment lines) of one module."""
    text = path.read_text()
    lines = text.splitlines()
    documented: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            documented.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    comments = set()
    with path.open("rb") as source:
        for token in tokenize.tokenize(source.readline):
            if token.type == tokenize.COMMENT and not lines[token.start[0] - 1][: token.start[1]].strip():
                comments.add(token.start[0])
    return len(lines), len(documented), len(comments - documented)


def main() -> int:
    package = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "lightning_mpi_env"
    totals: Counter[str] = Counter()
    by_folder: dict[str, Counter[str]] = {}
    for path in sorted(package.rglob("*.py")):
        lines, docs, comments = doc_and_comment_lines(path)
        folder = str(path.parent.relative_to(package.parent))
        for counter in (totals, by_folder.setdefault(folder, Counter())):
            counter.update(lines=lines, docs=docs, comments=comments)
    print(f"{'folder':<40} {'lines':>7} {'docstrings':>10} {'comments':>9} {'share':>6}")
    for folder, counts in [*sorted(by_folder.items()), ("all", totals)]:
        share = (counts["docs"] + counts["comments"]) / max(counts["lines"], 1)
        print(f"{folder:<40} {counts['lines']:>7} {counts['docs']:>10} {counts['comments']:>9} {share:>6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
