"""mrstack on a GPU, with PyTorch and CuPy: skipped where there is none (and each framework's
tests where it is not installed). Each scenario runs in a process of its own
(tests/gpu_scenarios.py), since PyTorch's allocator and mrstack's per-device stacks are chosen
once per process.

Run on a GPU machine, from the repository root, with the wheel installed::

    python3 -m pytest python/tests/test_gpu.py

or without installing anything (no pip, no network), with a library and command built
elsewhere::

    MRSTACK_LIB=/path/libmrstack_c.so MRSTACK_CLI=/path/mrstack PYTHONPATH=python \\
        python3 -m pytest python/tests/test_gpu.py
"""

from __future__ import annotations

import json
import os

import pytest

from conftest import HERE, gpu_count, run_python

pytestmark = pytest.mark.skipif(gpu_count() == 0, reason="no CUDA GPU (or no driver) here")

SCENARIOS = os.path.join(HERE, "gpu_scenarios.py")
DETERMINISTIC = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def scenario(*args, env=None):
    """Runs a scenario; the JSON object it printed last."""
    done = run_python([SCENARIOS, *args], {**DETERMINISTIC, **(env or {})})
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def torch_here():
    pytest.importorskip("torch", reason="PyTorch is not installed")


@pytest.fixture
def cupy_here():
    pytest.importorskip("cupy", reason="CuPy is not installed")


def same_training(native, ours):
    """The run on mrstack computed what the native run did, and held what it held."""
    # The same computation on the same data with deterministic algorithms: where the memory
    # comes from changes no result.
    assert ours["losses"] == native["losses"], (ours["losses"], native["losses"])
    assert len(native["losses"]) > 1 and all(x == x for x in native["losses"]), native["losses"]
    stats = ours["stats"]
    assert stats["allocations"] > 0 and stats["failed_allocations"] == 0, stats
    assert stats["bad_frees"] == 0, stats
    # The same program asks for the same bytes: the stack's peak of live bytes is PyTorch's peak
    # of requested bytes. PyTorch's max_memory_allocated counts its blocks as it rounded them
    # (512 bytes, and up to 1 MiB a large block keeps unsplit): at least that.
    peak = stats["peak_live_bytes"]
    assert peak == native["requested_peak"], (peak, native["requested_peak"])
    assert peak <= native["max_memory_allocated"], (peak, native["max_memory_allocated"])
    # The stack took memory from the driver, and at least what was live at the peak.
    assert stats["peak_driver_bytes"] >= peak


def test_training_on_mrstack_gives_native_losses_and_peak(torch_here):
    same_training(scenario("train-native"), scenario("train-mrstack"))


@pytest.mark.parametrize("model", ["resnet50", "transformer"])
def test_models_train_on_mrstack_with_native_losses_and_peak(torch_here, model):
    pytest.importorskip("torchvision", reason="torchvision is not installed")
    same_training(scenario("model-native", model), scenario("model-mrstack", model))


def test_a_mempool_region_allocates_through_mrstack(torch_here):
    r = scenario("mempool")
    assert r["values_ok"]
    before, inside, outside = r["before"], r["inside"], r["outside"]
    # Inside the region PyTorch's caching allocator took its segments from the stack...
    assert inside["allocations"] > before["allocations"]
    assert inside["live_bytes"] >= 4 << 20  # two 4 MiB tensors, in segments of the stack
    # ...outside it, from the driver as usual.
    assert outside["allocations"] == inside["allocations"]
    assert r["end"]["bad_frees"] == 0
    assert r["end"]["live_bytes"] <= inside["live_bytes"]


def test_out_of_memory_raises_torch_out_of_memory_error_and_pytorch_goes_on(torch_here):
    r = scenario("oom")
    for caught in r["caught"]:
        assert caught is not None, "a tensor far larger than the GPU was handed out"
        _type, is_oom, is_runtime, message = caught
        assert is_oom and is_runtime, caught
        assert "out of memory" in message.lower() or "no memory" in message.lower(), caught
    assert r["after"]["failed_allocations"] >= r["before"]["failed_allocations"] + 2
    assert r["after"]["live_blocks"] == r["before"]["live_blocks"]
    assert r["goes_on"]


def test_out_of_memory_in_a_mempool_is_torch_out_of_memory_error(torch_here):
    r = scenario("mempool-oom")
    for caught in r["caught"]:
        assert caught is not None
        _type, is_oom, _is_runtime, _message = caught
        assert is_oom, caught
    assert r["goes_on"]


def test_cupy_on_mrstack_computes_right_and_reports_out_of_memory(cupy_here):
    r = scenario("cupy")
    assert r["values_ok"]
    assert r["stats"]["allocations"] > 0 and r["stats"]["bad_frees"] == 0
    name, is_oom, message = r["oom"]
    assert is_oom, r["oom"]
    assert "mrstack" in message
    assert r["goes_on"]


def test_a_snapshot_captured_here_recommends_a_stack_that_then_trains(torch_here, tmp_path):
    out = tmp_path / "snapshot.pickle"
    r = scenario("snapshot", str(out))
    assert out.stat().st_size > 0
    # The default stack, or a stack over the driver's allocator with a capacity.
    stack = r["file_stack"]
    assert stack and (stack == "paged" or stack.startswith("cuda > ")), r["text"]
    assert r["dict_stack"], r["text"]
    assert any("PyTorch memory snapshot" in n for n in r["notes"]), r["notes"]
    # The recommended stack trains the model the snapshot recorded, as PyTorch's own allocator.
    same_training(scenario("train-native"), scenario("train-mrstack", stack))
