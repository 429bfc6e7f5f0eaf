"""The README's promises about set-up and CI hold."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.DOTALL)
    return [line.strip() for block in blocks for line in block.splitlines() if "python3 -m venv" in line]


def test_readme_has_exactly_two_setup_commands_demo_and_tests():
    demo, tests = readme_commands()
    assert demo.endswith("examples/demo.py")
    assert tests.endswith("-m pytest")
    for command in (demo, tests):
        assert "torch==2.13.0" in command  # never a plain `torch`, which pulls CUDA wheels on a CPU machine


def test_ci_runs_the_readme_test_command():
    _, tests = readme_commands()
    assert tests in (ROOT / ".ci" / "run").read_text()


def test_changelog_has_an_unreleased_section():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in text
    assert "### Added" in text


@pytest.mark.parametrize("command", [["ruff", "check", "."], ["ruff", "format", "--check", "."], ["mypy"]])
def test_lint_format_and_strict_types_are_clean(command):
    # The README promises it; the tools come with the `test` extra, next to this interpreter.
    tool = Path(sys.executable).parent / command[0]
    result = subprocess.run(
        [str(tool), *command[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
