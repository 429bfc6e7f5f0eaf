"""The node check after the roll call: each node's folders and GPUs, and one all-reduce with a known answer.

Every rank runs its own checks (the lowest rank of each node probes the folders for its node), then every rank
contributes to one all-reduce of ``2 x world size`` integers: ``rank + 1`` at its own place in the first half (the
known answer), and the bits of what it found at its own place in the second half. That one collective both tests the
path between every pair of neighbours and tells every rank who found what; it waits at most :data:`TIMEOUT`. A rank
that found something leaves the details in the roll call's store before it, under its own key, and only the ranks
that must say something read them back (at most :data:`~lightning_mpi_env.checks.findings.MAX_NAMED`). When nothing
is found, the check is the collective and nothing else: no store request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from lightning_mpi_env.checks.device import TorchDevices, device_fault, torch_devices
from lightning_mpi_env.checks.findings import (
    ALL_REDUCE_HINT,
    MAX_NAMED,
    Finding,
    Kind,
    Writers,
    flags,
    from_wire,
    must_stop,
    to_wire,
)
from lightning_mpi_env.checks.folder import MIN_FREE_BYTES, FolderFault, check_folder, is_local
from lightning_mpi_env.core.errors import NodeCheckError
from lightning_mpi_env.core.state_files import FieldError
from lightning_mpi_env.gpu.devices import DeviceChoice

TIMEOUT = 60.0
"""Seconds a rank waits for the check's all-reduce, and then for the findings it reads back."""

KEY_PREFIX = "lightning_mpi_env/node_check/"
"""Where a rank leaves its findings in the roll call's store (beside the roll call's own keys)."""

POLL_CAP = 0.01
"""The longest pause between two looks at a CUDA all-reduce (from 0.1 ms, doubling)."""


def finding_key(rank: int) -> str:
    """The key under which ``rank`` leaves its findings."""
    return f"{KEY_PREFIX}{rank}"


@dataclass(frozen=True)
class Place:
    """Where this rank runs, as the roll call found it."""

    rank: int
    world_size: int
    host: str
    node: int
    leads_node: bool
    """Whether it is the lowest rank of its node: the one that probes the node's folders."""


@dataclass(frozen=True)
class Outcome:
    """What the check found on every rank, as far as this rank needs to know."""

    stop: bool
    """Whether every rank stops before the first step (the same answer on every rank)."""
    findings: tuple[Finding, ...] = ()
    """The findings read back (rank 0's, or every rank's where the job stops); ``()`` where nothing was found."""
    unnamed: int = 0
    """Ranks that found something and are not read back (past ``MAX_NAMED``)."""


def local_findings(
    place: Place,
    folders: Sequence[str],
    choice: DeviceChoice | None,
    *,
    min_free: int = MIN_FREE_BYTES,
    seen: Callable[[int], TorchDevices] = torch_devices,
) -> list[Finding]:
    """This rank's own findings: the folders where it leads its node, the GPU where the launch gave it one."""
    found = []
    if place.leads_node:
        for folder in dict.fromkeys(folder for folder in folders if is_local(folder)):
            checked = check_folder(folder, min_free=min_free)
            if checked.fault is not None:
                kind = Kind.SPACE if checked.fault is FolderFault.LOW_SPACE else Kind.FOLDER
                found.append(Finding(place.rank, place.host, place.node, kind, checked.sentence(), checked.folder))
    if choice is not None and choice.index is not None:
        fault = device_fault(choice, seen(choice.index))
        if fault is not None:
            found.append(Finding(place.rank, place.host, place.node, Kind.DEVICE, fault))
    return found


def run_node_check(
    store: Any,
    place: Place,
    found: Sequence[Finding],
    *,
    writers: Writers,
    device: Any = "cpu",
    reduce: Callable[[Any], Any] | None = None,
    timeout: float = TIMEOUT,
) -> Outcome:
    """Share what each rank found through one all-reduce with a known answer; read back what must be said.

    ``store`` is the roll call's client, ``reduce`` starts an all-reduce (sum) of a tensor in place and returns its
    work (``torch.distributed.all_reduce(tensor, async_op=True)`` by default). A :class:`NodeCheckError` where the
    all-reduce does not finish within ``timeout`` seconds on this rank, or a rank's findings cannot be read back.
    """
    import torch

    size = place.world_size
    if found:
        store.set(finding_key(place.rank), to_wire(found))  # before the collective: read only after it
    tensor = torch.zeros(2 * size, dtype=torch.int64)
    tensor[place.rank] = place.rank + 1
    tensor[size + place.rank] = flags(found)
    tensor = tensor.to(device)
    if reduce is None:
        import torch.distributed

        def reduce(tensor: Any) -> Any:
            return torch.distributed.all_reduce(tensor, async_op=True)

    _finish(reduce(tensor), tensor, place, timeout)
    summed = tensor.cpu()
    wrong = (summed[:size] != torch.arange(1, size + 1)).nonzero().flatten().tolist()
    if wrong:
        named = ", ".join(str(rank) for rank in wrong[:MAX_NAMED]) + (" ..." if len(wrong) > MAX_NAMED else "")
        clause = f"the check's all-reduce gave a wrong sum for the place of rank(s) {named} of {size}"
        return Outcome(True, (Finding(place.rank, place.host, place.node, Kind.ALL_REDUCE, clause),))
    kinds = summed[size:].tolist()
    flagged = [rank for rank, bits in enumerate(kinds) if bits]
    if not flagged:
        return Outcome(False)
    stop = any(must_stop(int(kinds[rank]), rank, writers) for rank in flagged)
    if not stop and place.rank != 0:
        return Outcome(False)  # rank 0 says it for the job
    read = flagged[:MAX_NAMED]
    return Outcome(stop, tuple(_read_back(store, read, size, timeout)), len(flagged) - len(read))


def _finish(work: Any, tensor: Any, place: Place, timeout: float) -> None:
    """Wait for the all-reduce at most ``timeout`` seconds; a :class:`NodeCheckError` naming this rank past that."""
    try:
        if getattr(tensor, "is_cuda", False):  # NCCL's wait() only orders streams: look at the work until done
            deadline, pause = time.monotonic() + timeout, 0.0001
            while not work.is_completed():
                if time.monotonic() > deadline:
                    raise TimeoutError
                time.sleep(pause)
                pause = min(pause * 2, POLL_CAP)
        else:
            work.wait(timedelta(seconds=timeout))
    except (RuntimeError, TimeoutError) as error:  # gloo: RuntimeError at its timeout, or a peer gone
        raise NodeCheckError(
            f"The node check's all-reduce did not finish within {timeout:g} s on rank {place.rank} (host "
            f"{place.host}, node {place.node}): a rank cannot reach the others over the backend's network "
            f"({str(error).splitlines()[0][:200] if str(error) else 'timed out'}).",
            ALL_REDUCE_HINT,
        ) from error


def _read_back(store: Any, ranks: Sequence[int], size: int, timeout: float) -> list[Finding]:
    keys = [finding_key(rank) for rank in ranks]
    try:
        store.wait(keys, timedelta(seconds=timeout))  # set before the all-reduce: there already
        values = [store.get(key) for key in keys]
    except RuntimeError as error:  # torch's store raises its timeouts and lost connections as RuntimeErrors
        raise NodeCheckError(
            f"The node check's findings of rank(s) {', '.join(map(str, ranks))} could not be read from the roll "
            f"call's store within {timeout:g} s ({str(error).splitlines()[0][:200] if str(error) else 'no answer'}).",
            "Rank 0's store stopped answering: see rank 0's own output for why it ended.",
        ) from error
    found: list[Finding] = []
    for rank, raw in zip(ranks, values, strict=True):
        try:
            found += from_wire(bytes(raw), rank, size)
        except FieldError as error:
            raise NodeCheckError(
                f"The node check's findings of rank {rank} under {finding_key(rank)} in the roll call's store cannot "
                f"be read: {error}.",
                "Another program writes into this job's store: give each job its own MASTER_PORT.",
            ) from error
    return found
