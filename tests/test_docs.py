"""The README and docs/ hold: complete snippets, links that resolve, tables that match the rows, every error listed.

And they serve users: the README's first screen (what, install, the one line, launch, a failure, two commands), user
pages without issue numbers or design notes, every setting on the settings page, troubleshooting by symptom first.
"""

from __future__ import annotations

import ast
import enum
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_mpi_env.core.settings import SETTINGS, Settings
from tests.docs_tables import TABLES, block

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DEVELOPER_PAGES = {"development.md", "benchmarks.md", "architecture.md"}
USER_PAGES = [page for page in PAGES if page.name not in DEVELOPER_PAGES]
"""The pages a user reads: no issue numbers, no design notes (docs/notes/ and the developer pages keep those)."""
FIRST_SCREEN = 60
"""Lines of the README a user sees before scrolling, give or take a terminal."""
SYMPTOMS = [
    "The job hangs at init",
    "The job hangs during training",
    "A rank appears twice",
    "A job ends with a stall line",
    "A requeued job does not resume",
    "A relaunch leaves out a healthy host",
    "Lightning advises prepending `srun` under `srun`",
    "The job is slower than it should be",
]
"""The headings docs/troubleshooting.md opens with, in this order, before its table of errors."""
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
    "StallError",
    "HostFileError",
    "TooFewHostsError",
    "LayoutWarning",
    "CheckpointWarning",
    "FabricWarning",
    "DeviceIndexWarning",
    "DeviceIdWarning",
    "UnknownSettingWarning",
    "NodeCheckError",
    "NodeCheckWarning",
    "RecoveryError",
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


def _fenced(text: str, language: str) -> list[str]:
    """The contents of every ```language block of ``text``."""
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def _package_messages() -> list[str]:
    """The literal pieces of every message this package raises or warns with (20 characters or more)."""
    pieces = []
    for module in sorted((ROOT / "lightning_mpi_env").rglob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Call) and node.args:
                pieces += [piece.strip() for piece in _static_pieces(node.args[0]) if len(piece.strip()) >= 20]
    return pieces


def test_the_readme_first_screen_says_what_how_and_what_a_failure_looks_like():
    text = (ROOT / "README.md").read_text()
    screen = "\n".join(text.splitlines()[:FIRST_SCREEN])
    assert "pip install " in screen
    # The one recommended line, before any other way in.
    assert "from lightning_mpi_env.pytorch import MPIDDPStrategy" in screen
    assert "Trainer(strategy=MPIDDPStrategy())" in screen
    assert "plugins=[MPIClusterEnvironment()]" not in screen
    assert 'strategy="ddp"' not in screen
    commands = [line.strip() for block in _fenced(screen, "bash") for line in block.splitlines()]
    assert any(line.startswith("srun ") for line in commands), "an srun command"
    assert any(line.startswith("mpirun ") for line in commands), "an mpirun command"
    # The demo and the test command, whole (CI runs the latter as it is written).
    setup = [line for line in commands if line.startswith("python3 -m venv")]
    assert [command.rsplit(" ", 1)[-1] for command in setup] == ["examples/demo.py", "pytest"], setup
    # What a failure looks like: a message this package really prints, not one written for the page.
    (failure,) = [block for block in _fenced(screen, "text") if "HINT:" in block]
    shown = " ".join(failure.split())
    assert re.search(r"^\w+Error: ", failure), failure
    assert any(" ".join(piece.split()) in shown for piece in _package_messages()), failure
    # Timings, test counts and machines belong to docs/development.md and docs/benchmarks.md.
    assert not re.search(r"\b\d+(\.\d+)?\s*(ms|s|min|minutes|seconds|hours?)\b", screen), "a timing"
    assert not re.search(r"\b\d[\d,]*\s+(tests|cores)\b|\bCI\b", screen), "a test count or CI figure"


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda page: page.name)
def test_user_pages_cite_no_issue_numbers_or_design_notes(page):
    text = page.read_text()
    # An upstream reference (pytorch/pytorch#123) tells a user where a bug of torch lives; "issue 24" or "#24" is
    # this project's history.
    assert not re.search(r"\bissues?\s+#?\d+", text, flags=re.IGNORECASE), page.name
    assert not re.search(r"(?<![\w/.-])#\d+\b", text), page.name
    assert "notes/" not in text, f"{page.name} links a design note"


HISTORY_PAGES = [page for page in PAGES if page.name not in {"development.md", "benchmarks.md"}]
"""Pages that describe the package as it is: the story of how it got there stays in git and the CHANGELOG."""
HISTORY = re.compile(
    r"\b(earlier|previous|older|former) (versions?|releases?)\b|\bwas called\b|\bwere called\b|\bused to\b"
    r"|\bno longer\b|\bold name\b|\bformerly\b|\brenamed from\b|\bnow (?:is|are|takes|does)\b",
    flags=re.IGNORECASE,
)
"""Phrases that tell the package's history (``used to``, ``no longer``, ``was called``, ``earlier versions``)."""
JARGON = {"verdict": r"\bverdict\b", "level": r"\branks (?:are )?(?:not )?level\b"}
"""Our own words a newcomer cannot look up, with how they appear: glossed in plain words where they first appear."""


def _prose(text: str) -> str:
    """A page without its code blocks and code spans (quoted messages and code may say anything)."""
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    return re.sub(r"``.+?``|`[^`\n]+`", "`code`", text)


@pytest.mark.parametrize("page", HISTORY_PAGES, ids=lambda page: page.name)
def test_user_pages_tell_no_history(page):
    found = [match.group(0) for match in HISTORY.finditer(_prose(page.read_text()))]
    assert not found, f"{page.name}: say what the package does, not what it did: {found}"


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda page: page.name)
def test_user_pages_name_no_test_files(page):
    # A user cannot run or read the tests of an installed package: say what is checked, not where.
    found = re.findall(r"(?<![\w.-])tests/[\w/.-]*", page.read_text())
    assert not found, f"{page.name}: {found}"


def _reading_order() -> list[Path]:
    """The user pages as a reader meets them: the README, then the pages in the order it first links them."""
    readme = ROOT / "README.md"
    linked = re.findall(r"\]\(docs/([\w.-]+\.md)", readme.read_text())
    order = dict.fromkeys([readme, *(ROOT / "docs" / name for name in linked), *USER_PAGES])
    return [page for page in order if page in USER_PAGES]


@pytest.mark.parametrize("term", list(JARGON))
def test_jargon_is_glossed_where_a_reader_first_meets_it(term):
    pages = _reading_order()
    assert len(pages) == len(USER_PAGES)
    for page in pages:
        text = _prose(page.read_text())
        match = re.search(JARGON[term], text, flags=re.IGNORECASE)
        if match:
            # A gloss: a parenthesis or a colon right after the word, saying it in plain words.
            after = text[match.end() : match.end() + 200]
            assert re.match(r"\**\s*[(:]\s*\w", after), f"{page.name}: {term!r} without a gloss: {after[:80]!r}"
            return
    pytest.fail(f"no user page says {term!r}: drop it from JARGON")


def _table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of each row of the table whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def _default(value: object) -> str:
    """A setting's default as the settings page writes it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, str):
        return value or "unset"
    return f"{value:g}"


KINDS = {bool: "switch", float: "seconds", int: "count", str: "", enum.Enum: "choice"}
"""The type a settings row names for each kind of default (a text setting names its own form)."""
FACTORS = frozenset({"straggler_factor"})
"""The settings whose float is a ratio, not seconds."""


def test_the_settings_page_lists_every_setting():
    text = (ROOT / "docs" / "settings.md").read_text()
    rows = {row[0].strip("`"): row for row in _table_rows(text, "| Variable | Type | Default | Range |")}
    assert list(rows) == [setting.variable for setting in SETTINGS]
    defaults = Settings()
    for setting in SETTINGS:
        variable, kind, default, allowed, reader, meaning = rows[setting.variable]
        value = getattr(defaults, setting.field)
        assert default == _default(value), variable
        assert meaning == setting.meaning, f"{variable}: copy the meaning from core/settings.py"
        expected = "factor" if setting.field in FACTORS else next(k for c, k in KINDS.items() if isinstance(value, c))
        assert kind.startswith(expected), variable
        assert allowed, f"{variable}: its range"
        assert reader, f"{variable}: what reads it"
    # The one table: the other pages link here.
    for linking in ("README.md", "docs/roll-call.md", "docs/troubleshooting.md"):
        assert "settings.md" in (ROOT / linking).read_text(), linking
    assert "<!-- settings:begin -->" not in (ROOT / "docs" / "roll-call.md").read_text(), "one settings table"


def test_troubleshooting_opens_with_the_symptoms():
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    headings = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    assert headings[: len(SYMPTOMS) + 1] == [*SYMPTOMS, "Errors"]
    assert text.index("## Errors") < text.index("| Message begins with")
    for symptom, body in zip(SYMPTOMS, re.split(r"^## .+$", text, flags=re.MULTILINE)[1:], strict=False):
        assert len(body.strip().splitlines()) <= 30, f"{symptom}: a few lines, the details in the table"


def test_troubleshooting_rows_are_short():
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    long = [row[:80] for row in rows if len(row) > 400]
    assert not long, long
    assert sum(len(row) > 300 for row in rows) <= len(rows) // 10


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_relative_links_resolve(page):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" not in target:
            assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


def _anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, as GitHub makes them (lower case, punctuation dropped, spaces to dashes)."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_links_to_a_section_find_it(page):
    for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", page.read_text()):
        if "://" not in target:
            linked = page.parent / target if target else page
            assert anchor in _anchors(linked), f"{page.name}: no section #{anchor} in {linked.name}"


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


# docs/settings.md holds the settings in a richer table, checked cell by cell above.
@pytest.mark.parametrize("name", list(TABLES))
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


def test_the_development_page_says_what_its_times_assume_and_where_to_start():
    text = " ".join((ROOT / "docs" / "development.md").read_text().split())
    # A newcomer on shared cores measured twice the figure: the page says what the figure assumes.
    for words in ("idle machine with 2 cores", "`CI=true`", "`-n 4`", "already installed", "shared"):
        assert words in text, words
    assert "pytest -m smoke" in text
    assert "smoke" in (ROOT / "pyproject.toml").read_text().split("markers = [", 1)[1].split("]", 1)[0]


def test_the_smoke_tier_is_a_fast_first_check_of_each_layer():
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "smoke", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    files = {node_id.split("::")[0] for node_id in ids}
    for module in ("tests/core/test_layout.py", "tests/tools/test_cli.py", "tests/test_docs.py"):
        assert module in files, module
    assert "tests/test_examples.py::test_each_demo_step_title_says_what_it_runs" in ids
    assert any(node_id.startswith("tests/rollcall/test_fail_fast.py::") for node_id in ids), "a real roll call job"
    # Nothing that starts Lightning per test, no hypothesis property, nothing of the whole suite only.
    assert not [node_id for node_id in ids if "test_runnable_snippets_run" in node_id or "test_property_" in node_id]
    assert "tests/test_packaging.py" not in files
    assert 100 < len(ids) < 1000, len(ids)


def test_the_changelog_s_unreleased_entries_speak_to_users():
    # Internal moves and the project's own development are in git and docs/development.md, not in users' notes.
    text = (ROOT / "CHANGELOG.md").read_text()
    unreleased = text.split("## [Unreleased]", 1)[1].split("\n## [", 1)[0]
    entries = [line for line in unreleased.splitlines() if line.startswith("- ")]
    assert entries
    internal = [entry for entry in entries if re.match(r"- (Internal|Development|Tests?|Refactor)\b", entry)]
    assert not internal, internal
