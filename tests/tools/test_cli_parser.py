"""``tools/cli_parser.py``: the parser alone, each argument check at its bounds (test_cli.py: end to end)."""

import pytest

from lightning_mpi_env.tools.cli_parser import PROG, build_parser


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # 19 digits: past as_count's 18, so never an int of any size (and the value is shown cut, not whole).
        (["simulate", "--nodes", "1" * 19, "--ppn", "2"], "argument --nodes: must be a positive integer"),
        (["torchrun-args", "--nproc-per-node", "-3"], "argument --nproc-per-node: must be a positive integer"),
        (["simcluster", "--timeout", "inf", "--", "true"], "--timeout: must be a positive number of seconds"),
        (["simcluster", "-x", "1A=2", "--", "true"], "argument -x/--export: must be NAME=VALUE, got '1A=2'"),
    ],
)
def test_each_argument_check_refuses_its_bad_values(argv, message, capsys):
    err = _refused(argv, capsys)
    assert err.startswith(f"usage: {PROG} ")
    assert message in err


def test_values_in_bounds_are_parsed_to_their_types():
    args = build_parser().parse_args(["simcluster", "--nodes", "3", "-x", "A=1=2", "--timeout", "2.5", "--", "true"])
    assert (args.command, args.nodes, args.export, args.timeout, args.cmd) == (
        "simcluster",
        3,
        [("A", "1=2")],
        2.5,
        ["--", "true"],
    )
    assert build_parser().parse_args(["torchrun-args", "--nproc-per-node", "gpu"]).nproc_per_node == "gpu"
    assert build_parser().parse_args(["simulate", "--nodes", "2", "--ppn", "4"]).strategy == "ddp_mpi"
