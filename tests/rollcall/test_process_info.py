"""What a rank says about its devices in its claim (no GPU here: the device count is injected)."""

from lightning_mpi_env.rollcall.claims import Claim
from lightning_mpi_env.rollcall.process_info import process_info
from lightning_mpi_env.rollcall.store_values import claim_of, read


def visible_set(env, count):
    fields = process_info(accelerator="cuda", environ=env, device_count=lambda: count)
    return fields["visible_variable"], fields["visible_set"]


def test_visible_set_from_the_variable_else_every_device_of_the_node():
    assert visible_set({"CUDA_VISIBLE_DEVICES": "2, 3"}, 8) == ("CUDA_VISIBLE_DEVICES", ("2", "3"))
    assert visible_set({"ROCR_VISIBLE_DEVICES": "GPU-aa"}, 8) == ("ROCR_VISIBLE_DEVICES", ("GPU-aa",))
    assert visible_set({"HIP_VISIBLE_DEVICES": "1"}, 8) == ("HIP_VISIBLE_DEVICES", ("1",))
    assert visible_set({}, 4) == ("", ("0", "1", "2", "3"))


def test_the_visible_set_is_the_devices_rule():
    # One rule for what a process sees, in gpu/devices.py: the claim states what own_device() reads.
    from lightning_mpi_env.gpu.devices import own_device, visible_devices

    for env in ({"CUDA_VISIBLE_DEVICES": "3,1"}, {"ROCR_VISIBLE_DEVICES": "0"}, {}):
        variable, identifiers = visible_set(env, 2)
        choice = own_device(visible_devices(env), local_rank=0, local_size=1, node_devices=2)
        assert (variable, identifiers) == (choice.variable, tuple(choice.visible))


def test_a_rank_that_will_drive_gpus_states_its_visible_set():
    fields = process_info(
        accelerator="cuda", device_index=1, environ={"CUDA_VISIBLE_DEVICES": "2,3"}, device_count=lambda: 4
    )
    assert (fields["visible_set"], fields["visible_variable"], fields["device_index"]) == (
        ("2", "3"),
        "CUDA_VISIBLE_DEVICES",
        1,
    )
    claim = Claim.here(rank=0, world_size=1, local_rank=0, main_address="a", main_port=1, **fields)
    assert read("claim", claim.to_json(), claim_of(None)).device_view().visible == ("2", "3")


def test_a_rank_on_the_cpu_states_no_visible_set():
    # On this machine torch sees no GPU and nothing says the strategy drives one.
    fields = process_info(environ={"CUDA_VISIBLE_DEVICES": "0,1"}, device_count=lambda: 2)
    assert "visible_set" not in fields
    assert fields["device"] == "cpu"
