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


@pytest.mark.parametrize("command", ["simulate", "simcluster"])
def test_per_node_is_one_name_in_both_commands(command, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    out = capsys.readouterr().out
    assert "--per-node P" in out
    assert "slots (ranks) per node" in out
    assert "--ppn" not in out  # the old name of simulate's, still taken, is not shown
    base = ["--nodes", "2"] + (["--", "true"] if command == "simcluster" else [])
    for name in ("--per-node", "--ppn"):
        args = build_parser().parse_args([command, *base[:2], name, "3", *base[2:]])
        assert args.per_node == 3


def test_run_says_each_option_s_value_the_same_in_usage_and_option_list(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    usage, _, options = capsys.readouterr().out.partition("options:")
    for option in ("--restarts N", "--backoff S", "--probe-timeout S", "--grace S", "--min-nodes K", "--state-dir D"):
        assert option in " ".join(usage.split())
        assert option in options
    assert "RESTARTS" not in options


def test_nproc_per_node_says_what_it_accepts(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["torchrun-args", "--nproc-per-node", "four"])
    assert "or one of gpu, cpu, auto; got 'four'" in capsys.readouterr().err
    for word in ("gpu", "cpu", "auto"):
        assert build_parser().parse_args(["torchrun-args", "--nproc-per-node", word]).nproc_per_node == word
