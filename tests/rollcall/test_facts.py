"""What a rank says about its devices in its claim (no GPU here: the device count is injected)."""

from lightning_mpi_env.rollcall.facts import local_facts, visible_set
from lightning_mpi_env.rollcall.verdicts import Claim


def test_visible_set_from_the_variable_else_every_device_of_the_node():
    assert visible_set({"CUDA_VISIBLE_DEVICES": "2, 3"}, lambda: 8) == ("CUDA_VISIBLE_DEVICES", ("2", "3"))
    assert visible_set({"ROCR_VISIBLE_DEVICES": "GPU-aa"}, lambda: 8) == ("ROCR_VISIBLE_DEVICES", ("GPU-aa",))
    assert visible_set({"HIP_VISIBLE_DEVICES": "1"}, lambda: 8) == ("HIP_VISIBLE_DEVICES", ("1",))
    assert visible_set({}, lambda: 4) == ("", ("0", "1", "2", "3"))


def test_the_visible_set_is_the_devices_rule():
    # One rule for what a process sees, in core/devices.py: the claim states what own_device() reads.
    from lightning_mpi_env.core.devices import own_device, visible_devices

    for env in ({"CUDA_VISIBLE_DEVICES": "3,1"}, {"ROCR_VISIBLE_DEVICES": "0"}, {}):
        variable, identifiers = visible_set(env, lambda: 2)
        choice = own_device(visible_devices(env), local_rank=0, local_size=1, node_devices=2)
        assert (variable, identifiers) == (choice.variable, tuple(choice.visible))


def test_a_rank_that_will_drive_gpus_states_its_visible_set():
    facts = local_facts(
        accelerator="cuda", device_index=1, environ={"CUDA_VISIBLE_DEVICES": "2,3"}, device_count=lambda: 4
    )
    assert (facts["visible_set"], facts["visible_variable"], facts["device_index"]) == (
        ("2", "3"),
        "CUDA_VISIBLE_DEVICES",
        1,
    )
    claim = Claim.here(rank=0, world_size=1, local_rank=0, main_address="a", main_port=1, **facts)
    assert Claim.from_json(claim.to_json()).device_view().visible == ("2", "3")


def test_a_rank_on_the_cpu_states_no_visible_set():
    # On this machine torch sees no GPU and nothing says the strategy drives one.
    facts = local_facts(environ={"CUDA_VISIBLE_DEVICES": "0,1"}, device_count=lambda: 2)
    assert "visible_set" not in facts
    assert facts["device"] == "cpu"
