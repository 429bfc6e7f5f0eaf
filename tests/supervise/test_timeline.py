"""The timeline: each event once on stderr and once as a JSON line, in order."""

from __future__ import annotations

import json

from lightning_mpi_env.supervise.timeline import Event, EventKind, Timeline


def test_each_event_is_one_human_line_and_one_json_line():
    said: list[str] = []
    kept: list[str] = []
    timeline = Timeline(said.append, kept.append)
    timeline.add(Event(EventKind.FAILURE, 1, "frozen: rank 3 on node2\n at step 10", when=10.0, fields={"ranks": [3]}))
    timeline.add(Event(EventKind.EXCLUDED, 1, "node2", when=10.5, fields={"hosts": ["node2"]}))
    timeline.add(Event(EventKind.RELAUNCH, 2, "srun --exclude=node2 -N2 python t.py", when=20.0))
    assert said == [
        "lightning-mpi-env run: step 1: failure: frozen: rank 3 on node2 at step 10",
        "lightning-mpi-env run: step 1: excluded: node2",
        "lightning-mpi-env run: step 2: relaunch: srun --exclude=node2 -N2 python t.py",
    ]
    rows = [json.loads(line) for line in kept]
    assert [row["event"] for row in rows] == ["failure", "excluded", "relaunch"]
    assert rows[0] == {
        "event": "failure",
        "step": 1,
        "when": 10.0,
        "message": "frozen: rank 3 on node2 at step 10",
        "ranks": [3],
    }
    assert rows[1]["hosts"] == ["node2"]
    assert [event.kind for event in timeline.events] == [EventKind.FAILURE, EventKind.EXCLUDED, EventKind.RELAUNCH]


def test_a_field_cannot_overwrite_the_event_s_own():
    line = Event(EventKind.DONE, 2, "all steps done", when=1.0, fields={"event": "forged", "status": 0}).to_json()
    assert json.loads(line)["event"] == "done"
    assert json.loads(line)["status"] == 0


def test_without_a_file_only_the_line_is_said():
    said: list[str] = []
    Timeline(said.append).add(Event(EventKind.STOP, 3, "cap reached", when=1.0))
    assert said == ["lightning-mpi-env run: step 3: stop: cap reached"]
