"""The one parser of what the roll call and the watchdog read from the store: each malformed kind, one named error."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from lightning_mpi_env.core.errors import RendezvousError
from lightning_mpi_env.rollcall.claims import Claim, NodeAssignment
from lightning_mpi_env.rollcall.network_view import NetworkView
from lightning_mpi_env.rollcall.store_values import (
    MAX_VALUE_BYTES,
    Report,
    claim_of,
    network_view,
    node_of,
    read,
    read_raw,
    report_of,
    roll_call_verdict,
    stall_verdict,
    step,
    wire_claim,
)

CLAIM = Claim(1, 4, "nodea", 1, 4242, "nodea", 29500, versions={"torch": "2.13.0"})
GPU_CLAIM = Claim(
    1, 4, "nodea", 1, 4242, "nodea", 29500, visible_set=("2", "3"), visible_variable="CUDA_VISIBLE_DEVICES"
)
UNEVEN_CLAIM = Claim(1, 4, "nodea", 1, 4242, "nodea", 29500, any_layout=True)  # "ddp_mpi": nodes may differ
REPORT = Report(2, "nodeb", 9, 2, 1, 5, "train.py:7 in training_step")


def test_good_values_round_trip():
    assert read("k", CLAIM.to_json(), claim_of(1)) == CLAIM
    assert read("k", GPU_CLAIM.to_json(), claim_of(1)) == GPU_CLAIM
    assert read("k", "[0, 2, 1, 2, 1]", node_of(GPU_CLAIM)) == (NodeAssignment(0, 2, 1, 2), 1)
    assert read("k", UNEVEN_CLAIM.to_json(), claim_of(1)) == UNEVEN_CLAIM
    assert read("k", "[0, 2, 1, 3, null]", node_of(UNEVEN_CLAIM)) == (NodeAssignment(0, 2, 1, 3), None)  # 3 + 1
    assert read("k", REPORT.to_json(), report_of(2)) == REPORT
    measured = dataclasses.replace(REPORT, work=0.125, worked=40, busy=7)
    assert read("k", measured.to_json(), report_of(2)) == measured
    assert read("k", '{"summary": "met", "notes": ["a"]}', roll_call_verdict).notes == ("a",)
    assert read("k", '{"problem": "p", "hint": "h", "value": null}', roll_call_verdict).error().problem == "p"
    assert read("k", '{"problem": "p", "hint": "h", "value": "5", "exit_at": 1.5}', stall_verdict).exit_at == 1.5
    assert read("k", "12", step) == 12
    view = NetworkView.here("localhost")
    assert read("k", view.to_json(), network_view) == view


# Each malformed kind: (parser, stored value, what the error says is wrong).
MALFORMED = {
    "not JSON": (claim_of(1), "{not json", "it is not JSON"),
    "NaN": (step, "NaN", "it is not JSON"),
    "too large": (claim_of(1), " " * (MAX_VALUE_BYTES + 1), f"at most {MAX_VALUE_BYTES} are read"),
    "claim not an object": (claim_of(1), "[1, 2]", "the claim is list, not an object"),
    "claim lacks fields": (claim_of(1), '{"rank": 1}', "the claim lacks world_size"),
    "claim unknown field": (claim_of(1), json.dumps({**json.loads(CLAIM.to_json()), "evil": 1}), "unknown field"),
    "claim of another rank": (claim_of(2), CLAIM.to_json(), "it claims rank 1 under the key of rank 2"),
    "claim rank past the world": (
        claim_of(1),
        json.dumps({**json.loads(CLAIM.to_json()), "rank": 9}),
        "rank=9 is outside 0..3",
    ),
    "claim port not an integer": (
        claim_of(1),
        json.dumps({**json.loads(CLAIM.to_json()), "main_port": "29500"}),
        "main_port is str, not an integer",
    ),
    "claim bool as integer": (
        claim_of(1),
        json.dumps({**json.loads(CLAIM.to_json()), "local_rank": True}),
        "local_rank is True, not an integer",
    ),
    "claim huge host": (
        claim_of(1),
        json.dumps({**json.loads(CLAIM.to_json()), "host": "h" * 300}),
        "host is 300 characters long",
    ),
    "claim device past its set": (
        claim_of(1),
        json.dumps({**json.loads(GPU_CLAIM.to_json()), "device_index": 2}),
        "device_index=2 is outside 0..1",
    ),
    "claim any_layout not a flag": (
        claim_of(1),
        json.dumps({**json.loads(UNEVEN_CLAIM.to_json()), "any_layout": 1}),
        "any_layout is 1, not true or false",
    ),
    "uneven nodes past the world": (
        node_of(UNEVEN_CLAIM),
        "[0, 2, 1, 4, null]",
        "4 rank(s) here and 1 other node(s) exceed the 4 ranks",
    ),
    "uneven sizes for a rank that takes even ones": (
        node_of(CLAIM),
        "[0, 2, 1, 3, null]",
        "2 node(s) of 3 rank(s) are not the 4 ranks of this job",
    ),
    "node index past the nodes": (node_of(CLAIM), "[7, 3, 0, 2, null]", "node_rank=7 is outside 0..2"),
    "node count that is not the world": (node_of(CLAIM), "[0, 3, 0, 2, null]", "are not the 4 ranks of this job"),
    "node local rank past the local size": (node_of(CLAIM), "[0, 2, 2, 2, null]", "local_rank=2 is outside 0..1"),
    "node negative": (node_of(CLAIM), "[-1, 2, 0, 2, null]", "node_rank=-1 is outside 0..1"),
    "node wrong shape": (node_of(CLAIM), '{"node_rank": 0}', "not [node, nodes, local rank, local size, device]"),
    "device past the GPUs seen": (node_of(GPU_CLAIM), "[0, 2, 1, 2, 2]", "device index=2 is outside 0..1"),
    "device for a rank that sees none": (node_of(CLAIM), "[0, 2, 1, 2, 0]", "stated no visible devices"),
    "verdict not an object": (roll_call_verdict, '"met"', "the verdict is str, not an object"),
    "verdict problem not a string": (roll_call_verdict, '{"problem": 1, "hint": "h"}', "problem is 1, not a string"),
    "report of another rank": (report_of(3), REPORT.to_json(), "it reports rank 2 under the key of rank 3"),
    "report negative step": (
        report_of(2),
        json.dumps({**json.loads(REPORT.to_json()), "step": -1}),
        "step=-1 is outside 0..",
    ),
    "report float step": (
        report_of(2),
        json.dumps({**json.loads(REPORT.to_json()), "step": 1.5}),
        "step is 1.5, not an integer",
    ),
    "report unknown phase": (report_of(2), json.dumps({**json.loads(REPORT.to_json()), "phase": 7}), "phase=7"),
    "report left not a flag": (
        report_of(2),
        json.dumps({**json.loads(REPORT.to_json()), "left": "yes"}),
        "left is str, not true or false",
    ),
    "report negative work": (report_of(2), json.dumps({**json.loads(REPORT.to_json()), "work": -0.5}), "work=-0.5"),
    "report work past a day": (
        report_of(2),
        json.dumps({**json.loads(REPORT.to_json()), "work": 1e9}),
        "work=1000000000.0 is outside 0..86400",
    ),
    "report busy not a count": (report_of(2), json.dumps({**json.loads(REPORT.to_json()), "busy": -1}), "busy=-1"),
    "report worked not a count": (
        report_of(2),
        json.dumps({**json.loads(REPORT.to_json()), "worked": "20"}),
        "worked is str, not an integer",
    ),
    "stall verdict infinite exit": (
        stall_verdict,
        '{"problem": "p", "hint": "h", "exit_at": 1e999}',
        "exit_at is inf, not a finite number",
    ),
    "stall verdict lacks exit": (stall_verdict, '{"problem": "p", "hint": "h"}', "the verdict lacks exit_at"),
    "step negative": (step, "-3", "the step=-3 is outside 0.."),
    "step huge": (step, "9" * 30, "is outside 0..9223372036854775807"),
    "network view wrong shape": (network_view, '["h", [], []]', "not [host, [name, addresses, error], interfaces]"),
}


@pytest.mark.parametrize("kind", MALFORMED)
def test_a_malformed_value_is_one_error_naming_the_key(kind):
    parser, stored, reason = MALFORMED[kind]
    with pytest.raises(RendezvousError) as caught:
        read("lightning_mpi_env/some/key", stored, parser)
    error = caught.value
    assert error.problem.startswith("The rendezvous store holds a malformed value under 'lightning_mpi_env/some/key': ")
    assert reason in error.problem
    assert "torch's TCPStore has no authentication" in error.hint
    assert error.variable == "lightning_mpi_env/some/key"
    assert len(error.problem) < 600  # a huge value is cut in the message


RANK_ZERO = Claim(0, 4, "nodea", 0, 4241, "nodea", 29500, versions={"torch": "2.13.0"})


def test_a_sent_claim_reads_back_whole_with_or_without_rank_zero_s_shared_fields():
    for reference in (None, RANK_ZERO):
        differing: list[int] = []
        assert read_raw("k", CLAIM.to_wire(), wire_claim(1, reference, differing)) == CLAIM
        # Only a claim parsed without rank 0's shared fields to lean on is counted as differing.
        assert differing == ([] if reference is not None else [1])
    assert read_raw("k", CLAIM.to_json(), wire_claim(1, RANK_ZERO)) == CLAIM  # one JSON object of every field


def test_a_claim_whose_shared_fields_differ_is_parsed_whole_and_named_differing():
    other = dataclasses.replace(CLAIM, versions={"torch": "2.12.0"}, world_size=5)
    differing: list[int] = []
    parsed = read_raw("k", other.to_wire(), wire_claim(1, RANK_ZERO, differing))
    assert (parsed, differing) == (other, [1])  # its own versions and world size, not rank 0's


@pytest.mark.parametrize(
    ("stored", "reason"),
    [
        ('[1,"nodea",1]\n{}', "the claim has 3 items, not 11"),
        (CLAIM.to_wire().replace("[1,", "[2,", 1), "it claims rank 2 under the key of rank 1"),
        (CLAIM.to_wire().replace("[1,", "[9,", 1), "rank=9 is outside 0..3"),  # checked against rank 0's world size
        (CLAIM.to_wire().split("\n")[0], "the claim lacks world_size"),  # another digest and no shared line
    ],
)
def test_a_malformed_sent_claim_names_what_is_wrong(stored, reason):
    with pytest.raises(RendezvousError, match=f"under 'k': {re.escape(reason)}"):
        read_raw("k", stored, wire_claim(1, dataclasses.replace(RANK_ZERO, versions={})))


def test_the_records_read_back_through_the_parser():
    with pytest.raises(RendezvousError, match="under 'claim': the claim lacks"):
        read("claim", '{"rank": 0}', claim_of(None))
    with pytest.raises(RendezvousError, match="under 'report': it is not JSON"):
        read("report", b"\xff", report_of(None))
    with pytest.raises(RendezvousError, match="under 'network view'"):
        read("network view", "[1]", network_view)
    view = NetworkView.here("localhost")
    assert read("network view", view.to_json(), network_view) == view


def test_the_parser_accepts_exactly_the_watchdogs_phases():
    from lightning_mpi_env.rollcall.stall import PHASES
    from lightning_mpi_env.rollcall.store_values import PHASE_COUNT

    assert len(PHASES) == PHASE_COUNT
