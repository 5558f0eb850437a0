"""Checks of table.py, the side-by-side benchmark's table: python3 benches/rmm/test_table.py."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import table  # noqa: E402


def row(lib, stack, ns=None, error=None):
    r = {"lib": lib, "workload": "random", "layout": "1-own", "stack": stack, "passes": [1] * 5}
    if error:
        r.update(ok=False, error=error)
    else:
        r.update(ok=True, ns_per_op=ns)
    return r


def test_the_fastest_round_stands():
    grid, _ = table.build([row("mrstack", "paged", 170.0), row("mrstack", "paged", 110.0),
                           row("mrstack", "paged", 150.0)])
    assert grid[("random", "1-own")]["mrstack"]["paged"]["ns_per_op"] == 110.0


def test_a_figure_stands_over_a_later_failure_and_replaces_an_earlier_one():
    later = [row("rmm", "pool", 220.0), row("rmm", "pool", error="skipped: deadline")]
    earlier = [row("rmm", "arena", error="exit status 1"), row("rmm", "arena", 300.0)]
    grid, _ = table.build(later + earlier)
    stacks = grid[("random", "1-own")]["rmm"]
    assert stacks["pool"]["ns_per_op"] == 220.0
    assert stacks["arena"]["ns_per_op"] == 300.0


def test_best_is_each_librarys_fastest_over_its_rounds():
    rows = [row("mrstack", "paged", 170.0), row("rmm", "pool", 220.0),
            row("mrstack", "paged", 110.0), row("rmm", "pool", 300.0)]
    text = table.main_table(*table.build(rows))
    best = [line for line in text.splitlines() if "**best**" in line][0]
    assert "110 (paged)" in best and "220 (pool)" in best and "0.50" in best, best


if __name__ == "__main__":
    tests = [f for name, f in sorted(globals().items()) if name.startswith("test_")]
    for t in tests:
        t()
    print(f"table.py: {len(tests)} checks passed")
