"""The package without a GPU: import, stack texts, statistics, errors, and the replay of an RMM
log and of PyTorch snapshots. What needs PyTorch skips (saying so) where it is not installed."""

from __future__ import annotations

import json
import os
import pickle

import pytest

import mrstack
from conftest import gpu_count, repo_file, run_python
import snapshot_fixture

SIM = "simulated(capacity=1GiB) > pool(initial=4MiB) > binning"
HOST_ENV = {"MRSTACK_ALLOW_HOST_MEMORY": "1"}


def test_the_package_finds_its_library_and_command():
    assert mrstack.__version__
    assert os.path.isfile(mrstack.lib_path())
    assert os.path.isfile(mrstack.cli_path())
    assert os.access(mrstack.cli_path(), os.X_OK)


def test_describe_gives_the_stack_text_back_exactly():
    text = mrstack.describe(SIM)
    assert text.startswith("simulated(capacity=1 GiB) > pool(initial=4 MiB"), text
    assert "> binning" in text
    assert "byte aligned" in text
    # The description builds the same stack again.
    stack_part = text.split(" (gives ")[0]
    assert mrstack.describe(stack_part).split(" (gives ")[0] == stack_part


@pytest.mark.parametrize(
    "text, column, says",
    [
        ("cuda > pol", 8, "unknown resource or adaptor `pol`"),
        ("cuda > pool(initial=1GiB", 25, "expected"),
        ("simulated(capacity=1GiB) > pool(initial=lots)", 41, "lots"),
        ("simulated(capacity=1GiB) > pool(initial=2MiB, max=1MiB)", 47, "above"),
        ("   ", 4, "empty configuration"),
    ],
)
def test_a_bad_stack_is_a_value_error_naming_its_column(text, column, says):
    with pytest.raises(ValueError) as e:
        mrstack.describe(text)
    message = str(e.value)
    assert f"column {column}:" in message, message
    assert says in message, message
    with pytest.raises(ValueError, match=f"column {column}:"):
        mrstack.Stack(text)


def test_check_reads_the_text_without_building_it():
    # A CUDA stack checks on a machine without a GPU: nothing is built.
    mrstack.check("cuda > pool(initial=1GiB) > binning")
    with pytest.raises(ValueError, match="column 8: unknown resource or adaptor `pol`"):
        mrstack.check("cuda > pol")
    with pytest.raises(TypeError):
        mrstack.check(42)  # type: ignore[arg-type]


@pytest.mark.skipif(gpu_count() > 0, reason="this machine has a GPU: the CUDA leaf builds")
def test_a_cuda_stack_without_a_gpu_is_a_runtime_error():
    with pytest.raises(RuntimeError) as e:
        mrstack.describe("cuda > pool")
    assert "cuda" in str(e.value).lower()
    assert not isinstance(e.value, ValueError)


def test_stats_count_calls_live_bytes_the_leaf_and_each_layer():
    with mrstack.Stack(SIM) as s:
        before = s.stats()
        assert before["config"] == SIM
        assert (before["allocations"], before["live_bytes"]) == (0, 0)
        # The pool reserved its initial chunk from the leaf.
        assert before["driver_bytes"] == 4 << 20
        assert [l["layer"] for l in before["layers"]] == ["pool", "binning"]
        blocks = [(s.allocate(n), n) for n in (1000, 3000, 1 << 20)]
        during = s.stats()
        assert during["allocations"] == 3
        assert during["live_blocks"] == 3
        assert during["live_bytes"] == 1000 + 3000 + (1 << 20)
        pool = during["layers"][0]
        assert pool["held"] == 4 << 20 and pool["allocated"] > 0
        for p, n in blocks:
            s.deallocate(p, n)
        after = s.stats()
        assert (after["live_blocks"], after["live_bytes"]) == (0, 0)
        assert after["peak_live_bytes"] == 1000 + 3000 + (1 << 20)
        assert after["peak_driver_bytes"] >= 4 << 20
        with pytest.raises(ValueError, match="not a live block"):
            s.deallocate(blocks[0][0], 1000)
        assert s.stats()["bad_frees"] == 1
        with pytest.raises(MemoryError):
            s.allocate(2 << 30)


def test_stats_of_a_page_stack_say_what_is_mapped_and_cached():
    text = "paged(simulated=256 MiB, peak_slack=0 B)"
    with mrstack.Stack(text) as s:
        p = s.allocate(5 << 20)
        during = s.stats()["layers"]
        assert [l["layer"] for l in during] == ["paged"], during
        # Three 2 MiB pages under a 5 MiB block.
        assert during[0]["mapped"] == 6 << 20 and during[0]["allocated"] >= 5 << 20, during
        assert during[0]["maps"] == 3 and during[0]["unmaps"] == 0, during
        assert during[0]["page_table_bytes"] > 0, during
        assert during[0]["slack_doublings"] == 0 and during[0]["busy"] == 0, during
        s.deallocate(p, 5 << 20)
        after = s.stats()["layers"][0]
        assert after["allocated"] == 0
        assert after["mapped"] == after["cached"] and after["peak_mapped"] == 6 << 20, after
        assert after["maps"] == 3 and after["waited_ns"] == 0, after


def test_stats_of_a_device_stack_come_from_mrstack_stack():
    code = "import json, mrstack; print(json.dumps(mrstack.stats(0)))"
    done = run_python(code, {"MRSTACK_STACK": SIM, **HOST_ENV})
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert stats["config"] == SIM
    assert stats["live_blocks"] == 0
    assert stats["layers"][0]["layer"] == "pool"


def test_a_bad_mrstack_stack_is_a_value_error_naming_its_column():
    code = (
        "import mrstack\n"
        "try:\n"
        "    mrstack.stats(0)\n"
        "except ValueError as e:\n"
        "    print('ValueError:', e)\n"
    )
    done = run_python(code, {"MRSTACK_STACK": "simulated(capacity=1GiB) > pool(max=)"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ValueError:"), done.stdout
    assert "MRSTACK_STACK" in done.stdout and "column " in done.stdout, done.stdout


def test_replay_of_an_rmm_log_recommends_a_stack():
    log = repo_file("data", "traces", "transformer_infer.csv.gz")
    r = mrstack.replay(log, stacks=["tlsf", "pool"], upstream="simulated", passes=1,
                       args=["--precision", "0.05"])
    assert "workload: transformer_infer" in r.text
    assert r.stack is not None and r.stack.startswith("cuda > "), r.text
    mrstack.check(r.stack)


def test_replay_of_a_snapshot_pickle_and_of_its_dict():
    path = repo_file("data", "snapshots", "small.pickle")
    from_file = mrstack.replay(path, upstream="simulated", passes=1)
    assert "6 allocations" in from_file.text, from_file.text
    assert any("PyTorch memory snapshot, device 0" in n for n in from_file.notes), from_file.notes
    assert any("held at most 20971520 bytes" in n for n in from_file.notes), from_file.notes
    assert from_file.stack is not None
    # The dict torch.cuda.memory._snapshot() returns: the same structure, unpickled.
    from_dict = mrstack.replay(snapshot_fixture.snapshot(), upstream="simulated", passes=1)
    assert from_dict.stack == from_file.stack
    with open(path, "rb") as f:
        assert pickle.load(f) == snapshot_fixture.snapshot()


def test_a_snapshot_without_history_says_to_record_it():
    with pytest.raises(RuntimeError, match="_record_memory_history"):
        mrstack.replay({"segments": [], "device_traces": [[]]}, upstream="simulated")
    with pytest.raises(ValueError, match="snapshot"):
        mrstack.replay({"something": "else"})


def test_python_m_mrstack_replays_checks_and_describes():
    path = repo_file("data", "snapshots", "small.pickle")
    done = run_python(["-m", "mrstack", "replay", path, "--upstream", "simulated",
                       "--passes", "1", "--quiet"])
    assert done.returncode == 0, done.stderr
    assert "as a text config (mrstack::config::build):" in done.stdout
    done = run_python(["-m", "mrstack", "check", "cuda > pol"])
    assert done.returncode == 1 and "column 8" in done.stderr, done.stderr
    done = run_python(["-m", "mrstack", "describe", SIM])
    assert done.returncode == 0 and "binning" in done.stdout, done.stderr
    done = run_python(["-m", "mrstack", "stats"], {"MRSTACK_STACK": SIM, **HOST_ENV})
    assert done.returncode == 0 and json.loads(done.stdout)["config"] == SIM, done.stderr


def test_mrstack_torch_without_a_gpu_is_a_clear_runtime_error():
    pytest.importorskip("torch", reason="PyTorch is not installed (CI leaves it out: a large "
                                        "download); the GPU tests cover mrstack.torch")
    if gpu_count() > 0:
        pytest.skip("this machine has a GPU: python/tests/test_gpu.py covers mrstack.torch")
    code = (
        "import mrstack.torch\n"
        "for f in (mrstack.torch.use, mrstack.torch.MemPool):\n"
        "    try:\n"
        "        f()\n"
        "    except RuntimeError as e:\n"
        "        print('RuntimeError:', e)\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout
    assert all(l.startswith("RuntimeError: mrstack.torch needs a CUDA GPU") for l in lines), lines


def test_mrstack_torch_checks_the_stack_text_first():
    pytest.importorskip("torch", reason="PyTorch is not installed (CI leaves it out: a large "
                                        "download)")
    code = (
        "import mrstack.torch\n"
        "try:\n"
        "    mrstack.torch.allocator('cuda > pol')\n"
        "except ValueError as e:\n"
        "    print('ValueError:', e)\n"
    )
    done = run_python(code)
    assert "ValueError:" in done.stdout and "column 8" in done.stdout, done.stdout + done.stderr
