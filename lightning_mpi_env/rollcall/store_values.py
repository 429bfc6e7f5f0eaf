"""Every value read back from the roll call's store, parsed in one place.

torch's ``TCPStore`` has no authentication: anyone who reaches the main port can write any key. Each reader checks
the size, the JSON, and every field's type and range, and gives a typed record or one ``RendezvousError`` naming
the key, the fault and the fix (``docs/roll-call.md``, "Trust").
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from lightning_mpi_env.core.errors import RendezvousError
from lightning_mpi_env.core.network import Interface, Resolution
from lightning_mpi_env.rollcall.claims import OWN_FIELDS, SHARED_FIELDS, Claim, NodeAssignment, digest
from lightning_mpi_env.rollcall.network_view import NetworkView

MAX_VALUE_BYTES = 1 << 20
"""The largest stored value read."""
MAX_TEXT = 16384
MAX_ITEMS = 65536
MAX_COUNT = (1 << 63) - 1
MAX_RANKS = 1 << 24
"""The largest world size believed."""
MAX_WORK = 86400.0  # the most seconds of work a step believed
PHASE_COUNT = 7
"""Phases a watchdog report may name (:data:`lightning_mpi_env.rollcall.stall.PHASES`)."""

TRUST_HINT = (
    "Something other than this job's ranks wrote to its rendezvous store, or a rank runs another version of "
    "lightning-mpi-env. torch's TCPStore has no authentication: keep MASTER_ADDR:MASTER_PORT on a trusted network "
    "(not reachable from outside the cluster), give every job a port of its own, and run one version on every rank."
)

_T = TypeVar("_T")


class Malformed(ValueError):
    """What is wrong with one stored value (turned into a :class:`RendezvousError` naming the key)."""


def read(key: str, raw: bytes | str, parser: Callable[[object], _T]) -> _T:
    """``parser``'s record of the JSON value under ``key``; a :class:`RendezvousError` naming the key if malformed."""
    return read_raw(key, raw, lambda text: parser(_json(text)))


def malformed(key: str, raw: bytes | str, reason: str) -> RendezvousError:
    """The error for a malformed value under ``key``."""
    shown = raw[:80]
    text = shown.decode("utf-8", "replace") if isinstance(shown, bytes) else shown
    more = "..." if len(raw) > 80 else ""
    return RendezvousError(
        f"The rendezvous store holds a malformed value under {key!r}: {reason}; the value starts {text!r}{more}.",
        TRUST_HINT,
        variable=key,
        value=text + more,
    )


def _no_constant(name: str) -> object:
    raise Malformed(f"{name} is not a number")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)  # json.loads(text, parse_constant=...) makes one a call


def _object(data: object, what: str) -> dict[str, object]:
    if not isinstance(data, dict):
        raise Malformed(f"{what} is {type(data).__name__}, not an object")
    return data


def _integer(value: object, name: str, low: int = 0, high: int = MAX_COUNT) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Malformed(f"{name} is {_kind(value)}, not an integer")
    if not low <= value <= high:
        raise Malformed(f"{name}={value} is outside {low}..{high}")
    return value


def _optional_integer(value: object, name: str, low: int = 0, high: int = MAX_COUNT) -> int | None:
    return None if value is None else _integer(value, name, low, high)


def _text(value: object, name: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str):
        raise Malformed(f"{name} is {_kind(value)}, not a string")
    if len(value) > limit:
        raise Malformed(f"{name} is {len(value)} characters long (at most {limit})")
    return value


def _flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise Malformed(f"{name} is {_kind(value)}, not true or false")
    return value


def _texts(value: object, name: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise Malformed(f"{name} is {_kind(value)}, not a list")
    if len(value) > MAX_ITEMS:
        raise Malformed(f"{name} has {len(value)} items (at most {MAX_ITEMS})")
    return tuple(_text(item, f"{name}[{index}]") for index, item in enumerate(value))


def _finite(value: object, name: str, low: float = -math.inf, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise Malformed(f"{name} is {_kind(value)}, not a finite number")
    if not low <= value <= high:
        raise Malformed(f"{name}={value} is outside {low:g}..{high:g}")
    return float(value)


def _kind(value: object) -> str:
    return repr(value)[:40] if isinstance(value, (int, float, bool)) or value is None else type(value).__name__


def _known_fields(data: Mapping[str, object], allowed: Sequence[str], required: Sequence[str], what: str) -> None:
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise Malformed(f"{what} has unknown field(s) {', '.join(map(repr, unknown[:5]))}")
    missing = [name for name in required if name not in data]
    if missing:
        raise Malformed(f"{what} lacks {', '.join(missing)}")


_CLAIM_FIELDS = tuple(Claim.__dataclass_fields__)
_CLAIM_REQUIRED = ("rank", "world_size", "host", "local_rank", "pid", "main_address", "main_port")
_OWN_DEFAULTS = {name: Claim.__dataclass_fields__[name].default for name in OWN_FIELDS if name not in _CLAIM_REQUIRED}


def claim_of(rank: int | None) -> Callable[[object], Claim]:
    """A parser of the claim stored for ``rank`` (a claim of another rank under its key is forged; ``None``: any)."""

    def parse(data: object) -> Claim:
        fields = _object(data, "the claim")
        _known_fields(fields, _CLAIM_FIELDS, _CLAIM_REQUIRED, "the claim")
        return _own_fields(
            [fields.get(name, _OWN_DEFAULTS.get(name)) for name in OWN_FIELDS], rank, _shared_fields(fields)
        )

    return parse


def wire_claim(
    rank: int, reference: Claim | None = None, differing: list[int] | None = None
) -> Callable[[bytes | str], Claim]:
    """A parser of the claim ``rank`` sent (:meth:`Claim.to_wire`); use with :func:`read_raw`.

    When its digest of the shared fields is ``reference``'s, only its own fields are parsed, and the shared ones are
    ``reference``'s: rank 0 reads thousands of claims. Else ``rank`` is added to ``differing``, and every field is
    parsed. A value that is one JSON object holds every field.
    """
    shared_digest = None if reference is None else digest(reference.shared_json())
    shared_values = {} if reference is None else {name: getattr(reference, name) for name in SHARED_FIELDS}

    def parse(raw: bytes | str) -> Claim:
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        own_text, _, shared_text = text.partition("\n")
        own = _json(own_text)
        if isinstance(own, list):
            if len(own) != len(OWN_FIELDS) + 1:
                raise Malformed(f"the claim has {len(own)} items, not {len(OWN_FIELDS) + 1}")
            if reference is not None and own[-1] == shared_digest:
                return _own_fields(own, rank, shared_values)
            own = dict(zip(OWN_FIELDS, own, strict=False))
        if differing is not None:
            differing.append(rank)
        shared = _object(_json(shared_text), "the claim's shared fields") if shared_text else {}
        return claim_of(rank)({**shared, **_object(own, "the claim")})

    return parse


def _json(text: bytes | str) -> object:
    try:  # a UnicodeDecodeError is a ValueError
        return _DECODER.decode(text.decode() if isinstance(text, bytes) else text)
    except (ValueError, RecursionError) as error:
        raise Malformed(f"it is not JSON ({type(error).__name__})") from error


def _shared_fields(fields: Mapping[str, object]) -> dict[str, Any]:
    """``fields``' shared values (:data:`~lightning_mpi_env.rollcall.claims.SHARED_FIELDS`), checked."""
    versions = _object(fields.get("versions", {}), "versions")
    if len(versions) > 16:
        raise Malformed(f"versions has {len(versions)} entries (at most 16)")
    expected = fields.get("expected")
    if expected is not None and (not isinstance(expected, list) or len(expected) != 2):
        raise Malformed(f"expected is {_kind(expected)}, not [devices, num_nodes]")
    return {
        "world_size": _integer(fields["world_size"], "world_size", 1, MAX_RANKS),
        "main_port": _integer(fields["main_port"], "main_port", 0, 65535),
        "versions": {_text(k, "a version's name", 64): _text(v, f"versions[{k!r}]", 64) for k, v in versions.items()},
        "backend": _text(fields.get("backend", ""), "backend", 64),
        "expected": None
        if expected is None
        else (
            _integer(expected[0], "expected devices", 1, MAX_RANKS),
            _integer(expected[1], "expected num_nodes", 1, MAX_RANKS),
        ),
        "visible_devices": _optional_integer(fields.get("visible_devices"), "visible_devices", 0, MAX_ITEMS),
        "visible_variable": _text(fields.get("visible_variable", ""), "visible_variable", 64),
        "any_layout": _flag(fields.get("any_layout", False), "any_layout"),
    }


def _own_fields(own: Sequence[object], rank: int | None, shared: Mapping[str, Any]) -> Claim:
    """The claim of the ``own`` values (in the order of :data:`OWN_FIELDS`), checked, and the ``shared`` ones."""
    claimed, host, local_rank, pid, address, device, device_id, visible, device_index, local_size = own[:10]
    world_size = shared["world_size"]
    claimed = _integer(claimed, "rank", 0, world_size - 1)
    if rank is not None and claimed != rank:
        raise Malformed(f"it claims rank {claimed} under the key of rank {rank}")
    visible_set = None if visible is None else _texts(visible, "visible_set")
    high = len(visible_set) - 1 if visible_set is not None else MAX_RANKS
    return Claim(
        rank=claimed,
        host=_text(host, "host", 255),
        local_rank=_integer(local_rank, "local_rank", 0, MAX_RANKS),
        pid=_integer(pid, "pid", 0, 1 << 32),
        main_address=_text(address, "main_address", 255),
        device=_text(device, "device", 64),
        device_id=_text(device_id, "device_id", 255),
        visible_set=visible_set,
        device_index=_optional_integer(device_index, "device_index", 0, max(high, 0)),
        local_size=_optional_integer(local_size, "local_size", 1, world_size),
        **shared,
    )


@dataclass(frozen=True)
class RollCallVerdict:
    """The roll call's verdict: a problem every rank raises, or the summary of a job that met."""

    problem: str = ""
    """What is wrong; empty when the ranks met."""
    hint: str = ""
    value: str | None = None
    summary: str = ""
    notes: tuple[str, ...] = ()

    def error(self) -> RendezvousError:
        """The problem as the error every rank raises."""
        return RendezvousError(self.problem, self.hint, value=self.value)


def roll_call_verdict(data: object) -> RollCallVerdict:
    """A parser of the roll call's verdict."""
    fields = _object(data, "the verdict")
    if "problem" in fields:
        _known_fields(fields, ("problem", "hint", "value"), ("problem", "hint"), "the verdict")
        value = fields.get("value")
        return RollCallVerdict(
            problem=_text(fields["problem"], "problem"),
            hint=_text(fields["hint"], "hint"),
            value=None if value is None else _text(value, "value"),
        )
    _known_fields(fields, ("summary", "notes"), ("summary",), "the verdict")
    return RollCallVerdict(summary=_text(fields["summary"], "summary"), notes=_texts(fields.get("notes", []), "notes"))


def node_of(claim: Claim) -> Callable[[object], tuple[NodeAssignment, int | None]]:
    """A parser of the node assignment stored for ``claim``'s rank: ``(assignment, index into its visible set)``."""

    def parse(data: object) -> tuple[NodeAssignment, int | None]:
        if not isinstance(data, list) or len(data) != 5:
            raise Malformed(f"the node assignment is {_kind(data)}, not [node, nodes, local rank, local size, device]")
        world = claim.world_size
        num_nodes = _integer(data[1], "num_nodes", 1, world)
        node_rank = _integer(data[0], "node_rank", 0, num_nodes - 1)
        local_size = _integer(data[3], "local_size", 1, world)
        local_rank = _integer(data[2], "local_rank", 0, local_size - 1)
        if claim.any_layout:
            # Nodes may differ in size, but each of the others runs at least one rank.
            if local_size + num_nodes - 1 > world:
                raise Malformed(f"{local_size} rank(s) here and {num_nodes - 1} other node(s) exceed the {world} ranks")
        elif num_nodes * local_size != world:
            raise Malformed(f"{num_nodes} node(s) of {local_size} rank(s) are not the {world} ranks of this job")
        devices = len(claim.visible_set or ())
        if data[4] is not None and not devices:
            raise Malformed(f"it assigns device {data[4]!r} to a rank that stated no visible devices")
        device = _optional_integer(data[4], "device index", 0, max(devices - 1, 0))
        return NodeAssignment(node_rank, num_nodes, local_rank, local_size), device

    return parse


def network_view(data: object) -> NetworkView:
    """A parser of rank 0's view of the network (:meth:`NetworkView.to_json`)."""
    if not isinstance(data, list) or len(data) != 3 or not isinstance(data[1], list) or len(data[1]) != 3:
        raise Malformed(f"the network view is {_kind(data)}, not [host, [name, addresses, error], interfaces]")
    host, (name, addresses, error), interfaces = data
    if not isinstance(interfaces, list) or len(interfaces) > 1024:
        raise Malformed("interfaces is not a list of at most 1024")
    parsed = []
    for item in interfaces:
        if not isinstance(item, list) or len(item) != 2:
            raise Malformed(f"an interface is {_kind(item)}, not [name, addresses]")
        parsed.append(Interface(_text(item[0], "an interface's name", 64), _texts(item[1], "its addresses")))
    resolution = Resolution(_text(name, "name", 255), _texts(addresses, "addresses"), _text(error, "error"))
    return NetworkView(_text(host, "host", 255), resolution, tuple(parsed))


def read_raw(key: str, raw: bytes | str, parser: Callable[[bytes | str], _T]) -> _T:
    """Like :func:`read`, for a value that is not one JSON document (a claim as sent)."""
    if len(raw) > MAX_VALUE_BYTES:
        raise malformed(key, raw, f"it is {len(raw)} bytes long (at most {MAX_VALUE_BYTES} are read)")
    try:
        return parser(raw)
    except Malformed as error:
        raise malformed(key, raw, str(error)) from error


@dataclass(frozen=True)
class Report:
    """What one rank's watchdog says about itself each interval."""

    rank: int
    host: str
    progress: int
    """Progress marks made so far; ranks running the same program make the same marks."""
    step: int
    phase: int
    """The training step and the index in :data:`~lightning_mpi_env.rollcall.stall.PHASES` of the last mark."""
    beat: int
    """The heartbeat: increases every interval while this rank's watchdog thread runs."""
    where: str
    """``file:line in function`` of the main thread."""
    left: bool = False
    """The rank's watchdog stopped (its fit or program ended): its silence from now on is no freeze."""
    work: float = 0.0
    """The median seconds of this rank's own work a step over its last steps (:mod:`~.rollcall.stragglers`)."""
    worked: int = 0
    """The steps whose work it measured so far."""
    busy: int = 0
    """Work done that is no mark (validation batches so far): progress, though ranks need not do as much."""

    def to_json(self) -> str:
        """The report as stored."""
        return json.dumps(asdict(self), separators=(",", ":"))


def report_of(rank: int | None) -> Callable[[object], Report]:
    """A parser of the watchdog report stored for ``rank`` (``None``: any rank)."""

    def parse(data: object) -> Report:
        fields = _object(data, "the report")
        names = tuple(Report.__dataclass_fields__)
        _known_fields(fields, names, names[:7], "the report")
        reported = _integer(fields["rank"], "rank", 0, MAX_RANKS)
        if rank is not None and reported != rank:
            raise Malformed(f"it reports rank {reported} under the key of rank {rank}")
        return Report(
            rank=reported,
            host=_text(fields["host"], "host", 255),
            progress=_integer(fields["progress"], "progress"),
            step=_integer(fields["step"], "step"),
            phase=_integer(fields["phase"], "phase", 0, PHASE_COUNT - 1),
            beat=_integer(fields["beat"], "beat"),
            where=_text(fields["where"], "where", 4096),
            left=_flag(fields.get("left", False), "left"),
            work=_finite(fields.get("work", 0.0), "work", 0.0, MAX_WORK),
            worked=_integer(fields.get("worked", 0), "worked"),
            busy=_integer(fields.get("busy", 0), "busy"),
        )

    return parse


@dataclass(frozen=True)
class StallVerdict:
    """The watchdog's verdict, as rank 0 stores it."""

    problem: str
    hint: str
    value: str | None
    exit_at: float
    """Wall-clock second at which every rank ends."""


def stall_verdict(data: object) -> StallVerdict:
    """A parser of the watchdog's verdict."""
    fields = _object(data, "the verdict")
    _known_fields(fields, ("problem", "hint", "value", "exit_at"), ("problem", "hint", "exit_at"), "the verdict")
    value = fields.get("value")
    return StallVerdict(
        problem=_text(fields["problem"], "problem"),
        hint=_text(fields["hint"], "hint"),
        value=None if value is None else _text(value, "value", 64),
        exit_at=_finite(fields["exit_at"], "exit_at"),
    )


def step(data: object) -> int:
    """A parser of a step (the stop agreement's): a non-negative integer."""
    return _integer(data, "the step")
