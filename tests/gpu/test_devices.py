"""Which device each rank drives under each launcher's documented GPU binding.

Sources of the bindings below:
- Slurm `srun(1)`, https://slurm.schedmd.com/srun.html: `--gpus-per-task` "will implicitly set
  --tres-bind=gres/gpu:per_task:<gpus_per_task>"; `--gpu-bind=closest` binds "each task to the gres(s) which are
  closest. In a NUMA environment, each task may be bound to more than one gres (i.e. all gres in that NUMA
  environment)"; `single:<tasks_per_gres>` is "a block distribution of tasks onto available gres", the first
  <tasks_per_gres> tasks on the first GPU; with ConstrainDevices the IDs are "zero-based indexes relative to the gres
  allocated to the job". Slurm's GRES guide, https://slurm.schedmd.com/gres.html#GPU_Management: Slurm sets
  `CUDA_VISIBLE_DEVICES` per step, e.g. `JobStep=1234.1 CUDA_VISIBLE_DEVICES=2`.
- Flux's shell gpu-affinity plugin (flux-framework/flux-core#2406, #5356): `-o gpu-affinity=on` (the default) gives
  every task all of the node's allocated GPUs in `CUDA_VISIBLE_DEVICES`, `per-task` divides them among the tasks,
  `map:LIST` sets them per task.
- Cray PALS on ALCF Polaris (https://docs.alcf.anl.gov/polaris/running-jobs/): `mpiexec ...
  set_affinity_gpu_polaris.sh`, a wrapper that exports
  `CUDA_VISIBLE_DEVICES=$((num_gpus - 1 - PMI_LOCAL_RANK % num_gpus))`: one GPU per rank, in
  reverse order; with more ranks than GPUs the modulo gives two ranks one GPU.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_mpi_env.core.errors import LayoutError, RendezvousError
from lightning_mpi_env.gpu.devices import (
    VISIBLE_DEVICE_VARIABLES,
    DeviceBasis,
    DeviceChoice,
    DeviceView,
    PhysicalDevices,
    assign_devices,
    lost_peer_links,
    own_device,
    seen_devices,
    unknown_device,
    visible_devices,
)

CUDA = "CUDA_VISIBLE_DEVICES"


def _views(lists, host="a", variable=CUDA):
    """One view per local rank on one host; ``None`` in ``lists`` means the variable is unset (4 GPUs)."""
    return [
        DeviceView(
            rank,
            host,
            rank,
            tuple(("0", "1", "2", "3") if listed is None else listed.split(",")),
            "" if listed is None else variable,
        )
        for rank, listed in enumerate(lists)
    ]


# --- each launcher's binding --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("binding", "lists", "expected"),
    [
        # srun --gpus-per-task=1 (per_task:1): one GPU each, by the global ID
        ("srun --gpus-per-task=1", ["0", "1", "2", "3"], [0, 0, 0, 0]),
        # the same under ConstrainDevices: IDs relative to the job's GPUs, still one each
        ("srun --gpus-per-task=1, job holds GPUs 4-7", ["0", "1", "2", "3"], [0, 0, 0, 0]),
        # srun --gpu-bind=closest, 2 sockets x 2 GPUs, block distribution: ranks 0-1 on socket 0
        ("srun --gpu-bind=closest (block)", ["0,1", "0,1", "2,3", "2,3"], [0, 1, 0, 1]),
        # --distribution=cyclic over the sockets: local ranks 0 and 2 on socket 0
        ("srun --gpu-bind=closest (cyclic)", ["0,1", "2,3", "0,1", "2,3"], [0, 0, 1, 1]),
        # srun --gpu-bind=single:1: like closest, one GPU per task
        ("srun --gpu-bind=single:1", ["0", "1", "2", "3"], [0, 0, 0, 0]),
        # srun --gpus-per-task=2 with 2 ranks: each drives the first of its pair
        ("srun --gpus-per-task=2", ["0,1", "2,3"], [0, 0]),
        # no binding (srun --gpus-per-node=4, flux -o gpu-affinity=on): every task sees the whole list
        ("flux run -o gpu-affinity=on", ["0,1,2,3"] * 4, [0, 1, 2, 3]),
        # flux run -o gpu-affinity=per-task, 4 GPUs over 2 tasks
        ("flux run -o gpu-affinity=per-task", ["0,1", "2,3"], [0, 0]),
        # Polaris' PALS wrapper: GPU 3 - local rank, one each
        ("mpiexec set_affinity_gpu_polaris.sh", ["3", "2", "1", "0"], [0, 0, 0, 0]),
        # nothing set: every rank sees all four, local rank i drives the i-th
        ("no variable", [None, None, None, None], [0, 1, 2, 3]),
    ],
)
def test_each_binding_gives_each_rank_its_own_device(binding, lists, expected):
    views = _views(lists)
    indices = assign_devices(views)
    assert [indices[view.rank] for view in views] == expected, binding
    devices = [view.visible[indices[view.rank]] for view in views]
    assert len(set(devices)) == len(devices), f"{binding}: two ranks on one device"


def test_single_two_tasks_per_gpu_is_refused_naming_both_ranks():
    # srun --gpu-bind=single:2: "the first <tasks_per_gres> tasks are bound to the first gres"
    with pytest.raises(RendezvousError) as caught:
        assign_devices(_views(["0", "0", "1", "1"], host="gpu07"))
    error = caught.value
    assert "Ranks 0 and 1 on host gpu07 would both drive device '0'" in error.problem
    assert "CUDA_VISIBLE_DEVICES='0'" in error.problem
    assert "--gpus-per-task=1" in error.hint
    assert "single:<n>" in error.hint
    assert (error.variable, error.value) == (CUDA, "0")


def test_polaris_wrapper_with_more_ranks_than_gpus_is_refused():
    # 5 ranks on 4 GPUs: 4 - 1 - (4 % 4) = 3 gives local rank 4 the GPU of local rank 0
    with pytest.raises(RendezvousError, match=r"Ranks 0 and 4 on host a would both drive device '3'"):
        assign_devices(_views(["3", "2", "1", "0", "3"]))


def test_more_ranks_than_a_shared_list_is_refused():
    with pytest.raises(RendezvousError, match=r"Ranks 0 and 2 on host a would both drive device '0'"):
        assign_devices(_views(["0,1", "0,1", "0,1"]))


def test_ranks_listing_one_set_in_different_orders_get_different_devices():
    views = _views(["0,1", "1,0"])
    indices = assign_devices(views)
    assert {views[0].visible[indices[0]], views[1].visible[indices[1]]} == {"0", "1"}


def test_a_device_already_set_up_is_kept_and_others_avoid_it():
    views = [DeviceView(0, "a", 0, ("0", "1"), CUDA, chosen=1), DeviceView(1, "a", 1, ("0", "1"), CUDA)]
    assert assign_devices(views) == {0: 1, 1: 0}


def test_two_ranks_that_set_up_one_device_are_refused():
    views = [DeviceView(0, "a", 0, ("0", "1"), "", chosen=0), DeviceView(1, "a", 1, ("0", "1"), "", chosen=0)]
    with pytest.raises(RendezvousError, match=r"both drive device '0'.* sees all 2 devices"):
        assign_devices(views)


def test_hosts_are_separate():
    views = _views(["0", "1"], host="a") + [
        DeviceView(rank + 2, "b", view.local_rank, view.visible, CUDA) for rank, view in enumerate(_views(["0", "1"]))
    ]
    assert assign_devices(views) == {0: 0, 1: 0, 2: 0, 3: 0}


def test_a_rank_that_sees_no_device_gets_none():
    assert assign_devices([DeviceView(0, "a", 0, (), CUDA)]) == {0: None}


# --- peer-to-peer -------------------------------------------------------------------------------------------------


def test_disjoint_sets_on_one_host_cost_peer_links():
    (note,) = lost_peer_links(_views(["0,1", "0,1", "2,3", "2,3"], host="gpu07"))
    assert "ranks 0,1 and 2,3 on host gpu07 see disjoint GPUs" in note
    assert "--gpu-bind=none" in note


@pytest.mark.parametrize("lists", [["0,1,2,3"] * 4, [None] * 4, ["0"]])
def test_shared_or_single_sets_cost_nothing(lists):
    assert lost_peer_links(_views(lists)) == []


# --- one rank alone -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "local_rank", "node_devices", "index", "basis"),
    [
        ({CUDA: "3"}, 2, None, 0, DeviceBasis.ONLY_DEVICE),
        ({}, 2, 4, 2, DeviceBasis.WHOLE_NODE),
        ({}, 2, None, 2, DeviceBasis.WHOLE_NODE),
        ({CUDA: "0,1,2,3"}, 2, 4, 2, DeviceBasis.WHOLE_NODE),
        ({CUDA: "0,1,2,3"}, 2, 8, 2, DeviceBasis.SHARED_LIST),  # 4 of 8: the others may see other lists
        ({CUDA: "2,3"}, 2, 4, None, DeviceBasis.UNKNOWN),  # --gpu-bind=closest: which of the two is not known
        ({CUDA: "2,3"}, 0, 4, None, DeviceBasis.UNKNOWN),
        ({CUDA: ""}, 2, 4, None, DeviceBasis.NONE),
        ({"ROCR_VISIBLE_DEVICES": "5"}, 1, None, 0, DeviceBasis.ONLY_DEVICE),
    ],
)
def test_own_device(env, local_rank, node_devices, index, basis):
    choice = own_device(visible_devices(env), local_rank=local_rank, local_size=4, node_devices=node_devices)
    assert (choice.index, choice.basis) == (index, basis)
    assert choice.exact == (basis in {DeviceBasis.ONLY_DEVICE, DeviceBasis.WHOLE_NODE})


def test_workers_started_by_lightning_share_one_list():
    choice = own_device(visible_devices({CUDA: "4,5"}), local_rank=1, local_size=1, shared=True)
    assert (choice.index, choice.device_id, choice.exact) == (1, "5", True)


def test_unknown_device_error_names_variable_value_rank_and_fix():
    choice = own_device(visible_devices({CUDA: "2,3"}), local_rank=3, local_size=4)
    error = unknown_device(choice, local_rank=3, local_size=4, launcher="Slurm", roll_call=None)
    assert isinstance(error, LayoutError)
    assert "CUDA_VISIBLE_DEVICES='2,3' lists 2 devices, but this process has local rank 3 of 4 (Slurm)" in error.problem
    assert 'strategy="ddp_mpi"' in error.hint
    off = unknown_device(choice, local_rank=3, local_size=4, launcher="Slurm", roll_call=False)
    assert "LIGHTNING_MPI_ENV_ROLL_CALL" in off.hint


def test_choice_describes_what_it_sees():
    assert DeviceChoice(0, DeviceBasis.ONLY_DEVICE, ("3",), CUDA).seen() == "CUDA_VISIBLE_DEVICES='3'"
    assert DeviceChoice(1, DeviceBasis.WHOLE_NODE, ("0", "1")).seen() == "2 device(s), no CUDA_VISIBLE_DEVICES"


# --- properties ---------------------------------------------------------------------------------------------------


@st.composite
def _bindings(draw):
    """A node of GPUs bound to its ranks as a launcher does: none, per task, per socket (block or cyclic)."""
    gpus = draw(st.integers(1, 8))
    mode = draw(st.sampled_from(["none", "per_task", "closest", "closest_cyclic", "list"]))
    if mode == "none":
        ranks = draw(st.integers(1, gpus))
        return gpus, [None] * ranks
    if mode == "list":  # one list for every task, the job's share of the node
        share = draw(st.integers(1, gpus))
        ranks = draw(st.integers(1, share))
        return gpus, [",".join(str(gpu) for gpu in range(share))] * ranks
    if mode == "per_task":
        per_task = draw(st.integers(1, gpus))
        ranks = gpus // per_task
        return gpus, [",".join(str(g) for g in range(r * per_task, (r + 1) * per_task)) for r in range(ranks)]
    sockets = draw(st.sampled_from([s for s in (1, 2, 4) if gpus % s == 0]))
    per_socket = gpus // sockets
    ranks_per_socket = draw(st.integers(1, per_socket))
    socket_list = [",".join(str(g) for g in range(s * per_socket, (s + 1) * per_socket)) for s in range(sockets)]
    if mode == "closest":
        return gpus, [socket_list[r // ranks_per_socket] for r in range(sockets * ranks_per_socket)]
    return gpus, [socket_list[r % sockets] for r in range(sockets * ranks_per_socket)]


@settings(deadline=None)
@given(_bindings())
def test_every_documented_binding_gives_each_rank_a_device_of_its_own(binding):
    gpus, lists = binding
    views = [
        DeviceView(
            rank,
            "a",
            rank,
            tuple(listed.split(",")) if listed else tuple(map(str, range(gpus))),
            CUDA if listed else "",
        )
        for rank, listed in enumerate(lists)
    ]
    indices = assign_devices(views)
    devices = [view.visible[indices[view.rank]] for view in views]
    assert len(set(devices)) == len(views)


@settings(deadline=None)
@given(_bindings())
def test_an_index_called_exact_is_the_roll_calls(binding):
    # The exactness rule: what one rank decides alone and calls exact is what the roll call finds.
    gpus, lists = binding
    views, own = [], []
    for rank, listed in enumerate(lists):
        env = {} if listed is None else {CUDA: listed}
        choice = own_device(visible_devices(env), local_rank=rank, local_size=len(lists), node_devices=gpus)
        own.append(choice)
        views.append(DeviceView(rank, "a", rank, choice.visible, choice.variable))
    found = assign_devices(views)
    for rank, choice in enumerate(own):
        if choice.exact:
            assert choice.index == found[rank]


# --- no list in proportion to a number someone typed ------------------------------------------------------------------


def test_a_huge_local_size_makes_no_device_list():
    # Before, 10**17 physical indices were listed (a MemoryError after 8 s and 2 GB).
    choice = own_device(None, local_rank=5, local_size=10**17)
    assert (choice.index, choice.basis, choice.device_id) == (5, DeviceBasis.WHOLE_NODE, "5")
    assert isinstance(choice.visible, PhysicalDevices)
    assert len(choice.visible) == 10**17
    assert choice.seen() == "100000000000000000 device(s), no CUDA_VISIBLE_DEVICES"


def test_physical_devices_read_like_the_list_they_stand_for():
    assert list(PhysicalDevices(3)) == ["0", "1", "2"] == list(PhysicalDevices(3)[:])
    assert "2" in PhysicalDevices(3)
    assert "3" not in PhysicalDevices(3)
    assert PhysicalDevices(3)[-1] == "2"
    with pytest.raises(IndexError):
        PhysicalDevices(3)[3]


# --- a variable that shows no GPU -----------------------------------------------------------------------------------

NO_DEVICE = ["-1", "NoDevFiles", "none", "all", "0x1", "1.5", "\u0663", "GPU", "gpu-1", "-0", "+1", "1 2", "\x1b[2K"]
"""Entries that name no device: CUDA shows the devices before the first of them (``-1``: the usual way to hide every
GPU; ``NoDevFiles``: Grid Engine's value, ABCI's too, where a job has no GPU)."""


@pytest.mark.parametrize("variable", VISIBLE_DEVICE_VARIABLES)
@pytest.mark.parametrize("value", ["", " ", ",", *NO_DEVICE, "-1,0,1", "NoDevFiles,0"])
def test_a_variable_that_shows_no_gpu_is_read_as_none_never_device_0(variable, value):
    found = visible_devices({variable: value})
    assert found == (variable, [])
    choice = own_device(found, local_rank=0, local_size=1, node_devices=4)
    assert (choice.index, choice.basis, choice.device_id) == (None, DeviceBasis.NONE, "")
    assert seen_devices({variable: value}, 4) == (variable, ())  # what the roll call's claim lists


@given(
    variable=st.sampled_from(VISIBLE_DEVICE_VARIABLES),
    listed=st.lists(
        st.one_of(st.integers(0, 15).map(str), st.sampled_from(["GPU-8c6f1d2e", "MIG-GPU-8c6f1d2e/1/0"])), max_size=4
    ),
    hidden=st.sampled_from(NO_DEVICE),
    rest=st.text(max_size=20),
)
def test_devices_are_read_up_to_the_first_entry_that_names_none(variable, listed, hidden, rest):
    assert visible_devices({variable: ",".join(listed)}) == (variable, listed)
    assert visible_devices({variable: ",".join([*listed, hidden, rest])}) == (variable, listed)


def test_a_long_device_list_is_cut_in_the_error():
    listed = ",".join(str(index) for index in range(5000))
    choice = own_device(visible_devices({CUDA: listed}), local_rank=6000, local_size=6001)
    error = unknown_device(choice, local_rank=6000, local_size=6001, launcher="Slurm")
    assert "CUDA_VISIBLE_DEVICES='0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16'... (23889 characters) lists 5000" in (
        error.problem
    )
    assert len(error.problem) < 800
