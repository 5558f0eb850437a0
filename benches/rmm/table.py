#!/usr/bin/env python3
"""The table of the side-by-side benchmark with RMM, from the JSON lines both sides print.

    python3 benches/rmm/table.py results.jsonl [--md out.md] [--title "…"]

Pairs mrstack's stacks and RMM's resources of the same name in each workload × layout, and a
best-vs-best row (the fastest of each library there), with the ratio mrstack / RMM (below 1:
mrstack is faster). Prints the table (Markdown, aligned) and, with --md, writes it with a legend
and a table of throughput against one thread of each stack.
"""

import json
import sys

PAIRS = ["cuda_async", "pool", "binning", "binning-rmm", "arena", "binning+arena", "cuda"]
# mrstack's stacks with no RMM counterpart: rows of their own, no ratio.
MRSTACK_ONLY = ["tlsf", "vmm", "tlsf+cache", "heaps"]
LEGEND = {
    "cuda_async": "mrstack `CudaAsync` / RMM `cuda_async_memory_resource` (the driver's pool)",
    "pool": "`Pool { initial: cap, max: cap }` / `pool_memory_resource(cuda, cap, cap)`",
    "binning": "`Binning` 256 B..1 MiB over that pool / `binning_memory_resource(pool, 8, 20)`",
    "binning-rmm": "`Binning` 256 KiB..4 MiB over that pool / `binning_memory_resource(pool, 18, 22)` (RMM's examples)",
    "arena": "`Arena { size: cap }` / `arena_memory_resource(cuda, cap)`",
    "binning+arena": "`Binning` 256 B..1 MiB over the arena / `binning_memory_resource(arena, 8, 20)`",
    "cuda": "raw `cuMemAlloc` / `cuda_memory_resource` (cudaMalloc)",
    "tlsf": "`Tlsf { initial: cap, max: cap }` / none (RMM has no TLSF)",
    "vmm": "`VirtualMemory { max: cap, cache: cap }` over the device's 2 MiB pages / none (RMM has no virtual-memory resource)",
    "tlsf+cache": "`ThreadCache { bytes: cap / 4, max_block: cap / 4 }` over that Tlsf / none",
    "heaps": "`ThreadHeaps { max: cap }` (a `Tlsf` per thread) / none",
    "best": "the fastest stack of each library in that row's workload and layout",
}


def load(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


def key_layout(layout):
    threads, _, streams = layout.partition("-")
    order = {"own": 0, "one": 1, "logged": 2}
    return (int(threads) if threads.isdigit() else 0, order.get(streams, 3))


def cell(r):
    """ns/op text of one result, or why there is none."""
    if r is None:
        return "-"
    if r.get("ok"):
        ns = r["ns_per_op"]
        text = f"{ns:,.0f}" if ns >= 100 else f"{ns:.1f}"
        if r.get("warmup_only"):
            return f"{text} (w)"
        n = len(r.get("passes", []))
        return text if n >= 5 else f"{text} ({n}p)"
    error = r.get("error", "error")
    if "deadline" in error:
        return "skipped"
    if "memory" in error.lower() or "oom" in error.lower():
        return "out of memory"
    return "error"


def ratio(a, b):
    if a is None or b is None or not a.get("ok") or not b.get("ok") or b["ns_per_op"] <= 0:
        return "-"
    return f"{a['ns_per_op'] / b['ns_per_op']:.2f}"


def build(rows):
    """{(workload, layout): {lib: {stack: row}}} and the workloads and layouts in order."""
    grid = {}
    workloads = []
    for r in rows:
        if "lib" not in r or "stack" not in r:
            continue
        k = (r["workload"], r["layout"])
        if r["workload"] not in workloads:
            workloads.append(r["workload"])
        # Of several lines for one cell (rounds), the fastest figure stands: the hosts' noise
        # (another tenant on the core, a slow period lasting seconds) only ever slows a run. A
        # figure stands over a failure, and a later failure over an earlier one.
        stacks = grid.setdefault(k, {}).setdefault(r["lib"], {})
        before = stacks.get(r["stack"])
        if (
            before is None
            or not before.get("ok")
            or (r.get("ok") and r["ns_per_op"] < before["ns_per_op"])
        ):
            stacks[r["stack"]] = r
    return grid, workloads


def best(stacks):
    ok = [r for name, r in stacks.items() if r.get("ok") and name != "cuda"]
    return min(ok, key=lambda r: r["ns_per_op"]) if ok else None


def main_table(grid, workloads):
    header = ["workload", "threads", "streams", "pair", "mrstack ns/op", "RMM ns/op", "mrstack/RMM"]
    lines = []
    for w in workloads:
        layouts = sorted({l for (wl, l) in grid if wl == w}, key=key_layout)
        for layout in layouts:
            libs = grid[(w, layout)]
            m, r = libs.get("mrstack", {}), libs.get("rmm", {})
            threads, _, streams = layout.partition("-")
            names = [p for p in PAIRS + MRSTACK_ONLY if p in m or p in r]
            names += sorted(n for n in set(m) | set(r) if n not in PAIRS + MRSTACK_ONLY)
            for name in names:
                a, b = m.get(name), r.get(name)
                lines.append([w, threads, streams, name, cell(a), cell(b), ratio(a, b)])
            a, b = best(m), best(r)
            lines.append(
                [
                    w,
                    threads,
                    streams,
                    "**best**",
                    f"{cell(a)} ({a['stack']})" if a else "-",
                    f"{cell(b)} ({b['stack']})" if b else "-",
                    ratio(a, b),
                ]
            )
    return render(header, lines, right=[1, 4, 5, 6])


def scaling_table(grid, workloads):
    """Throughput with N threads over throughput with one (same streams use): ns(1) / ns(N)."""
    header = ["workload", "streams", "lib", "stack"]
    counts = sorted({int(l.partition("-")[0]) for (_, l) in grid if l.partition("-")[0].isdigit()})
    header += [f"{n} thr" for n in counts]
    lines = []
    for w in workloads:
        for streams in ["own", "one"]:
            for lib in ["mrstack", "rmm"]:
                one = grid.get((w, f"1-{streams}"), {}).get(lib, {})
                for name in [p for p in PAIRS + MRSTACK_ONLY if p in one]:
                    base = one[name]
                    row = [w, streams, lib, name]
                    for n in counts:
                        r = grid.get((w, f"{n}-{streams}"), {}).get(lib, {}).get(name)
                        if r and r.get("ok") and base.get("ok") and r["ns_per_op"] > 0:
                            row.append(f"{base['ns_per_op'] / r['ns_per_op']:.2f}x")
                        else:
                            row.append("-")
                    lines.append(row)
    return render(header, lines, right=list(range(4, len(header))))


def render(header, lines, right):
    widths = [len(h) for h in header]
    for l in lines:
        widths = [max(w, len(c)) for w, c in zip(widths, l)]

    def fmt(cells):
        out = []
        for i, (c, w) in enumerate(zip(cells, widths)):
            out.append(c.rjust(w) if i in right else c.ljust(w))
        return "| " + " | ".join(out) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if i in right else ("-" * (w + 2)) for i, w in enumerate(widths)) + "|"
    return "\n".join([fmt(header), rule] + [fmt(l) for l in lines])


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    md, title = None, "mrstack and RMM side by side"
    args = argv[2:]
    while args:
        a = args.pop(0)
        if a == "--md" and args:
            md = args.pop(0)
        elif a == "--title" and args:
            title = args.pop(0)
        else:
            print(f"unknown argument {a}", file=sys.stderr)
            return 2
    rows = load(argv[1])
    grid, workloads = build(rows)
    if not grid:
        print("no results", file=sys.stderr)
        return 1
    table = main_table(grid, workloads)
    print(table)
    failed = [r for r in rows if "lib" in r and not r.get("ok")]
    if md:
        with open(md, "w", encoding="utf-8") as f:
            f.write(f"# {title}\n\n")
            f.write(
                "ns per op (allocate or free), median of the timed passes after a warm-up pass, "
                "the fastest of the rounds where there were several; "
                "`(Np)`: only N timed passes fit the budget; `(w)`: the warm-up pass alone, which took over 2.5 "
                "budgets (a stack that slow needs no median). N threads: the workload's allocations "
                "dealt round-robin to N threads, each freeing its own, the same ops at every thread "
                "count (aggregate ns/op: wall time over all ops). `own`: each thread on a stream "
                "of its own; `one`: every thread on the default stream; `logged`: the log's own "
                "threads and streams. mrstack/RMM below 1: mrstack is faster.\n\n"
            )
            f.write(table + "\n\n")
            f.write("Pairs (mrstack / RMM), cap = the op file's capacity:\n\n")
            for name in PAIRS + MRSTACK_ONLY + ["best"]:
                f.write(f"- `{name}`: {LEGEND[name]}\n")
            f.write("\n## Throughput with N threads over one thread (ns/op at 1 / ns/op at N)\n\n")
            f.write(scaling_table(grid, workloads) + "\n")
            if failed:
                f.write("\n## Cells without a figure\n\n")
                for r in failed:
                    f.write(f"- {r['lib']} {r['stack']} on {r['workload']} {r['layout']}: {r.get('error', '')}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
