"""The examples run: on the simulated cluster where they can, and through `simulate`/`from_env` for schedulers
that are absent here (PBS, LSF, Slurm), with the variables those schedulers set. The training scripts checkpoint on
the scheduler's warning signal and resume from it when started again, in one process here and on simulated nodes."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_mpi_env import from_env
from lightning_mpi_env.core.placement import Placement
from lightning_mpi_env.core.schedulers import SCHEDULERS_BY_KEY
from lightning_mpi_env.tools.simcluster import RSH_AGENT, SimulatedCluster
from lightning_mpi_env.tools.simulate import simulate
from tests.conftest import python_path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
MPI_TIMEOUT = 180
SLURM_TIMEOUT = 300  # two runs of a job on two (maybe busy) cores, and the requeue between them
JOB_SCRIPTS = sorted(path for path in (EXAMPLES / "jobs").iterdir()) + [EXAMPLES / "torchrun_per_node.sh"]


def _results(stdout):
    return [json.loads(line[len("RESULT ") :]) for line in stdout.splitlines() if line.startswith("RESULT ")]


@pytest.mark.parametrize("script", JOB_SCRIPTS, ids=lambda path: path.name)
def test_job_scripts_parse(script):
    subprocess.run(["sh", "-n", str(script)], check=True, timeout=60)


# --- the training scripts: the recommended line, checkpoint on the scheduler's signal, resume -----------------------


@pytest.mark.parametrize(
    ("example", "lines"),
    [
        ("train.py", ["from lightning_mpi_env.pytorch import MPIDDPStrategy", "strategy=MPIDDPStrategy()"]),
        (
            "fabric_train.py",
            ["from lightning_mpi_env.fabric import MPIDDPStrategy", "Fabric(strategy=MPIDDPStrategy()"],
        ),
    ],
)
def test_training_examples_use_the_recommended_line(example, lines):
    text = (EXAMPLES / example).read_text()
    assert [line for line in lines if line not in text] == []
    assert "MPIClusterEnvironment()" not in text  # the strategy brings it


@pytest.mark.parametrize("script", sorted((EXAMPLES / "jobs").iterdir()), ids=lambda path: path.name)
def test_every_job_script_runs_the_training_command(script):
    # One way to every script's training: `TRAIN`, the Trainer example by default, the Fabric one on request.
    text = script.read_text()
    assert 'TRAIN="${TRAIN:-python examples/train.py}"' in text
    assert 'TRAIN="python examples/fabric_train.py"' in text
    commands = [line for line in text.splitlines() if not line.startswith(("#", "TRAIN="))]
    assert any(re.match(r"\s*(srun )?\$TRAIN --devices", line) for line in commands), "the script runs $TRAIN"
    assert not any("examples/train.py" in line for line in commands), "nothing else names the example"


@pytest.mark.parametrize(
    ("script", "lines"),
    [
        ("sge_abci.sh", SCHEDULERS_BY_KEY["sge"].job_script.splitlines()),
        ("pbs.sh", SCHEDULERS_BY_KEY["pbs"].job_script.splitlines()),
        ("lsf.bsub", SCHEDULERS_BY_KEY["lsf"].job_script.splitlines()),
        ("slurm_srun.sbatch", SCHEDULERS_BY_KEY["slurm"].job_script.splitlines()),
        ("slurm_mpirun.sbatch", ["#SBATCH --signal=B:USR1@90", "#SBATCH --requeue"]),  # the row: to the batch script
    ],
    ids=["sge", "pbs", "lsf", "slurm-srun", "slurm-mpirun"],
)
def test_job_scripts_ask_their_scheduler_for_the_requeue(script, lines):
    # What the scheduler's row says a job script needs for checkpoint-and-requeue (the table in docs/preemption.md).
    text = (EXAMPLES / "jobs" / script).read_text().splitlines()
    assert lines
    assert [line for line in lines if line not in text] == []


# --- the demo: the README's line, from the package, titles that say what runs -------------------------------------

DEMO_JOB = ROOT / "lightning_mpi_env" / "demo_job.py"


def _code(path: Path) -> str:
    """A module's code without its docstrings (which may name what the code avoids)."""
    import ast

    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            body[0] = ast.Pass()
    return ast.unparse(tree)


def test_the_demo_trains_with_the_readme_line():
    readme = README.read_text()
    for line in ("from lightning_mpi_env.pytorch import MPIDDPStrategy", "Trainer(strategy=MPIDDPStrategy()"):
        assert line in readme
        assert line in DEMO_JOB.read_text()
    code = _code(DEMO_JOB)
    # Nothing the README's line leaves out: no devices, no num_nodes, no plugin, no top-level import of the package.
    for absent in (
        r"\bdevices=",
        r"\bnum_nodes=",
        r"\bplugins=",
        r"\bMPIClusterEnvironment\b",
        r"\bDDPStrategy\(",
        r"from lightning_mpi_env import",
    ):
        assert not re.search(absent, code), absent
    from lightning_mpi_env.tools import demo

    assert {step.command for step in demo.steps()[1:]} == {("-m", "lightning_mpi_env.demo_job")}
    assert demo.JOB == "lightning_mpi_env.demo_job"


def test_the_example_demo_calls_the_package_demo():
    # What an installed wheel runs (`lightning-mpi-env demo`) and what the README's `python examples/demo.py` runs
    # are one program: the example only calls it.
    code = _code(EXAMPLES / "demo.py")
    assert "from lightning_mpi_env.tools.demo import main" in code
    assert len(code.splitlines()) <= 8, code


def _canned(map_by: str, command) -> subprocess.CompletedProcess:
    """What the simulated cluster's 4 ranks print for a step: `show --json` lines, or the demo job's RESULT lines."""
    hosts = ["127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"] if map_by == "slot" else ["127.0.0.2", "127.0.0.3"] * 2
    lines = []
    for rank, host in enumerate(hosts):
        node = ["127.0.0.2", "127.0.0.3"].index(host)
        if "show" in command:
            source = "OMPI_COMM_WORLD_RANK // OMPI_COMM_WORLD_LOCAL_SIZE (assumed block placement)"
            row = {"global_rank": rank, "node_rank": node, "node_rank_exact": False, "local_rank": rank % 2}
            row |= {"host": host, "sources": {"node_rank": source}}
            lines.append(json.dumps(row))
        else:
            row = {"hostname": host, "global_rank": rank, "node_rank": node, "local_rank": rank // 2, "world_size": 4}
            row |= {"strategy": "MPIDDPStrategy", "seen": list(range(16 * rank, 16 * rank + 16)), "weights": [0.25]}
            lines.append("RESULT " + json.dumps(row))
    return subprocess.CompletedProcess(["mpirun"], 0, "Lightning says something\n" + "\n".join(lines) + "\n", "")


def test_each_demo_step_title_says_what_it_runs(capsys):
    from lightning_mpi_env.tools import demo

    ran = []

    def run(map_by, command):
        ran.append((map_by, tuple(command)))
        return _canned(map_by, command)

    assert demo.run_demo(run) == 0
    out = capsys.readouterr().out
    steps = demo.steps()
    assert ran == [(step.map_by, step.command) for step in steps]
    for number, step in enumerate(steps, start=1):
        title, first, second = out.split(f"\nStep {number} of {len(steps)}: ", 1)[1].splitlines()[:3]
        # The command printed is the one run, and the title names it.
        assert first.startswith("$ lightning-mpi-env simcluster --nodes 2 --per-node 2 ")
        assert f"--map-by {step.map_by} " in first
        assert second.strip() == "python " + " ".join(step.command)
        if step.command[-2:] == ("show", "--json"):
            assert "`show --json` on each rank, one table row per rank" in title
        else:
            assert "`Trainer(strategy=MPIDDPStrategy())`" in title
            assert f"(--map-by {step.map_by})" in title
    assert out.count("  ok: unique ranks, node ranks match the hosts, disjoint shards, identical weights") == 2
    assert max(map(len, out.splitlines())) <= 120


def test_the_demo_fails_on_a_wrong_rank_table(capsys):
    from lightning_mpi_env.tools import demo

    def run(map_by, command):
        completed = _canned(map_by, command)
        if "show" in command:
            return completed
        # Node ranks that disagree with the hosts, as under `--map-by node` with block arithmetic.
        lines = [line.replace('"127.0.0.2"', '"127.0.0.9"') for line in completed.stdout.splitlines()]
        return subprocess.CompletedProcess(completed.args, 0, "\n".join(lines), "")

    assert demo.run_demo(run) == 1
    out = capsys.readouterr().out
    assert out.count("Step ") == 2  # it stops at the first wrong table
    assert out.splitlines()[-1] == "  PROBLEMS: a node rank does not match its host"
    rows = demo._json_lines(_canned("slot", ("-m", demo.JOB)).stdout)
    assert demo.check(rows[:3]) == ["3 ranks reported, not 4"]
    assert demo.check([{**row, "seen": [0]} for row in rows]) == ["data shards overlap"]


def test_the_demo_names_what_is_missing_in_one_line(tmp_path):
    # A Python with no Open MPI beside it or on PATH, and no torch or Lightning (no site-packages): one line, the
    # extra to install, exit 127, no traceback.
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.symlink_to(os.path.realpath(sys.executable))
    env = {"PATH": str(python.parent), "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    result = subprocess.run(
        [python, "-S", "-m", "lightning_mpi_env.tools.demo"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (result.returncode, result.stdout) == (127, ""), result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("lightning-mpi-env demo: error: The demo needs Open MPI's mpirun, torch and Lightning: ")
    assert "No `mpirun` found" in line
    assert "torch and lightning cannot be imported" in line
    assert (
        'HINT: Install the demo extra into this Python\'s environment: `pip install "lightning-mpi-env[demo]"`' in line
    )


def test_the_demo_refuses_a_bad_timeout_in_one_line(capsys):
    from lightning_mpi_env.tools import demo

    assert demo.main(["--timeout", "nan"]) == 2
    err = capsys.readouterr().err
    assert "argument --timeout: 'nan' is not a number of seconds above 0" in err
    assert "Traceback" not in err


def _one_process_environment(job: str) -> dict[str, str]:
    """One process, no launcher, in Grid Engine job ``job``: its warning signal (SIGUSR2) checkpoints, then exit 99."""
    return {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),  # the suite's lean interpreter
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",  # each line as it is printed
        "JOB_ID": job,
    }


def _signalled_at(command, env, marker: str, timeout: float) -> tuple[int, str]:
    """Run ``command``; once a line of its output starts with ``marker``, send it SIGUSR2 as Grid Engine would.

    ``mpirun`` forwards the signal to every rank. The command runs in a session of its own, ended whole on a failure.
    """
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if line.startswith(marker):
                process.send_signal(signal.SIGUSR2)
                break
        output, _ = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode, "".join(lines) + output


def test_trainer_example_checkpoints_on_the_signal_and_resumes(tmp_path):
    # The Trainer example as a Grid Engine job in one process: the warning signal comes once it trains; every rank
    # saves the HPC checkpoint and exits 99 (Grid Engine reschedules the job); started again, it resumes there.
    env = _one_process_environment("4242")
    command = [sys.executable, str(EXAMPLES / "train.py"), "--root-dir", str(tmp_path)]
    returncode, output = _signalled_at([*command, "--epochs", "100000"], env, "training from global step 0", 120)
    assert returncode == 99, output[-3000:]
    saved = re.search(r"requeue: saved (\S+) at step (\d+) after SIGUSR2", output)
    assert saved, output[-3000:]
    path, step = saved.group(1), int(saved.group(2))
    assert (path, step > 0) == (str(tmp_path / "hpc_ckpt_1.ckpt"), True)
    epochs = step // 16 + 2  # 16 steps an epoch: the checkpoint's epoch and one more
    result = subprocess.run(
        [*command, "--epochs", str(epochs)], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"training from global step {step}\n" in result.stdout
    [row] = _results(result.stdout)
    assert (row["resumed_from"], row["first_global_step"], row["global_step"]) == (path, step, 16 * epochs)


def test_fabric_example_checkpoints_on_the_signal_and_resumes(tmp_path):
    # The Fabric loop, as above: it saves every 5 steps; the signal comes after the first save, and the loop saves
    # once more and exits 99; started again, it resumes from that newest save.
    env = _one_process_environment("4243")
    command = [sys.executable, str(EXAMPLES / "fabric_train.py"), "--root-dir", str(tmp_path), "--save-every", "5"]
    returncode, output = _signalled_at([*command, "--steps", "1000000000"], env, "saved ", 120)
    assert returncode == 99, output[-3000:]
    *_, newest = sorted(tmp_path.glob("step-*.ckpt"))
    step = int(newest.stem.split("-")[1])
    assert step >= 5
    assert f"saved {newest}\n" in output  # the requeue's save: the newest
    result = subprocess.run(
        [*command, "--steps", str(step + 10)], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming from {newest} at step {step}\n" in result.stdout
    [row] = _results(result.stdout)
    assert (row["resumed_from"], row["first_step"], row["step"]) == (str(newest), step, step + 10)


def _job_script_environment(**variables):
    """What a scheduler's job script would see, pointed at the simulated cluster's `mpirun`."""
    env = {
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "HOME": os.environ.get("HOME", "/tmp"),
        "PRTE_MCA_prte_ssh_agent": str(RSH_AGENT),  # `mpirun` reaches the simulated nodes through the agent
        "OMP_NUM_THREADS": "1",
        **variables,
    }
    if os.geteuid() == 0:
        env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    return env


@pytest.mark.mpi
def test_sge_abci_job_script_checkpoints_on_notify_and_resumes(tmp_path):
    # The job script runs unchanged on 2 simulated nodes x 2 ranks; SGE's host list and job id are the simulated
    # cluster's. -notify's SIGUSR2 goes to the job's process group: the script outlives it (its trap), mpirun passes
    # it on to every rank, they save the HPC checkpoint and exit 99, and so does the script: Grid Engine reschedules
    # the job. Started again, the job resumes from that checkpoint and finishes.
    cluster = SimulatedCluster(tmp_path)
    root = tmp_path / "root"
    script = str(EXAMPLES / "jobs" / "sge_abci.sh")

    def environment(epochs: int) -> dict[str, str]:
        train = f"python examples/train.py --root-dir {root} --epochs {epochs}"
        return _job_script_environment(**cluster.job_environment(), PER_NODE="2", TRAIN=train)

    log = tmp_path / "first.out"
    with log.open("w") as out:
        first = subprocess.Popen(
            ["sh", script],
            cwd=ROOT,
            env=environment(100000),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        # Lightning's checkpoint at the end of the first epoch: every rank trains (and has the requeue handler).
        while not list((root / "checkpoints").glob("*.ckpt")):
            assert first.poll() is None, log.read_text()[-3000:]
            time.sleep(0.1)
        os.killpg(first.pid, signal.SIGUSR2)
        first.wait(timeout=MPI_TIMEOUT)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    output = log.read_text()
    assert first.returncode == 99, output[-3000:]
    saved = re.search(r"requeue: saved (\S+) at step (\d+) after SIGUSR2", output)
    assert saved, output[-3000:]
    path, step = saved.group(1), int(saved.group(2))
    epochs = step // 4 + 2  # 4 steps an epoch on 4 ranks: the checkpoint's epoch and one more
    result = subprocess.run(
        ["sh", script],
        cwd=ROOT,
        env=environment(epochs),
        capture_output=True,
        text=True,
        timeout=MPI_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = sorted(_results(result.stdout), key=lambda row: row["global_rank"])
    assert [(r["global_rank"], r["node_rank"], r["local_rank"], r["world_size"]) for r in results] == [
        (0, 0, 0, 4),
        (1, 0, 1, 4),
        (2, 1, 0, 4),
        (3, 1, 1, 4),
    ]
    assert {(r["resumed_from"], r["first_global_step"], r["global_step"]) for r in results} == {
        (path, step, 4 * epochs)
    }
    assert len({r["weight_sum"] for r in results}) == 1  # DDP kept the replicas identical


@pytest.mark.mpi
def test_fabric_example_checkpoints_and_resumes_one_rank_per_node(tmp_path):
    # Two ranks on two simulated nodes under Grid Engine's variables: the signal to mpirun, which passes it on to
    # both ranks, after the loop's first save; both save once more and exit 99; started again, both resume there.
    cluster = SimulatedCluster(tmp_path)
    root = tmp_path / "root"
    command = [sys.executable, str(EXAMPLES / "fabric_train.py"), "--root-dir", str(root), "--save-every", "5"]
    export = {**cluster.job_environment(), "OMP_NUM_THREADS": "1"}
    argv = cluster.mpirun([*command, "--steps", "1000000000"], np=2, map_by="node", export=export)
    returncode, output = _signalled_at(argv, None, "saved ", MPI_TIMEOUT)
    assert returncode == 99, output[-3000:]
    *_, newest = sorted(root.glob("step-*.ckpt"))
    step = int(newest.stem.split("-")[1])
    result = cluster.run([*command, "--steps", str(step + 10)], timeout=MPI_TIMEOUT, np=2, map_by="node", export=export)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming from {newest} at step {step}\n" in result.stdout
    results = sorted(_results(result.stdout), key=lambda row: row["global_rank"])
    assert [(r["global_rank"], r["node_rank"], r["world_size"]) for r in results] == [(0, 0, 2), (1, 1, 2)]
    assert {(r["resumed_from"], r["first_step"], r["step"]) for r in results} == {(str(newest), step, step + 10)}
    assert len({r["weight_sum"] for r in results}) == 1  # DDP kept the replicas identical


RESTART_GATE = """if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then  # the test's hold on the restart, for its --steps
  echo "GATED job=$SLURM_JOB_ID"
  while [ ! -e "$STEPS" ]; do sleep 0.2; done
  TRAIN="$TRAIN --steps $(cat "$STEPS")"
fi
"""


@pytest.mark.mpi
@pytest.mark.slurm
def test_slurm_srun_job_script_runs_the_fabric_example_through_a_requeue(slurm_cluster, tmp_path):
    # TRAIN="python examples/fabric_train.py" in the srun job script on the two-node Slurm cluster, 1 rank a node:
    # --signal's SIGUSR1 to both ranks after the loop's first save; they save, rank 0 runs `scontrol requeue`, and
    # the restarted job resumes from that save. The restart waits for the test to give it an end (the newest save's
    # step + 10): the first run's --steps is never reached.
    root, steps = tmp_path / "root", tmp_path / "steps"
    text = (EXAMPLES / "jobs" / "slurm_srun.sbatch").read_text()
    text = "\n".join(line for line in text.splitlines() if "--gpus-per-node" not in line)  # no GPUs here
    text = text.replace("set -eu\n", "set -eu\n" + RESTART_GATE)
    train = [sys.executable, str(EXAMPLES / "fabric_train.py"), "--root-dir", str(root), "--save-every", "5"]
    env = {"TRAIN": " ".join([*train, "--steps", "1000000000"]), "STEPS": str(steps), "OMP_NUM_THREADS": "1"}
    job = slurm_cluster.sbatch(text, ["--nodes=2", "--ntasks-per-node=1"], env=env)
    slurm_cluster.wait_output(job, "saved ", timeout=SLURM_TIMEOUT)  # both ranks asked after each step since
    signalled = slurm_cluster.signal(job, "USR1")
    assert signalled.returncode == 0, signalled.stderr
    slurm_cluster.wait_output(job, f"GATED job={job}", timeout=SLURM_TIMEOUT)
    *_, newest = sorted(root.glob("step-*.ckpt"))
    step = int(newest.stem.split("-")[1])
    (tmp_path / "steps.tmp").write_text(str(step + 10))
    os.replace(tmp_path / "steps.tmp", steps)  # whole, for the gate
    state = slurm_cluster.wait(job, timeout=SLURM_TIMEOUT)
    output = slurm_cluster.output(job)
    assert state == "COMPLETED", output[-4000:]
    [info] = slurm_cluster.job_info(job)
    assert info["Restarts"] == "1", output[-4000:]
    assert f"the job goes back in the queue: `scontrol requeue {job}`" in output
    assert f"resuming from {newest} at step {step}\n" in output
    results = sorted(_results(output), key=lambda row: row["global_rank"])
    assert [(r["global_rank"], r["node_rank"], r["world_size"], r["hostname"]) for r in results] == [
        (0, 0, 2, "node1"),
        (1, 1, 2, "node2"),
    ]
    assert {(r["resumed_from"], r["first_step"], r["step"]) for r in results} == {(str(newest), step, step + 10)}
    assert len({r["weight_sum"] for r in results}) == 1


def test_jax_example_without_jax_prints_its_arguments():
    env = {
        "PATH": os.environ["PATH"],
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "PMIX_NAMESPACE": "prterun-nodea-1@1",
        "SLURM_JOB_NODELIST": "gpu[12-13]",
    }
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "jax_distributed.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    if "JAX is not installed" in result.stdout:
        kwargs = json.loads(result.stdout.split("would get: ", 1)[1])
        assert kwargs["coordinator_address"].startswith("gpu12:")
        assert (kwargs["num_processes"], kwargs["process_id"], kwargs["local_device_ids"]) == (4, 3, [1])


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("map_by", "hosts"), [("slot", [0, 0, 1, 1]), ("node", [0, 1, 0, 1])], ids=["block", "round-robin"]
)
def test_jax_example_sums_across_two_simulated_nodes(tmp_path, jax_python, map_by, hosts):
    # JAX for real (jax from PyPI, CPU): 4 processes on 2 simulated nodes, each initialized from
    # jax_distributed_kwargs() alone, meet at the coordinator and add 1 + 2 + 3 + 4 across processes. JAX's own
    # detection cannot: Open MPI 5 sets no OMPI_MCA_orte_hnp_uri (jax/_src/clusters/ompi_cluster.py).
    cluster = SimulatedCluster(tmp_path)
    result = cluster.run(
        [str(jax_python), str(EXAMPLES / "jax_distributed.py")],
        timeout=MPI_TIMEOUT,
        map_by=map_by,
        export={**cluster.job_environment(), "PYTHONPATH": python_path(ROOT), "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("process "))
    assert lines == [
        f"process {rank}/4 on {cluster.hosts[hosts[rank]]}: 1 local device(s), 4 in all; sum over processes 10"
        for rank in range(4)
    ], result.stdout + result.stderr[-3000:]


# --- schedulers absent here: their variables, resolved by the plugin's code ----------------------------------------


@pytest.mark.parametrize(
    ("scheduler", "script"), [("pbs", "pbs.sh"), ("lsf", "lsf.bsub"), ("slurm", "slurm_mpirun.sbatch")]
)
def test_scheduler_job_scripts_rank_math(scheduler, script):
    assert (EXAMPLES / "jobs" / script).exists()
    for map_by in ("slot", "node"):
        result = simulate("openmpi", nodes=2, ppn=4, map_by=map_by, scheduler=scheduler)
        assert result.ok, result.problems
        assert {row.layout.main_address for row in result.ranks} == {"node001"}


def test_pbs_nodefile_one_line_per_slot(tmp_path):
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x1001c0s0b0n0\n" * 4 + "x1001c0s0b1n0\n" * 4)
    env = {
        "OMPI_COMM_WORLD_RANK": "6",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "2",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        "PBS_NODEFILE": str(nodefile),
        "PBS_JOBID": "4242.pbs01",
    }
    layout = from_env(env)
    assert (layout.node_rank, layout.main_address, layout.sources["main_address"]) == (
        1,
        "x1001c0s0b0n0",
        "PBS_NODEFILE (first host)",
    )


def test_slurm_mpirun_inside_sbatch_ignores_the_batch_step():
    # Ranks started by Open MPI inside sbatch inherit the batch script's and the daemon step's SLURM_* variables.
    env = {
        "SLURM_JOB_ID": "777",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    }
    layout = from_env(env)
    assert (layout.launcher.key, layout.rank, layout.node_rank, layout.main_address) == ("openmpi", 5, 1, "gpu07")
    assert layout.placement is Placement.BLOCK


def test_lsf_hosts():
    env = {
        "PMI_RANK": "0",
        "PMI_SIZE": "8",
        "MPI_LOCALRANKID": "0",
        "MPI_LOCALNRANKS": "4",
        "LSB_MCPU_HOSTS": "batch1 4 batch2 4",
        "LSB_JOBID": "31",
    }
    assert from_env(env).main_address == "batch1"
