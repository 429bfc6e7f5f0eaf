"""``doctor``'s checkpoint folder findings: the node check's probe over real folders, graded by who writes."""

from lightning_mpi_env.checks.findings import FOLDER_HINT
from lightning_mpi_env.tools.doctor import Level, diagnose

RANK = {
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "MASTER_ADDR": "nodea",
    "MASTER_PORT": "29611",
}


def _folders(rank, folders):
    env = {**RANK, "OMPI_COMM_WORLD_RANK": str(rank)}
    probes = {"module_available": lambda name: False, "loaded_modules": (), "gpu_count": lambda: None}
    found = diagnose(env, **probes, resolve=lambda host: "10.0.0.1", bind=lambda address, port: None, folders=folders)
    return [finding for finding in found if finding.topic == "checkpoint folder"]


def test_a_writable_folder_is_ok(tmp_path):
    (finding,) = _folders(0, [str(tmp_path / "runs")])
    assert finding.level is Level.OK
    assert finding.message.startswith(f"{str(tmp_path / 'runs')!r} is writable (")


def test_a_folder_this_host_cannot_write_is_an_error_where_rank_0_runs_and_a_warning_elsewhere():
    for rank, level in ((0, Level.ERROR), (2, Level.WARN)):
        (finding,) = _folders(rank, ["/proc/self/runs"])
        assert finding.level is level
        assert finding.message.startswith("'/proc/self/runs' (not made yet; its folder '/proc/self') cannot be written")
        assert finding.fix == FOLDER_HINT


def test_by_default_the_working_folder_is_checked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (finding,) = _folders(0, None)
    assert finding.message.startswith(f"{str(tmp_path)!r} is writable")
