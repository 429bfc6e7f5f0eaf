"""The release's pages: the CHANGELOG in Keep a Changelog form; CONTRIBUTING.md and SECURITY.md say what they must."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import lightning_mpi_env
from lightning_mpi_env.rollcall import store_values
from tests.test_project import readme_commands

ROOT = Path(__file__).resolve().parents[1]
HOME = "https://github.com/lightning-mpi-env/lightning-mpi-env"
SECTIONS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
"""Keep a Changelog's kinds of change, in its order."""
RELEASE = re.compile(r"## \[(?P<version>\d+\.\d+\.\d+)\] - (?P<date>\d{4}-\d{2}-\d{2})")
MAX_ENTRY = 220
"""The longest entry of a release, in characters: a line or two."""


def changelog() -> str:
    return (ROOT / "CHANGELOG.md").read_text()


def versions() -> list[str]:
    """The CHANGELOG's version headings, top to bottom: ``Unreleased``, then each release's version."""
    headings = re.findall(r"^## .*$", changelog(), flags=re.MULTILINE)
    return [
        "Unreleased" if heading == "## [Unreleased]" else RELEASE.fullmatch(heading)["version"]  # type: ignore[index]
        for heading in headings
    ]


def newest_release() -> str:
    """The version of the newest release the CHANGELOG records."""
    return versions()[1]


def release_text(version: str) -> str:
    text = changelog()
    start = text.index(f"## [{version}]")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else text.index("\n[Unreleased]: ")]


def entries(version: str) -> list[str]:
    """A release's entries, each as one line."""
    found: list[str] = []
    for line in release_text(version).splitlines():
        if line.startswith("- "):
            found.append(line[2:])
        elif line.startswith("  ") and found:
            found[-1] += " " + line.strip()
    return found


def test_changelog_is_unreleased_then_dated_releases_newest_first():
    found = versions()  # a heading that is neither is a TypeError here
    assert found[0] == "Unreleased"
    released = [tuple(map(int, version.split("."))) for version in found[1:]]
    assert released, "no release recorded"
    assert released == sorted(released, reverse=True)
    assert len(set(released)) == len(released)


def test_the_newest_release_is_the_package_version():
    assert newest_release() == lightning_mpi_env.__version__


def test_every_version_links_to_its_changes():
    found = versions()
    links = dict(re.findall(r"^\[([^\]]+)\]: (\S+)$", changelog(), flags=re.MULTILINE))
    assert links["Unreleased"] == f"{HOME}/compare/v{found[1]}...HEAD"
    for version, previous in zip(found[1:], [*found[2:], None], strict=True):
        expected = f"{HOME}/releases/tag/v{version}" if previous is None else f"{HOME}/compare/v{previous}...v{version}"
        assert links[version] == expected


@pytest.mark.parametrize("version", versions()[1:])
def test_a_release_lists_short_user_facing_entries_by_kind(version: str):
    text = release_text(version)
    kinds = re.findall(r"^### (.*)$", text, flags=re.MULTILINE)
    assert kinds, f"{version} lists no changes"
    assert set(kinds) <= set(SECTIONS)
    assert kinds == sorted(set(kinds), key=SECTIONS.index)  # each kind once, in Keep a Changelog's order
    found = entries(version)
    assert found
    assert not [entry for entry in found if len(entry) > MAX_ENTRY]
    # For users: no issue numbers and no development history (the tests, CI, benchmarks' timings stay in git).
    assert not re.search(r"\bissues? \d|#\d", text, flags=re.IGNORECASE)
    assert not [entry for entry in found if "tests/" in entry or "`pytest" in entry]


def test_the_first_release_removes_nothing():
    # Nothing was released before it: what it does not offer is not a change.
    assert "### Removed" not in release_text(versions()[-1])


def test_contributing_says_how_to_set_up_test_and_check_a_change():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    _, test_command = readme_commands()
    assert test_command in text  # the README's own set-up command
    for words in ("pytest --runslow", "`smoke`", "`mpi`", "`slow`", "ruff check", "ruff format --check", "mypy"):
        assert words in text
    # The bars docs/development.md's table holds, and the CHANGELOG entry in the same commit.
    for bar in ("trust cases", "Lightning unchanged", "Uneven launches", "`srun` and `mpirun`", "Stalls", "CHANGELOG"):
        assert bar in text
    assert "docs/development.md" in text


def test_security_states_the_trust_model_the_parser_enforces():
    text = " ".join((ROOT / "SECURITY.md").read_text().split())
    for words in (
        "TCPStore",
        "no authentication",
        "trusted network",
        "MASTER_ADDR:MASTER_PORT",
        "rollcall/store_values.py",
    ):
        assert words in text
    # The bounds it states are the parser's.
    assert store_values.MAX_VALUE_BYTES == 1 << 20
    assert "1 MiB at most" in text
    assert store_values.MAX_RANKS == 2**24
    assert "at most 2^24 ranks" in text
    assert f"at most {store_values.MAX_TEXT:,} characters" in text
    assert f"at most {store_values.MAX_ITEMS:,} items" in text
    assert f"{HOME}/security/advisories/new" in text
    # The supported line is the package's own.
    line = ".".join(lightning_mpi_env.__version__.split(".")[:2])
    assert f"| {line}.x | yes |" in (ROOT / "SECURITY.md").read_text()


@pytest.mark.parametrize("page", ["CHANGELOG.md", "CONTRIBUTING.md", "SECURITY.md"])
def test_relative_links_resolve(page: str):
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", (ROOT / page).read_text())
    assert [target for target in targets if not (ROOT / target).exists()] == []
