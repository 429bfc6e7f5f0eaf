"""What the ``lightning-mpi-env`` commands print: text for people, one JSON object on one line for programs."""

from __future__ import annotations

import json
from collections.abc import Mapping

from lightning_mpi_env.core.errors import Explained
from lightning_mpi_env.core.rank_layout import RankLayout

APPROXIMATE = (
    "~ = approximate: assumed from where the launcher usually places ranks, which its variables do not prove; "
    "the roll call of MPIDDPStrategy/MPIClusterEnvironment finds the true value from every rank's host name."
)
"""What ``~`` after a value means, said wherever one is shown."""


def one_line_json(data: Mapping[str, object]) -> str:
    """``data`` as one line of JSON: under ``mpirun`` every rank writes one object to the shared output."""
    return json.dumps(data, separators=(", ", ": "), default=str)


def explained(item: Explained) -> dict[str, object]:
    """An error or a warning as data: its class, the problem, the fix, and the variable, value and launcher."""
    return {
        "kind": type(item).__name__,
        "problem": item.problem,
        "hint": item.hint,
        "variable": item.variable,
        "value": item.value,
        "launcher": item.launcher,
    }


def error_object(item: Explained) -> dict[str, object]:
    """The JSON object of a command that failed with ``item``."""
    return {"ok": False, "error": explained(item)}


def mark(value: object, exact: bool) -> str:
    """A value as text, with ``~`` when it is approximate; ``?`` when unknown.

    >>> mark(2, True), mark(2, False), mark(None, False)
    ('2', '2~', '?')
    """
    if value is None:
        return "?"
    return f"{value}{'' if exact else '~'}"


SHOWN_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ranks", ("rank", "world_size", "local_rank", "local_size")),
    ("nodes", ("node_rank", "num_nodes")),
    ("rendezvous", ("main_address", "main_port")),
)
"""The layout's fields under their headings, as ``show`` prints them."""


def layout_object(layout: RankLayout) -> dict[str, object]:
    """``show --json``: the layout, the Trainer arguments, whether the node rank and count are exact, the warnings."""
    return {
        "ok": True,
        **layout.as_dict(),
        "node_rank_exact": layout.node_rank_is_exact,
        "num_nodes_exact": layout.num_nodes_is_exact,
        "warnings": [explained(warning) for warning in layout.warnings],
    }


def layout_lines(layout: RankLayout, host: str) -> list[str]:
    """``show`` as text: a heading per topic, then ``name=value (source)``, one a line; ``~`` explained."""
    exact = {"node_rank": layout.node_rank_is_exact, "num_nodes": layout.num_nodes_is_exact}
    lines = [f"launch: {layout.launcher_name}, {layout.placement.value}, on host {host}"]
    for heading, names in SHOWN_GROUPS:
        lines.append(f"{heading}:")
        lines.extend(
            f"  {name}={mark(getattr(layout, name), exact.get(name, True))} ({layout.sources.get(name, '?')})"
            for name in names
        )
    lines += ["trainer:", f"  {layout.trainer_kwargs()}"]
    if not all(exact.values()):
        lines.append(APPROXIMATE)
    return lines


def layout_summary(layout: RankLayout) -> str:
    """The layout in one line for ``doctor``: its ``repr``, and what ``~`` means when it shows one."""
    text = repr(layout)
    return f"{text}; {APPROXIMATE}" if "~" in text else text
