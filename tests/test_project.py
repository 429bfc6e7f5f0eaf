"""The README's promises about set-up and CI hold."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
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


def test_ci_runs_the_readme_test_command_then_the_rest_of_the_whole_suite():
    _, tests = readme_commands()
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    default = next(index for index, line in enumerate(lines) if tests in line)
    assert any("-m pytest --runslow -m slow" in line for line in lines[default + 1 :])
    assert all("--durations=30" in line for line in lines if "-m pytest" in line)


def test_the_readme_names_the_whole_suite_switch():
    assert "python -m pytest --runslow" in (ROOT / "README.md").read_text()


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


LAYERS = {
    "core": set(),
    "gpu": {"core"},
    "rollcall": {"core", "gpu"},
    "checks": {"core", "gpu"},
    "imports": {"core"},
    "lightning": {"core", "gpu", "rollcall", "checks", "imports", "recovery"},
    "supervise": {"core"},
    "recovery": {"core", "rollcall"},
    "tools": {"core", "gpu", "rollcall", "checks", "supervise", ""},  # "": the package itself, for its __version__
}
"""What each layer may import of this package (docs/architecture.md)."""

THIRD_PARTY = {
    "core": set(),
    "rollcall": {"torch"},
    "checks": {"torch"},
    "gpu": set(),
    "imports": set(),
    "lightning": {"typing_extensions", "lightning_utilities", "torch"},
    "supervise": set(),
    "recovery": {"torch"},
    "tools": {"torch"},
}
"""What each layer may import besides the standard library (third-party imports may be lazy, inside functions)."""

MODULES_ALSO = {"recovery": {"lightning.compat"}}
"""Single modules of a layer not in the table that a layer may import: ``lightning/compat.py``, the one home of
Lightning's and torch's private names, for torch's reconfigure API (it imports nothing of ``lightning/`` itself)."""


def _imports(path: Path) -> set[str]:
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layers_import_only_what_they_may(layer):
    problems = []
    for path in sorted((ROOT / "lightning_mpi_env" / layer).rglob("*.py")):
        for name in _imports(path):
            top, _, rest = name.partition(".")
            if top == "lightning_mpi_env":
                used = rest.partition(".")[0]
                if used != layer and used not in LAYERS[layer] and rest not in MODULES_ALSO.get(layer, ()):
                    problems.append(f"{path.relative_to(ROOT)} imports {name}")
            elif top not in sys.stdlib_module_names and top != "__future__" and top not in THIRD_PARTY[layer]:
                problems.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not problems, problems


PACKAGE = ROOT / "lightning_mpi_env"
MAX_MODULES_PER_FOLDER = 16
MAX_MODULE_LINES = 400


def test_every_folder_of_the_package_is_a_layer_in_the_table():
    folders = {path.parent.relative_to(PACKAGE).parts[0] for path in PACKAGE.glob("*/*.py")}
    assert folders == set(LAYERS), folders ^ set(LAYERS)


def test_no_folder_of_the_package_holds_more_than_16_modules():
    counts = Counter(path.parent for path in PACKAGE.rglob("*.py") if path.name != "__init__.py")
    assert counts, "no module found"
    over = {str(folder.relative_to(ROOT)): count for folder, count in counts.items() if count > MAX_MODULES_PER_FOLDER}
    assert not over, over


def test_no_module_is_over_400_lines():
    lines = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    assert max(lines.values()) > MAX_MODULE_LINES / 4  # the count reads real modules
    over = {path: count for path, count in lines.items() if count > MAX_MODULE_LINES}
    assert not over, over


def _module_name(path: Path, base: Path) -> str:
    parts = path.relative_to(base).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, known: set[str]) -> set[str]:
    """The package's modules one module imports anywhere in it: at the top, in functions, and for type checking."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
                break
    return found


def import_circles(base: Path, package: Path) -> list[list[str]]:
    """Every import circle among the modules of ``package`` (named from ``base``): the import graph's strongly
    connected parts."""
    modules = {_module_name(path, base): path for path in package.rglob("*.py")}
    graph = {name: _imported_modules(path, set(modules)) - {name} for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(name: str) -> None:  # Tarjan's strongly connected components
        index[name] = low[name] = len(index)
        stack.append(name)
        for used in graph[name]:
            if used not in index:
                visit(used)
                low[name] = min(low[name], low[used])
            elif used in stack:
                low[name] = min(low[name], index[used])
        if low[name] == index[name]:
            part = []
            while not part or part[-1] != name:
                part.append(stack.pop())
            if len(part) > 1:
                circles.append(sorted(part))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return circles


def test_no_import_circle_in_the_package():
    assert not import_circles(ROOT, PACKAGE)


def test_the_circle_check_finds_a_circle(tmp_path):
    package = tmp_path / "lightning_mpi_env"
    (package / "core").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "core" / "__init__.py").write_text("")
    (package / "core" / "a.py").write_text("def f():\n    from lightning_mpi_env.core import b\n")
    (package / "core" / "b.py").write_text("from lightning_mpi_env.core.a import f\n")
    (package / "core" / "c.py").write_text("import lightning_mpi_env.core.a\n")
    assert import_circles(tmp_path, package) == [["lightning_mpi_env.core.a", "lightning_mpi_env.core.b"]]


FRAME_READERS = {
    "imports/sites.py": "to report which file imported a Lightning namespace",
    "rollcall/watchdog.py": "to report where a stalled rank's main thread is (main_thread_place)",
}
"""The only modules that may read stack frames, and why: both only report; nothing decides what runs from them."""


def test_only_the_reporters_read_stack_frames_and_no_module_defines_class():
    # Issue 14: no control flow from stack frames, no `__class__` tricks (docs/architecture.md says the same).
    frame_apis = re.compile(r"_getframe|currentframe|inspect\.stack|f_back|f_locals|_current_frames")
    package = ROOT / "lightning_mpi_env"
    readers = set()
    for path in sorted(package.rglob("*.py")):
        code = path.read_text()
        relative = path.relative_to(package).as_posix()
        if frame_apis.search(code.replace("walk ``sys._getframe()``", "")):  # hooks.py's docstring names sites.py's
            readers.add(relative)
        assert not re.search(r"def __class__|__class__\s*=", code), relative
    assert readers == set(FRAME_READERS)


def _code_strings(path: Path) -> list[tuple[int, str]]:
    # Every string constant of the code, docstrings (and the doctests in them) left out: they show the user's view.
    import ast

    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for statement in body:
                if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
                    docstrings.add(id(statement.value))  # module, class, function and attribute docstrings
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_torch_and_lightning_variable_names_have_one_home():
    # Issue 23, item 7: RANK, MASTER_ADDR, ... are spelled in core/torch_names.py only; everything else uses TORCH.
    from lightning_mpi_env.core.torch_names import TORCH

    home = ROOT / "lightning_mpi_env" / "core" / "torch_names.py"
    names = set(TORCH)
    assert {"RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"} <= names
    spelled = [
        f"{path.relative_to(ROOT)}:{line}: {value!r}"
        for path in sorted((ROOT / "lightning_mpi_env").rglob("*.py"))
        if path != home
        for line, value in _code_strings(path)
        if value in names
    ]
    assert not spelled, spelled
