"""Checks of footprint_torch.py's summary of its runs: python3 -B capi/python/test_footprint_torch.py."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import footprint_torch  # noqa: E402


def run(peak, steps):
    return {"peak_in_use": peak, "step_s": steps, "losses": [1.0]}


def test_a_ratio_is_taken_within_each_round():
    # The host runs half again as slow in round 2: each round's ratio is 1.02 all the same.
    results = {
        "native": [run(10, [1.00, 1.00, 1.00]), run(10, [1.50, 1.50, 1.50])],
        "paged": [run(9, [1.02, 1.02, 1.02]), run(9, [1.53, 1.53, 1.53])],
    }
    native, paged = footprint_torch.summarize(["native", "paged"], results)
    assert native["step_ratio"] == 1.0
    assert abs(paged["step_ratio"] - 1.02) < 1e-9, paged["step_ratio"]


def test_the_peak_is_the_highest_run_and_the_step_the_median_of_run_medians():
    results = {
        "native": [run(10, [1.0]), run(12, [2.0]), run(11, [3.0])],
        "paged": [run(7, [1.1, 0.9, 1.0]), run(9, [2.0]), run(8, [9.0, 9.0, 0.1])],
    }
    native, paged = footprint_torch.summarize(["native", "paged"], results)
    assert native["peak_in_use"] == 12 and paged["peak_in_use"] == 9
    assert native["median_step_s"] == 2.0
    assert paged["run_median_step_s"] == [1.0, 2.0, 9.0] and paged["median_step_s"] == 2.0
    # Ratios per round: 1.0, 1.0, 3.0. (The median of the pooled steps would give 1.1 / 2.0, and
    # the fastest runs 1.0 / 1.0 only by chance of where the slow run fell.)
    assert paged["step_ratio"] == 1.0


def test_a_failed_run_fails_its_row_alone():
    results = {
        "native": [run(10, [1.0]), run(10, [1.0])],
        "paged": [run(9, [1.0]), None],
        "vmm": [run(9, [1.1]), run(9, [1.1])],
    }
    native, paged, vmm = footprint_torch.summarize(["native", "paged", "vmm"], results)
    assert paged == {"name": "paged", "failed": True}
    assert abs(vmm["step_ratio"] - 1.1) < 1e-9 and native["step_ratio"] == 1.0


if __name__ == "__main__":
    tests = [f for name, f in sorted(globals().items()) if name.startswith("test_")]
    for t in tests:
        t()
    print(f"footprint_torch.py: {len(tests)} checks passed")
