"""The GPU proof that PyTorch and CuPy run on libmrstack_c.so. Runs each client
script in a process of its own (an allocator is chosen once per process, before CUDA starts),
compares what they computed, prints one table, and ends with `clients: N passed, M failed`
(exit status 1 if anything failed).

1. ResNet-50 training (torchvision, batch 64, random data, fixed seed, deterministic algorithms),
   once per allocator: native, native again (the control: it shows the setup is deterministic),
   PyTorch's cudaMallocAsync backend, and mrstack with `cuda > pool`, `cuda > pool > binning`,
   the same recording MRSTACK_LOG, and the stack `mrstack replay` recommends for that log. Every
   row's losses must equal the native row's, step by step, bit for bit.
2. A GPT-2-shaped transformer's inference on random sequence lengths: mrstack's logits must equal
   native's, bit for bit.
3. CuPy matrix products and FFTs on mrstack equal NumPy's, and nothing leaks; CuPy out of memory
   raises MemoryError and goes on.
4. The log recorded from the training replays with `mrstack replay` (gzipped into the output
   folder: a real trace).
5. PyTorch out of memory on mrstack raises RuntimeError (no tensor at address 0) and goes on.

Only the standard library here: torch, cupy and numpy are imported by the client scripts alone.
Outputs go to --out ($OUT when set, else /tmp/mrstack-clients): clients.json (every result),
resnet50-table.md, replay.txt, resnet50-train-mrstack.csv.gz (the trace) and details.tar.gz
(each client's JSON, log and stack reports); large scratch files (the transformer's logits) to
--work.
"""

import argparse
import gzip
import importlib.util
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mrstack_capi  # noqa: E402  (ctypes only: loading the library starts no CUDA)

MIB = 1 << 20
POOL = "cuda > pool"
BINNING = "cuda > pool > binning"
# The stack used when the replay gives no recommendation (it failed): a loud fallback, counted
# as a failure with the replay.
FALLBACK_RECOMMENDED = "cuda_async > binning"
# Everything that changes how a client allocates, cleared for every child: each sets only its own.
CLEARED_ENV = (
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF",
    "MRSTACK_STACK", "MRSTACK_LOG", "MRSTACK_REPORT", "CUPY_TF32", "CUPY_GPU_MEMORY_LIMIT",
    "CUPY_ACCELERATORS",
)


class Run:
    def __init__(self, args):
        self.args = args
        self.passed = 0
        self.failed = []
        self.started = time.monotonic()
        self.results = {}
        self.table_text = None

    # -- counting ------------------------------------------------------------------------------
    def check(self, what, ok, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed.append(what)
        print(f"{'ok' if ok else 'FAILED'}: {what}" + (f" ({detail})" if detail else ""), flush=True)
        return ok

    def budget_left(self):
        return self.args.budget - (time.monotonic() - self.started)

    # -- children ------------------------------------------------------------------------------
    def env(self, **extra):
        env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS
        env["PYTHONHASHSEED"] = "0"
        env["PYTHONUNBUFFERED"] = "1"
        env.update({k: v for k, v in extra.items() if v is not None})
        return env

    def child(self, name, script, argv, env, timeout=None):
        """Runs `script` with `argv` (its --out is added), output to out/logs/NAME.log; counts
        its checks. Returns its JSON result, or None when it left none."""
        out_json = os.path.join(self.args.details, f"{name}.json")
        log_path = os.path.join(self.args.details, "logs", f"{name}.log")
        for stale in (out_json, out_json + ".tmp"):
            if os.path.exists(stale):
                os.remove(stale)
        left = self.budget_left()
        if left < 30:
            self.check(f"{name}: run", False, f"not run: the time budget (--budget "
                       f"{self.args.budget:.0f} s) is spent")
            return None
        timeout = min(timeout or self.args.timeout, left)
        cmd = [sys.executable, os.path.join(HERE, script), *argv, "--out", out_json]
        # The console gets the variables that choose the allocator; the log, the whole command.
        shown = " ".join(f"{k}={env[k]!r}" for k in ("PYTORCH_CUDA_ALLOC_CONF", "MRSTACK_STACK")
                         if k in env)
        print(f"== {name}" + (f": {shown}" if shown else ""), flush=True)
        t0 = time.monotonic()
        with open(log_path, "w") as log:
            log.write(" ".join(f"{k}={env[k]!r}" for k in sorted(env)
                               if k.startswith(("MRSTACK_", "PYTORCH_", "CUBLAS_")))
                      + " " + " ".join(cmd) + "\n")
            log.flush()
            # Its own session, so that a timeout kills it and anything it started.
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = None
        took = time.monotonic() - t0
        result = None
        if os.path.exists(out_json):
            with open(out_json) as f:
                result = json.load(f)
        elif os.path.exists(out_json + ".tmp"):
            with open(out_json + ".tmp") as f:
                result = json.load(f)
        child_failed = 0
        for c in (result or {}).get("checks", []):
            if c["ok"]:
                self.passed += 1
            else:
                child_failed += 1
                self.failed.append(f"{name}: {c['check']}")
                print(f"FAILED: {name}: {c['check']} ({c['detail']})", flush=True)
        n = len((result or {}).get("checks", []))
        if rc is None:
            self.check(f"{name}: finishes within {timeout:.0f} s", False, f"killed after {took:.0f} s")
        elif rc != 0 and child_failed == 0:
            why = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
            self.check(f"{name}: exits cleanly", False, f"{why}, {n} checks recorded")
        if rc != 0 or child_failed:
            print(f"-- last lines of {log_path}:")
            with open(log_path, errors="replace") as f:
                for line in f.readlines()[-15:]:
                    print(f"   {line.rstrip()}")
        else:
            print(f"   {n} checks ok, {took:.1f} s", flush=True)
        if result is None:
            result = {"checks": [], "no_result": True}
        result["_seconds"] = took
        result["_rc"] = rc
        self.results[name] = result
        return result

    # -- 1. ResNet-50 ---------------------------------------------------------------------------
    def resnet_argv(self):
        a = self.args
        argv = ["--steps", str(a.steps), "--warmup", str(a.warmup), "--batch", str(a.batch),
                "--device", a.device]
        if a.device == "cpu":
            argv += ["--image-size", "64"]
        return argv

    def resnet(self, name, allocator, stack=None, log=None):
        argv = ["--allocator", allocator, *self.resnet_argv()]
        extra = {}
        if allocator == "cudaMallocAsync":
            # Only this variable: PyTorch reads PYTORCH_CUDA_ALLOC_CONF before PYTORCH_ALLOC_CONF.
            extra["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
        if allocator == "mrstack":
            argv += ["--lib", self.args.lib,
                     "--report", os.path.join(self.args.details, f"{name}.report.json")]
            extra["MRSTACK_STACK"] = stack
            extra["MRSTACK_LOG"] = log
            # The stack's statistics once more at exit, after Python let go of everything.
            extra["MRSTACK_REPORT"] = os.path.join(self.args.details, f"{name}.exit-report.json")
        return self.child(name, "resnet_train.py", argv, self.env(**extra))

    def compare_losses(self, name, row, native):
        if row is None or native is None or "losses" not in row or "losses" not in native:
            self.check(f"{name}: losses equal native's step by step", False, "no losses to compare")
            return None
        a, b = row["losses"], native["losses"]
        diffs = [abs(x - y) for x, y in zip(a, b)]
        # Bit for bit: struct-packed, so that two NaNs of the same bits compare equal too (the
        # finite check fails those anyway).
        unequal = [i for i, (x, y) in enumerate(zip(a, b))
                   if struct.pack("<d", x) != struct.pack("<d", y)]
        equal = len(a) == len(b) and not unequal
        detail = (f"{len(a)} steps, all equal" if equal else
                  f"{len(a)} vs {len(b)} steps; {len(unequal)} differ, first at step {unequal[0] if unequal else '-'}, "
                  f"max abs diff {max(diffs) if diffs else float('nan'):.3e}")
        self.check(f"{name}: losses equal native's step by step", equal, detail)
        return equal

    def replay(self, log_gz):
        """`mrstack replay` on the recorded log; returns its recommended text config or None."""
        a = self.args
        upstream = "cuda" if a.device == "cuda" else "simulated"
        cmd = [a.cli, "replay", log_gz, "--upstream", upstream, "--quiet"]
        print(f"== replay: {' '.join(cmd)}", flush=True)
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True,
                               timeout=max(1, min(a.replay_timeout, self.budget_left())))
        except subprocess.TimeoutExpired:
            self.check("replay: completes", False, f"killed after {time.monotonic() - t0:.0f} s")
            return None
        except OSError as e:
            self.check("replay: completes", False, f"{cmd[0]}: {e}")
            return None
        took = time.monotonic() - t0
        with open(os.path.join(a.out, "replay.txt"), "w") as f:
            f.write(p.stdout)
            f.write(p.stderr)
        print(p.stdout.rstrip())
        if p.stderr.strip():
            print(p.stderr.rstrip())
        self.results["replay"] = {"seconds": took, "rc": p.returncode, "command": cmd}
        if not self.check("replay: completes (exit status 0)", p.returncode == 0,
                          f"exit status {p.returncode}, {took:.1f} s"):
            return None
        lines = p.stdout.splitlines()
        marker = "as a text config (mrstack::config::build):"
        config = None
        for i, line in enumerate(lines):
            if line.strip() == marker and i + 1 < len(lines):
                config = lines[i + 1].strip()
        self.check("replay: recommends a stack, as a text config", bool(config), config or
                   f"no line after {marker!r}")
        self.results["replay"]["recommended"] = config
        return config

    def resnet_all(self):
        a = self.args
        rows = []  # (label, name, result)
        native = self.resnet("resnet50-native", "native")
        rows.append(("native", "resnet50-native", native))
        again = self.resnet("resnet50-native-again", "native")
        rows.append(("native (again: the control)", "resnet50-native-again", again))
        if a.device == "cuda":
            rows.append(("cudaMallocAsync", "resnet50-cudamallocasync",
                         self.resnet("resnet50-cudamallocasync", "cudaMallocAsync")))
        rows.append((f"mrstack {POOL}", "resnet50-mrstack-pool",
                     self.resnet("resnet50-mrstack-pool", "mrstack", POOL)))
        rows.append((f"mrstack {BINNING}", "resnet50-mrstack-binning",
                     self.resnet("resnet50-mrstack-binning", "mrstack", BINNING)))
        # The log comes from a run of its own, so that the rows above time no logging.
        raw_log = os.path.join(a.work, "resnet50-train.csv")
        logged = self.resnet("resnet50-mrstack-logged", "mrstack", a.log_stack, log=raw_log)
        rows.append((f"mrstack {a.log_stack} + MRSTACK_LOG", "resnet50-mrstack-logged", logged))

        # 4. The log replays.
        log_gz = os.path.join(a.out, "resnet50-train-mrstack.csv.gz")
        recommended = None
        if self.check("the logged run wrote its log", os.path.exists(raw_log)
                      and os.path.getsize(raw_log) > 0, raw_log):
            with open(raw_log, "rb") as src, gzip.open(log_gz, "wb", compresslevel=9) as dst:
                shutil.copyfileobj(src, dst)
            if os.path.getsize(log_gz) > 16 * MIB:
                print(f"note: {log_gz} is {os.path.getsize(log_gz) / MIB:.1f} MiB, over the 16 MiB "
                      f"the device tool brings back; run with fewer --steps to keep the trace")
            with open(raw_log) as f:
                header = f.readline().strip()
                counts = {"allocate": 0, "free": 0}
                for line in f:
                    action = line.split(",", 3)[2] if line.count(",") >= 5 else "?"
                    counts[action] = counts.get(action, 0) + 1
            self.results["log"] = {"path": log_gz, "bytes_gz": os.path.getsize(log_gz),
                                   "header": header, "actions": counts}
            self.check("the log is RMM's CSV",
                       header == "Thread,Time,Action,Pointer,Size,Stream" and counts["allocate"] > 0
                       and set(counts) <= {"allocate", "free", "allocate failure"},
                       f"{counts}, {os.path.getsize(log_gz) / MIB:.2f} MiB gzipped")
            # Every request of the run: the stack's own counts at exit (MRSTACK_REPORT, written
            # when the log was flushed the last time) against the log's lines.
            exit_report = os.path.join(a.details, "resnet50-mrstack-logged.exit-report.json")
            if os.path.exists(exit_report):
                with open(exit_report) as f:
                    s = json.load(f)["stacks"][0]
                self.check("the log holds every allocation and free the stack served",
                           counts["allocate"] == s["allocations"]
                           and counts["free"] == s["deallocations"]
                           and counts.get("allocate failure", 0) == s["failed_allocations"],
                           f"log: {counts['allocate']} allocations, {counts['free']} frees; stack "
                           f"at exit: {s['allocations']}, {s['deallocations']}")
            else:
                self.check("the log holds every allocation and free the stack served", False,
                           f"no {exit_report} (MRSTACK_REPORT at exit) to compare with")
            recommended = self.replay(log_gz)
        if a.recommended != "from-replay":
            recommended, source = a.recommended, "--recommended"
        elif recommended:
            source = "the replay's recommendation"
        else:
            recommended, source = FALLBACK_RECOMMENDED, "fallback: the replay gave none"
        print(f"recommended stack ({source}): {recommended}")
        rows.append((f"mrstack {recommended} ({source})", "resnet50-mrstack-recommended",
                     self.resnet("resnet50-mrstack-recommended", "mrstack", recommended)))

        # Losses: the control first, then every row against native.
        for label, name, result in rows[1:]:
            equal = self.compare_losses(label, result, native)
            if result is not None:
                result["_losses_equal"] = equal
        self.table(rows, native)

    def table(self, rows, native):
        def cell(v, fmt):
            return "n/a" if v is None else format(v, fmt)

        head = ["config", "median step ms", "ratio to native", "peak device MiB",
                "stack peak live MiB", "losses equal"]
        body = []
        base = (native or {}).get("median_step_ms")
        for label, _name, r in rows:
            r = r or {}
            ms = r.get("median_step_ms")
            stats = r.get("stack_after_training")
            if stats:
                live = cell(stats["peak_live_bytes"] / MIB, ".0f")
            elif r.get("max_memory_allocated") is not None:
                live = cell(r["max_memory_allocated"] / MIB, ".0f") + " *"
            else:
                live = "n/a"
            equal = r.get("_losses_equal")
            body.append([
                label, cell(ms, ".2f"),
                cell(ms / base if ms is not None and base else None, ".3f"),
                cell(r["peak_device_bytes"] / MIB if "peak_device_bytes" in r else None, ".0f"),
                live,
                "(reference)" if r is native else ("yes" if equal else "NO" if equal is False else "n/a"),
            ])
        widths = [max(len(x) for x in col) for col in zip(head, *body)]
        lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |",
                 "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in body]
        n = (native or {}).get("losses")
        gpu = (native or {}).get("gpu", "?")
        notes = [
            "",
            f"ResNet-50 training, batch {self.args.batch}, {self.args.warmup} warm-up + "
            f"{self.args.steps} timed steps ({len(n) if n else '?'} losses compared), on {gpu}; "
            f"torch {(native or {}).get('torch', '?')}, cuDNN {(native or {}).get('cudnn', '?')}.",
            "median step: forward + backward + SGD step, torch.cuda.synchronize() before and after; "
            "deterministic mode also fills every new tensor (fill_uninitialized_memory), in every row.",
            "peak device: the most of torch.cuda.mem_get_info() total - free, sampled after forward, "
            "after backward and after each step (the CUDA context and libraries included).",
            "stack peak live: the stack's peak_live_bytes (mrstack_statistics_json); "
            "* native rows: torch.cuda.max_memory_allocated() instead (the caching allocator's "
            "own count; a pluggable allocator has none).",
        ]
        text = "\n".join(lines + notes)
        self.table_text = text
        print()
        print(text)
        with open(os.path.join(self.args.out, "resnet50-table.md"), "w") as f:
            f.write(text + "\n")

    # -- 2. transformer -------------------------------------------------------------------------
    def transformer(self):
        a = self.args
        logits = os.path.join(a.work, "transformer-native.pt")
        argv = ["--device", a.device, "--batches", str(a.transformer_batches)]
        self.child("transformer-native", "transformer_infer.py",
                   ["--allocator", "native", "--save", logits, *argv], self.env())
        if not os.path.exists(logits):
            self.check("transformer: native logits to compare with", False, "the native run saved none")
            return
        self.child("transformer-mrstack", "transformer_infer.py",
                   ["--allocator", "mrstack", "--lib", a.lib, "--reference", logits, *argv],
                   self.env(MRSTACK_STACK=a.log_stack))
        os.remove(logits)

    # -- 3. CuPy --------------------------------------------------------------------------------
    def cupy(self):
        a = self.args
        exit_report = os.path.join(a.details, "cupy.exit-report.json")
        self.child("cupy", "cupy_check.py", ["--lib", a.lib],
                   self.env(MRSTACK_STACK=a.log_stack, MRSTACK_REPORT=exit_report))
        if os.path.exists(exit_report):
            with open(exit_report) as f:
                stacks = json.load(f).get("stacks", [])
            # Shown, not counted: what Python still held when the interpreter ended is up to it.
            for s in stacks:
                print(f"   at exit, device {s['device']}: {s['live_blocks']} live blocks, "
                      f"{s['live_bytes']} live bytes, {s['allocations']} allocations, "
                      f"{s['bad_frees']} bad frees")
        self.child("cupy-oom", "cupy_check.py", ["--lib", a.lib, "--oom"],
                   self.env(MRSTACK_STACK=a.log_stack))
        oom = self.results.get("cupy-oom") or {}
        if (oom.get("_rc") or 0) < 0:
            print(f"   cupy-oom died of signal {-oom['_rc']}: a C++ exception from the allocator "
                  f"aborts a CuPy whose CFunctionAllocator is not declared `except +` (CuPy "
                  f"{oom.get('cupy', '?')}; declared so since 14.x)")

    # -- 5. PyTorch out of memory ---------------------------------------------------------------
    def torch_oom(self):
        a = self.args
        self.child("torch-oom", "torch_oom.py", ["--lib", a.lib],
                   self.env(MRSTACK_STACK=a.log_stack))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", required=True, help="libmrstack_c.so")
    p.add_argument("--cli", required=True, help="the mrstack binary (for `mrstack replay`)")
    p.add_argument("--out", default=os.environ.get("OUT") or "/tmp/mrstack-clients")
    p.add_argument("--work", help="scratch for large files (default: a temporary folder)")
    p.add_argument("--steps", type=int, default=50, help="timed ResNet-50 steps")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--transformer-batches", type=int, default=40)
    p.add_argument("--log-stack", default=BINNING,
                   help="the stack of the logged run, the transformer, CuPy and the OOM checks")
    p.add_argument("--recommended", default="from-replay",
                   help="the third mrstack stack for ResNet-50 (default: what `mrstack replay` "
                   "recommends for the recorded log)")
    p.add_argument("--only", default="resnet,transformer,cupy,oom",
                   help="comma-separated parts to run (resnet includes the replay)")
    p.add_argument("--timeout", type=float, default=150, help="seconds per client process")
    p.add_argument("--replay-timeout", type=float, default=180)
    p.add_argument("--budget", type=float, default=520,
                   help="seconds for the whole run: past it no client starts (and each counts "
                   "as failed), to stay inside one 10-minute device call")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: try the PyTorch scripts without a GPU (not a proof of anything)")
    args = p.parse_args()
    args.lib = os.path.abspath(args.lib)
    args.cli = os.path.abspath(args.cli)
    # The device tool brings back at most 8 files of $OUT, 16 MiB each: the few that matter
    # stand at its top (console, summary, table, replay, trace; gpu-clients adds the first two),
    # and what each client wrote goes to details/, packed into details.tar.gz at the end.
    args.details = os.path.join(args.out, "details")
    os.makedirs(os.path.join(args.details, "logs"), exist_ok=True)
    made_work = args.work is None
    args.work = args.work or tempfile.mkdtemp(prefix="mrstack-clients-")
    os.makedirs(args.work, exist_ok=True)
    parts = set(args.only.split(","))
    unknown = parts - {"resnet", "transformer", "cupy", "oom"}
    if unknown:
        p.error(f"--only: unknown parts {sorted(unknown)}")

    run = Run(args)
    print(f"clients: library {args.lib}, CLI {args.cli}, output {args.out}, python {sys.version.split()[0]}")
    try:
        lib = mrstack_capi.load(args.lib)
        run.check("the library loads with every entry point the clients call", True,
                  ", ".join(mrstack_capi.ENTRY_POINTS[:4]))
        del lib
    except OSError as e:
        run.check("the library loads", False, str(e))
        parts = set()  # nothing can run without it
    except RuntimeError as e:
        run.check("the library has every entry point the clients call", False, str(e))
        parts = set()
    need = {"resnet": ["torch", "torchvision"], "transformer": ["torch"], "cupy": ["cupy", "numpy"],
            "oom": ["torch"]}
    for part in sorted(parts):
        missing = [m for m in need[part] if importlib.util.find_spec(m) is None]
        if missing:
            run.check(f"{part}: Python has {', '.join(need[part])}", False, f"missing {missing}")
            parts.discard(part)
    if "resnet" in parts:
        run.check("the mrstack CLI is there for the replay", os.access(args.cli, os.X_OK), args.cli)
    if args.device == "cpu":
        print("note: --device cpu: PyTorch runs on the CPU, where no CUDA allocator is called; the "
              "mrstack rows then fail their allocation checks; CuPy and the OOM checks need a GPU "
              "and do not run. A try of the scripts, not a proof.")
        parts -= {"cupy", "oom"}

    if "resnet" in parts:
        run.resnet_all()
    if "transformer" in parts:
        run.transformer()
    if "cupy" in parts:
        run.cupy()
    if "oom" in parts:
        run.torch_oom()

    summary = {"passed": run.passed, "failed": run.failed, "seconds": time.monotonic() - run.started,
               "results": run.results, "args": vars(args)}
    with open(os.path.join(args.out, "clients.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    if made_work:
        shutil.rmtree(args.work, ignore_errors=True)
    with tarfile.open(os.path.join(args.out, "details.tar.gz"), "w:gz") as tar:
        tar.add(args.details, arcname="details")
    shutil.rmtree(args.details, ignore_errors=True)
    # The table again, last, where a reader of the output's tail finds it.
    if run.table_text:
        print()
        print(run.table_text)
        rec = (run.results.get("replay") or {}).get("recommended")
        print(f"replay's recommendation for the recorded log: {rec}")
    print()
    if run.failed:
        print("failed:")
        for f in run.failed:
            print(f"  {f}")
    print(f"clients: {run.passed} passed, {len(run.failed)} failed")
    sys.exit(1 if run.failed else 0)


if __name__ == "__main__":
    main()
