"""Which accelerator each rank drives: an index into its *own* visible set, not its local rank under GPU binding."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import overload

from lightning_mpi_env.core.errors import LayoutError, RendezvousError
from lightning_mpi_env.core.values import MAX_DIGITS, MAX_LOCAL_SIZE, SHOWN_CHARACTERS, is_count, shown

VISIBLE_DEVICE_VARIABLES: tuple[str, ...] = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
"""Variables that restrict which accelerators a process sees, in the order we consult them."""

BINDING_HINT = (
    "Give each rank on a node a device of its own: one rank per GPU (`srun --gpus-per-task=1`, "
    "`--gpu-bind=single:1`, `--ntasks-per-gpu=1`), or show every rank all of the node's GPUs and let each take the "
    "one at its local rank."
)


_UUID = re.compile(r"(GPU|MIG)-[0-9A-Za-z/-]{1,100}")
"""A device's UUID (``GPU-8c6f...``; a MIG instance's ``MIG-...``), or the start of one, as CUDA and ROCm take it."""


def visible_devices(env: Mapping[str, str]) -> tuple[str, list[str]] | None:
    """The variable restricting this process's accelerators and the devices it lists, or ``None`` if unset.

    Set but listing no device (:func:`listed_devices`: ``""``, ``-1``, ``NoDevFiles``) is an empty list: no GPU.
    """
    for variable in VISIBLE_DEVICE_VARIABLES:
        if variable in env:
            return variable, listed_devices(env[variable])
    return None


def listed_devices(value: str) -> list[str]:
    """The devices a ``*_VISIBLE_DEVICES`` value shows, read as CUDA reads ``CUDA_VISIBLE_DEVICES``.

    CUDA shows the devices listed before the first entry that names none (CUDA C Programming Guide, "CUDA
    Environment Variables"): an entry is an index in plain digits or a UUID (``GPU-...``, ``MIG-...``). So an empty
    value, ``-1`` (the usual way to hide every GPU) and ``NoDevFiles`` (Grid Engine's value where a job has no GPU)
    show none, never device 0. Blank entries are skipped; past :data:`~.core.values.MAX_LOCAL_SIZE` entries, none is
    read.

    >>> listed_devices("2, 3"), listed_devices("-1"), listed_devices("NoDevFiles"), listed_devices("0,-1,1")
    (['2', '3'], [], [], ['0'])
    """
    devices = []
    for entry in value.split(",", MAX_LOCAL_SIZE)[:MAX_LOCAL_SIZE]:
        device = entry.strip()
        if not device:
            continue
        if not ((is_count(device) and len(device) <= MAX_DIGITS) or _UUID.fullmatch(device)):
            break
        devices.append(device)
    return devices


class PhysicalDevices(Sequence[str]):
    """The physical device indices a process sees when no variable lists them: a sequence, free however large."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...

    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        if isinstance(index, slice):
            return tuple(str(number) for number in range(self.size)[index])
        return str(range(self.size)[index])

    def __iter__(self) -> Iterator[str]:
        return (str(number) for number in range(self.size))

    def __contains__(self, device: object) -> bool:
        return isinstance(device, str) and device.isascii() and device.isdigit() and int(device) < self.size

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PhysicalDevices) and other.size == self.size

    def __hash__(self) -> int:
        return hash((PhysicalDevices, self.size))

    def __repr__(self) -> str:
        return f"PhysicalDevices({self.size})"


class DeviceBasis(str, Enum):
    """Why a rank drives the device it drives."""

    ONLY_DEVICE = "the only device it sees"
    WHOLE_NODE = "its local rank: it sees all of the node's devices"
    SHARED_LIST = "its local rank: the list has room for every local rank (as torchrun and Lightning assume)"
    ROLL_CALL = "its place among the ranks of its host that see the same devices (roll call)"
    UNKNOWN = "not known from its own variables: the ranks of its host see different subsets"
    NONE = "none: it sees no device"


EXACT_BASES = frozenset({DeviceBasis.ONLY_DEVICE, DeviceBasis.WHOLE_NODE, DeviceBasis.ROLL_CALL})


@dataclass(frozen=True)
class DeviceChoice:
    """The device one rank drives, as an index into its own visible set, and why."""

    index: int | None
    """Index into :attr:`visible`; ``None`` when not known (:attr:`basis` says why)."""
    basis: DeviceBasis
    visible: Sequence[str]
    """The identifiers this process sees; :class:`PhysicalDevices` when no variable is set."""
    variable: str = ""

    @property
    def exact(self) -> bool:
        """Whether the launcher's variables (or the roll call) prove the index."""
        return self.basis in EXACT_BASES

    @property
    def device_id(self) -> str:
        """The identifier of the chosen device (``"3"``), or ``""``."""
        return self.visible[self.index] if self.index is not None and self.index < len(self.visible) else ""

    def seen(self) -> str:
        """``"CUDA_VISIBLE_DEVICES='2,3'"`` or ``"4 device(s), no CUDA_VISIBLE_DEVICES"``, for messages."""
        if self.variable:
            return f"{self.variable}={shown(','.join(self.visible))}"
        return f"{len(self.visible)} device(s), no {VISIBLE_DEVICE_VARIABLES[0]}"


def own_device(
    found: tuple[str, Sequence[str]] | None,
    *,
    local_rank: int,
    local_size: int,
    node_devices: int | None = None,
    shared: bool = False,
) -> DeviceChoice:
    """The device a rank drives, from its own variables alone.

    One visible device is index 0; the whole node (``node_devices`` long, or ``shared``), or (not exact) a list with
    room for every local rank, is taken at the local rank, as torchrun and Lightning do. Anything else is not known.
    """
    visible: Sequence[str]
    if found is None:
        count = node_devices if node_devices is not None else max(local_size, local_rank + 1)
        visible, variable = PhysicalDevices(count), ""
    else:
        variable, visible = found[0], tuple(found[1])
    if not visible:
        return DeviceChoice(None, DeviceBasis.NONE, visible, variable)
    if len(visible) == 1:
        return DeviceChoice(0, DeviceBasis.ONLY_DEVICE, visible, variable)
    if found is None or shared or len(visible) == node_devices:
        basis = DeviceBasis.WHOLE_NODE
    elif len(visible) >= local_size:
        basis = DeviceBasis.SHARED_LIST
    else:
        return DeviceChoice(None, DeviceBasis.UNKNOWN, visible, variable)
    if local_rank >= len(visible):
        return DeviceChoice(None, DeviceBasis.UNKNOWN, visible, variable)
    return DeviceChoice(local_rank, basis, visible, variable)


def unknown_device(
    choice: DeviceChoice, *, local_rank: int, local_size: int, launcher: str, roll_call: bool | None = None
) -> LayoutError:
    """The error for a rank whose device its own variables do not give (``roll_call=None``: none runs here)."""
    listed = ",".join(choice.visible)
    if roll_call is False:
        remedy = "Turn the roll call back on (unset LIGHTNING_MPI_ENV_ROLL_CALL): it finds each rank's device exactly."
    elif roll_call is None:
        remedy = (
            'Pass the device index yourself, or use Lightning\'s `strategy="ddp_mpi"`, whose roll call finds each '
            "rank's device exactly."
        )
    else:
        remedy = "Let the launcher start one process per rank, so the roll call can find each rank's device."
    return LayoutError(
        f"{choice.variable or 'the device list'}={shown(listed)} lists {len(choice.visible)} devices, but this process "
        f"has local rank {local_rank} of {local_size} ({launcher}), so which of them is its own cannot be known "
        "from its own variables (the launcher binds a subset of the node's GPUs to each task, or the node has fewer "
        "GPUs than ranks).",
        f"{remedy} Or show every local rank all of the node's devices, or exactly one each (`srun --gpus-per-task=1`).",
        variable=choice.variable or None,
        value=listed[:SHOWN_CHARACTERS],
        launcher=launcher,
    )


@dataclass(frozen=True)
class DeviceView:
    """What one rank told the roll call about its devices."""

    rank: int
    host: str
    local_rank: int
    visible: tuple[str, ...]
    variable: str = ""
    chosen: int | None = None
    """The index it already drives (set up before the roll call), or ``None``."""


def assign_devices(views: Sequence[DeviceView]) -> dict[int, int | None]:
    """Each rank's device index within its own visible set, from every rank's view.

    Per host, ranks that chose first, then the most bound, then by local rank, each take the first device of its set
    that no rank of the host holds (none seen: ``None``); a :class:`RendezvousError` where two would share one.
    """
    assigned: dict[int, int | None] = {}
    by_host: dict[str, list[DeviceView]] = {}
    for view in views:
        by_host.setdefault(view.host, []).append(view)
    for host_views in by_host.values():
        holders: dict[str, DeviceView] = {}
        order = sorted(host_views, key=lambda view: (view.chosen is None, len(view.visible), view.local_rank))
        for view in order:
            if not view.visible:
                assigned[view.rank] = None
                continue
            if view.chosen is not None:
                index = view.chosen
            else:
                free = [index for index, device in enumerate(view.visible) if device not in holders]
                index = free[0] if free else view.local_rank % len(view.visible)
            device = view.visible[index] if index < len(view.visible) else str(index)
            holder = holders.setdefault(device, view)
            if holder is not view:
                raise shared_device(holder, view, device)
            assigned[view.rank] = index
    return dict(sorted(assigned.items()))


def shared_device(first: DeviceView, second: DeviceView, device: str) -> RendezvousError:
    """The error for two ranks on one host that would drive one device."""
    variable = second.variable or first.variable or VISIBLE_DEVICE_VARIABLES[0]

    def seen(view: DeviceView) -> str:
        listed = ",".join(view.visible)
        return (
            f"{view.variable}={shown(listed)}" if view.variable else f"all {len(view.visible)} devices (no {variable})"
        )

    return RendezvousError(
        f"Ranks {first.rank} and {second.rank} on host {second.host} would both drive device {shown(device)}: rank "
        f"{first.rank} (local rank {first.local_rank}) sees {seen(first)}, rank {second.rank} (local rank "
        f"{second.local_rank}) sees {seen(second)}, and no other device is free for either. Two processes on one "
        "GPU run out of memory or deadlock in NCCL.",
        f"{BINDING_HINT} `--gpu-bind=single:<n>` with n > 1 puts n tasks on each GPU.",
        variable=variable,
        value=device[:SHOWN_CHARACTERS],
    )


def lost_peer_links(views: Sequence[DeviceView]) -> list[str]:
    """One line per host whose ranks see disjoint device sets, so NCCL cannot use CUDA peer-to-peer between them."""
    notes = []
    by_host: dict[str, dict[tuple[str, ...], list[int]]] = {}
    for view in views:
        if view.visible:
            by_host.setdefault(view.host, {}).setdefault(tuple(sorted(view.visible)), []).append(view.rank)
    for host, groups in by_host.items():
        sets = list(groups)
        apart = [
            (a, b) for i, a in enumerate(sets) for b in sets[i + 1 :] if not set(a) & set(b)
        ]  # disjoint: neither sees the other's GPUs
        if apart:
            first, second = apart[0]
            notes.append(
                f"ranks {_ranks(groups[first])} and {_ranks(groups[second])} on host {host} see disjoint GPUs "
                f"({','.join(first)} and {','.join(second)}): per-task binding hides each rank's GPU from the "
                "others, so NCCL cannot use CUDA peer-to-peer (NVLink, PCIe) between them. If the node's GPUs are "
                "linked, show every rank all of them (`srun --gpu-bind=none`); each rank still drives its own."
            )
    return notes


def _ranks(ranks: Sequence[int]) -> str:
    return ",".join(str(rank) for rank in sorted(ranks))


def seen_devices(env: Mapping[str, str], device_count: int) -> tuple[str, tuple[str, ...]]:
    """The variable listing this process's accelerators and the ids it sees (none set: ``""``, every device).

    >>> seen_devices({}, 2)
    ('', ('0', '1'))
    """
    found = visible_devices(env)
    if found is not None:
        return found[0], tuple(found[1])
    return "", tuple(str(index) for index in range(device_count))
