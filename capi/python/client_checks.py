"""What every client script shares: named checks that print as they go and end up in the
script's JSON result, which the driver (clients.py) reads and counts.

A script builds one `Checks`, records checks and data on it, and ends with `finish()`, which
writes the JSON and exits non-zero if any check failed. An exception escaping the script leaves
no JSON (or a partial one, see `save`): the driver counts that as a failure and shows the
script's log.
"""

import json
import math
import os
import sys
import traceback

MIB = 1 << 20


class Checks:
    def __init__(self, name, out_path):
        self.name = name
        self.out_path = out_path
        self.data = {"script": name, "checks": [], "complete": False}

    def check(self, what, ok, detail=""):
        ok = bool(ok)
        self.data["checks"].append({"check": what, "ok": ok, "detail": str(detail)})
        print(f"{'ok' if ok else 'FAILED'}: {self.name}: {what}" + (f" ({detail})" if detail else ""),
              flush=True)
        return ok

    def put(self, key, value):
        self.data[key] = value

    def raises(self, what, allocate, describe):
        """Calls `allocate`, which must raise: returns the exception it raised, or fails the check
        `what` (`describe(result)` says what came back instead, which is then let go) and
        returns None."""
        try:
            got = allocate()
        except Exception as e:  # noqa: BLE001 - which exception is what is checked
            return e
        self.check(what, False, f"got {describe(got)} instead")
        return None

    def put_allocator(self, allocator):
        """Records the allocator a client runs with, and the stack mrstack's reads from the
        environment."""
        self.put("allocator", allocator)
        self.put("stack", os.environ.get("MRSTACK_STACK") if allocator == "mrstack" else None)

    def save(self):
        # Written as the script goes, so a crash later still leaves what was measured.
        tmp = self.out_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, allow_nan=True)
        os.replace(tmp, self.out_path)

    def failed(self):
        return [c for c in self.data["checks"] if not c["ok"]]

    def finish(self):
        self.data["complete"] = True
        self.save()
        bad = self.failed()
        print(f"{self.name}: {len(self.data['checks']) - len(bad)} passed, {len(bad)} failed",
              flush=True)
        sys.exit(1 if bad else 0)

    def run(self, body):
        """Runs `body(self)`; an exception is a failed check (with its traceback), then finish."""
        try:
            body(self)
        except SystemExit:
            raise
        except BaseException as e:  # noqa: BLE001 - anything at all is a failure to report
            traceback.print_exc()
            self.check("ran to the end without an exception", False, f"{type(e).__name__}: {e}")
        self.finish()


def finite(values):
    return all(math.isfinite(v) for v in values)


def median(values):
    s = sorted(values)
    n = len(s)
    if n == 0:
        return float("nan")
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
