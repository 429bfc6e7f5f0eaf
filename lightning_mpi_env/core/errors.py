"""Errors and warnings as data (problem, hint, variable, value, launcher): rendered once, here, never parsed back."""

from __future__ import annotations

from typing import Any


def escaped(text: str, *, lines: bool = False) -> str:
    r"""``text`` as one line (``lines``: its ``\n`` kept), with every other character that is not printable escaped.

    A line break echoed from a variable would forge a line of the output, a carriage return or a terminal escape
    overwrite one: a ``\n`` becomes a blank (kept where ``lines``: a message written in several lines on purpose), and
    any other character that is not printable is written as Python writes it in a string (``\r``, ``\x1b``).

    >>> escaped("ib0\nHINT: fine\r\x1b[2K")
    'ib0 HINT: fine\\r\\x1b[2K'
    """
    if text.isprintable():
        return text
    return "".join(
        character
        if character.isprintable()
        else ("\n" if lines else " ")
        if character == "\n"
        else repr(character)[1:-1]
        for character in text
    )


class Explained(Exception):
    """The data behind an error or a warning (``problem``: what is wrong; ``hint``: the fix), and its rendering.

    Problem and hint are kept with every character that is not printable escaped (:func:`escaped`), so a name or value
    echoed into them cannot forge another line wherever they are shown: ``str()``, :meth:`one_line`, ``doctor``.
    """

    separator = "\n"
    """What stands between the problem and ``HINT:`` in ``str()``: errors take a line of their own for the hint."""

    multiline = False
    """Whether the problem is written in several lines on purpose (its ``\n`` kept); else it is one line."""

    def __init__(
        self,
        problem: str,
        hint: str,
        *,
        variable: str | None = None,
        value: str | None = None,
        launcher: str | None = None,
    ) -> None:
        problem, hint = escaped(problem, lines=self.multiline), escaped(hint)
        super().__init__(problem, hint)
        self.problem = problem
        self.hint = hint
        self.variable = variable
        self.value = value
        self.launcher = launcher

    def __str__(self) -> str:
        return f"{self.problem}{self.separator}HINT: {self.hint}"

    def one_line(self) -> str:
        """The problem and the hint on one line, as the command line and the roll call print them.

        >>> LayoutError("PMI_RANK='x' is not an integer.", "Launch with mpiexec.").one_line()
        "PMI_RANK='x' is not an integer. HINT: Launch with mpiexec."
        """
        return f"{' '.join(self.problem.split())} HINT: {' '.join(self.hint.split())}"

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep the fields across pickling (spawned workers, multiprocessing queues).
        fields = {"variable": self.variable, "value": self.value, "launcher": self.launcher}
        return (_rebuild, (type(self), self.problem, self.hint, fields))


def _rebuild(cls: type[Explained], problem: str, hint: str, fields: dict[str, str | None]) -> Explained:
    return cls(problem, hint, **fields)


class MpiEnvError(Explained):
    """Base of every error this package raises: catch it to catch them all."""


class LayoutError(MpiEnvError, ValueError):
    """The job cannot start as launched: a malformed, missing, contradictory or stale variable or setting."""


class SettingError(LayoutError):
    """A setting of this package (an argument or a ``LIGHTNING_MPI_ENV_*`` variable) has a value it cannot use."""


class RendezvousError(LayoutError):
    """The processes of one job do not add up in the roll call: duplicate, missing or disagreeing ranks."""


class StallError(MpiEnvError, RuntimeError):
    """A rank stopped making progress while the others wait for it (the stall watchdog)."""


class RecoveryError(MpiEnvError, RuntimeError):
    """The ranks left after a lost rank cannot go on in their processes (``restartable``): the job is to start again."""


class NodeCheckError(MpiEnvError, RuntimeError):
    """A node cannot do its part, found before the first step (a folder it must write, the all-reduce, its GPU)."""


class MixedImportError(MpiEnvError, TypeError):
    """Objects from both Lightning namespaces meet, or the namespaces cannot be unified."""

    multiline = True  # one line per object


class StrategyImportError(MpiEnvError, ImportError):
    """``lightning_mpi_env.MPIDDPStrategy`` asked for while no, or both, Lightning namespaces are imported."""


class FailureRecordError(MpiEnvError, ValueError):
    """A failure record in the state folder that is not a regular file, is too long, or is malformed."""


class ProgressRecordError(MpiEnvError, ValueError):
    """A progress record (``first-step.json``) that is not a regular file, is too long, or is malformed."""


class MpirunLineError(MpiEnvError, ValueError):
    """``lightning-mpi-env run --``'s command: an option, host list or host file it cannot read, or too few hosts."""


class LayoutWarning(Explained, UserWarning):
    """Something about the layout the user should hear about that does not stop the job."""

    separator = " "  # a warning is printed as one line: "file:line: Category: message"


class ApproximateNodeRankWarning(LayoutWarning):
    """The node rank is a guess: the launcher exports no node index and the placement fits no known rule."""


class DeviceIndexWarning(LayoutWarning):
    """``LOCAL_RANK`` is not this rank's device index: the launcher bound a subset of the node's GPUs to it."""


class DeviceIdWarning(LayoutWarning):
    """torch 2.15's ``nccl2`` will bind another GPU than the rank's: ``init_process_group`` gets no ``device_id``."""


class NodeCheckWarning(LayoutWarning):
    """A node cannot write the checkpoint folder where none of its ranks writes: the run goes on, a relaunch may not."""


class FabricWarning(LayoutWarning):
    """``LIGHTNING_MPI_ENV_IFNAME`` names the fabric, but the main host resolves to another network on rank 0's node."""


class MixedImportWarning(Explained, UserWarning):
    """Both Lightning namespaces are imported in one process (the problem names the importer of each)."""

    multiline = True  # one line per namespace


class AddressError(LayoutError):
    """A main address (``MASTER_ADDR``, or a host list's first host) that is not a host name or an IP address."""


class JobIdError(LayoutError):
    """A scheduler's job variable (job id, array task, restart count) is not in that scheduler's own syntax."""


class CheckpointError(MpiEnvError, ValueError):
    """A requeued job would resume from a checkpoint that is not its own, or its requeue record cannot be read."""


class CheckpointWarning(Explained, UserWarning):
    """A requeue checkpoint was skipped (empty, unreadable, or not matching its record); an older one is used."""

    separator = " "
