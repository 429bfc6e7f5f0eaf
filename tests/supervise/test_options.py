"""One grammar for every launcher line: each family's row decides arities, one-letter options and syntax."""

from __future__ import annotations

import pytest

from lightning_mpi_env.core.errors import MpirunLineError
from lightning_mpi_env.supervise.mpirun_options import MPICH_LINE, OPEN_MPI_LINE
from lightning_mpi_env.supervise.options import Grammar, Problem, parse_options
from lightning_mpi_env.supervise.srun_line import SRUN_LINE, SrunLineError


@pytest.mark.parametrize(
    ("grammar", "line", "options", "program"),
    [
        (SRUN_LINE, "srun -lN2 --exclud=n1 -- a", [("nodes", ("2",)), ("exclude", ("n1",))], 4),
        (
            OPEN_MPI_LINE,
            "mpirun -np 2 --mca a b --map-by x a",
            [("np", ("2",)), ("mca", ("a", "b")), ("mapby", ("x",))],
            8,
        ),
        (MPICH_LINE, "mpiexec --NP=2 -genv A 1 -unknown=3 a", [("np", ("2",)), ("genv", ("A", "1"))], 6),
    ],
)
def test_each_row_reads_its_own_syntax(grammar: Grammar, line: str, options: list[object], program: int):
    read, start = parse_options(line.split(), grammar)
    assert [(option.name, option.values) for option in read] == options
    assert start == program


@pytest.mark.parametrize(("grammar", "error"), [(SRUN_LINE, SrunLineError), (OPEN_MPI_LINE, MpirunLineError)])
def test_every_row_words_every_problem_it_can_meet(grammar: Grammar, error: type[Exception]):
    assert grammar.error is error
    assert {Problem.NO_PROGRAM, Problem.SEVERAL, Problem.UNKNOWN, Problem.AMBIGUOUS, Problem.NEEDS} <= set(
        grammar.texts
    )
    with pytest.raises(error, match="names no program"):
        parse_options([grammar.name.split()[0]], grammar)
