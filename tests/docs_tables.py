"""The docs' tables, rendered from the rows of lightning_mpi_env.core.launchers and .schedulers.

`tests/test_docs.py` checks that the docs hold exactly these tables; after changing a row, rewrite them with
`.venv/bin/python -m tests.docs_tables`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from lightning_mpi_env.core.launchers import LAUNCHERS, Launcher
from lightning_mpi_env.core.schedulers import SCHEDULERS

ROOT = Path(__file__).resolve().parents[1]
NOT_RUN = "documented variables, not run here"


def _code(names: object) -> str:
    if isinstance(names, str):
        return f"`{names}`"
    return ", ".join(f"`{name}`" for name in names) if names else "—"  # type: ignore[union-attr]


def _local_size(row: Launcher) -> str:
    if row.local_size is not None:
        return _code(row.local_size)
    if row.tasks_per_node is not None:
        return f"{_code(row.tasks_per_node)} (`4(x2),3`)"
    return f"{_code(row.world_size)} / {_code(row.num_nodes)} (even jobs only)"


def launcher_table() -> str:
    """One line per launcher row, in precedence order."""
    lines = [
        "| Launcher (first match wins) | Identified by | Rank, size, local rank, local size | Node rank | "
        "Port from | Own host list | Run for real here |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in LAUNCHERS:
        sizes = f"{_code(row.rank)}, {_code(row.world_size)}, {_code(row.local_rank)}, {_local_size(row)}"
        node = (
            _code(row.node_rank)
            if row.node_rank
            else "assumed block or round-robin (approximate), exact after the roll call"
        )
        hosts = ", ".join(
            f"`{source.variable}`" + (f" ({source.note})" if source.note else "") for source in row.host_lists
        )
        identity = "+".join(f"`{name}`" for name in row.job_identity) or "the scheduler's job id"
        lines.append(
            f"| {row.name} | `{row.marker}` | {sizes} | {node} | {identity} | {hosts or '—'} | "
            f"{row.run_for_real or NOT_RUN} |"
        )
    return "\n".join(lines)


def check_table() -> str:
    """How to tell which launcher started a process."""
    lines = ["| Launcher | How to check |", "|---|---|"]
    lines += [f"| {row.name} | {row.how_to_check} |" for row in LAUNCHERS]
    return "\n".join(lines)


def scheduler_table() -> str:
    """One line per scheduler row, in the order consulted."""
    lines = [
        "| Scheduler | Job id (port) | Host lists, first host runs rank 0 | Run for real here |",
        "|---|---|---|---|",
    ]
    for row in SCHEDULERS:
        hosts = ", ".join(
            f"`{source.variable}` ({source.form.value}{f', {source.note}' if source.note else ''})"
            for source in row.host_lists
        )
        job = _code(row.job_id) + (f" (+ {_code(row.array_task)} in an array)" if row.array_task else "")
        lines.append(f"| {row.name} | {job} | {hosts or 'none exported'} | {row.run_for_real or NOT_RUN} |")
    return "\n".join(lines)


def requeue_table() -> str:
    """How each scheduler warns a job and takes it back."""
    lines = [
        "| Scheduler | In the job script | Signal (default `requeue_signal`) | When | Requeue | Exit status |",
        "|---|---|---|---|---|---|",
    ]
    for row in SCHEDULERS:
        if not row.requeue_command and not row.requeue_exit_code:
            lines.append(f"| {row.name} | — | — | — | none: submit the job again yourself | — |")
            continue
        script = "<br>".join(f"`{line}`" for line in row.job_script.splitlines())
        command = f"`{' '.join(row.requeue_command)}`" if row.requeue_command else "by the exit status"
        if row.requeue_job:
            command += f", `{{job}}` = {' or '.join(f'`{template}`' for template in row.requeue_job)}"
        signal = f"`{row.warning_signal.name}`"
        cells = (row.name, script, signal, row.warning, command, str(row.requeue_exit_code))
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)


TABLES: dict[str, tuple[str, Callable[[], str]]] = {
    "launchers": ("docs/launchers.md", launcher_table),
    "launcher-checks": ("docs/launchers.md", check_table),
    "schedulers": ("docs/launchers.md", scheduler_table),
    "requeue": ("docs/preemption.md", requeue_table),
}
"""Marker name -> (file, renderer): the docs hold each table between `<!-- NAME:begin -->` and `<!-- NAME:end -->`."""


def block(name: str) -> re.Pattern[str]:
    """The marked block of one table in its file."""
    return re.compile(rf"(<!-- {name}:begin -->\n)(.*?)(<!-- {name}:end -->)", re.DOTALL)


def rewrite() -> None:
    """Rewrite every table in the docs from the rows."""
    for name, (file, render) in TABLES.items():
        path = ROOT / file
        text = path.read_text()
        path.write_text(block(name).sub(lambda match, r=render: match.group(1) + r() + "\n" + match.group(3), text))


if __name__ == "__main__":
    rewrite()
