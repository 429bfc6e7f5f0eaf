"""The supervisor's timeline: one event per thing that happens, as one human line and one JSON line."""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

PREFIX = "lightning-mpi-env run"
"""What every human line starts with."""

Value = str | int | float | bool | None | list[str] | list[int]
"""A field's value: plain JSON."""


class EventKind(enum.Enum):
    """What happened."""

    LAUNCH = "launch"
    FAILURE = "failure"
    EXCLUDED = "excluded"
    PROBE = "probe"
    RELAUNCH = "relaunch"
    FIRST_STEP = "first_step"
    STRAGGLER = "straggler"
    DONE = "done"
    STOP = "stop"


@dataclass(frozen=True)
class Event:
    """One event of the timeline."""

    kind: EventKind
    step: int
    """The job step it concerns: 1 for the first launch, 2 for the first relaunch, ..."""
    message: str
    when: float = field(default_factory=time.time)
    """Wall-clock seconds (Unix time)."""
    fields: Mapping[str, Value] = field(default_factory=dict)
    """What a program needs of it: hosts, ranks, status, seconds."""

    def human(self) -> str:
        """The line on stderr."""
        return f"{PREFIX}: step {self.step}: {self.kind.value.replace('_', ' ')}: {' '.join(self.message.split())}"

    def to_json(self) -> str:
        """The JSON line."""
        data: dict[str, Value] = {"event": self.kind.value, "step": self.step, "when": self.when}
        data["message"] = " ".join(self.message.split())
        data.update({name: value for name, value in self.fields.items() if name not in data})
        return json.dumps(data, separators=(",", ":"))


@dataclass
class Timeline:
    """Where the events go: the human line to ``say`` (stderr), the JSON line to ``record`` (if any); the events."""

    say: Callable[[str], object]
    record: Callable[[str], object] | None = None
    events: list[Event] = field(default_factory=list)

    def add(self, event: Event) -> Event:
        """Show and keep ``event``; returns it."""
        self.events.append(event)
        self.say(event.human())
        if self.record is not None:
            self.record(event.to_json())
        return event
