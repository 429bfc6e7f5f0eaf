"""``hand_over`` between two real processes over gloo: a state arrives whole; a forged size or bytes is one error."""

from __future__ import annotations

import io
import multiprocessing
import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from lightning_mpi_env.core.errors import RecoveryError
from lightning_mpi_env.recovery.handover import MAX_STATE_BYTES, hand_over

TIMEOUT = 120


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def state() -> dict:
    torch.manual_seed(1)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 7, "epoch": 1}


def rank_main(rank: int, port: int, source_sends: str, results) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=TIMEOUT))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=TIMEOUT))
    try:
        if rank == 0 and source_sends != "state":  # a forged source: not hand_over, but what it sends
            size, data = {"huge": (MAX_STATE_BYTES + 1, b""), "garbage": (5, b"\x80\x02ab.")}[source_sends]
            dist.broadcast(torch.tensor([size], dtype=torch.int64), 0)
            if data:
                dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), 0)
            results.put((rank, "sent"))
        else:
            got = hand_over(state() if rank == 0 else None, 0)
            buffer = io.BytesIO()
            torch.save(got, buffer)  # tensors through a queue would outlive the process that shares them
            results.put((rank, buffer.getvalue()))
    except RecoveryError as error:
        results.put((rank, f"RecoveryError: {error}"))
    finally:
        dist.destroy_process_group()


def run_pair(source_sends: str) -> dict:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [context.Process(target=rank_main, args=(rank, port, source_sends, results)) for rank in range(2)]
    for process in processes:
        process.start()
    got = dict(results.get(timeout=TIMEOUT) for _ in processes)
    for process in processes:
        process.join(TIMEOUT)
    return got


def test_the_state_arrives_as_the_source_kept_it():
    got = run_pair("state")
    expected = state()
    received = torch.load(io.BytesIO(got[1]))
    assert (received["step"], received["epoch"]) == (7, 1)
    for name, tensor in expected["model"].items():
        assert torch.equal(received["model"][name], tensor)
    momentum = expected["optimizer"]["state"][0]["momentum_buffer"]
    assert torch.equal(received["optimizer"]["state"][0]["momentum_buffer"], momentum)
    assert received["optimizer"]["param_groups"] == expected["optimizer"]["param_groups"]


@pytest.mark.parametrize(
    ("forged", "said"),
    [
        ("huge", f"rank 0 announced a state of {MAX_STATE_BYTES + 1} bytes to hand over"),
        ("garbage", "the state rank 0 handed over does not load on rank 1"),
    ],
)
def test_a_forged_hand_over_is_one_named_error(forged, said):
    got = run_pair(forged)
    assert str(got[1]).startswith(f"RecoveryError: {said}"), got
