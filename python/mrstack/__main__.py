"""``python -m mrstack``: the replay, and a stack's description and counts, from a shell.

    python -m mrstack replay FILE [OPTIONS]   replay an RMM log, MRSTACK_LOG or PyTorch
                                              snapshot (the mrstack command's options)
    python -m mrstack describe [STACK]        a stack text's description (default: device 0's)
    python -m mrstack stats [DEVICE]          a device's stack counts, as JSON
    python -m mrstack check STACK             check a stack text (exit 1 naming the column)
    python -m mrstack paths                   the library and command this package uses
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import List, Optional

import mrstack


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(__doc__.strip())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    try:
        if command == "replay":
            # The command itself: its options, its report, its progress and exit status.
            return subprocess.call([mrstack.cli_path(), "replay", *rest])
        if command == "describe":
            target: object = rest[0] if rest else 0
            if isinstance(target, str) and target.isdigit():
                target = int(target)
            print(mrstack.describe(target))  # type: ignore[arg-type]
            return 0
        if command == "stats":
            print(json.dumps(mrstack.stats(int(rest[0]) if rest else 0), indent=2))
            return 0
        if command == "check":
            if len(rest) != 1:
                print("usage: python -m mrstack check STACK", file=sys.stderr)
                return 2
            mrstack.check(rest[0])
            print("ok")
            return 0
        if command == "paths":
            for name, find in (("library", mrstack.lib_path), ("command", mrstack.cli_path)):
                try:
                    print(f"{name}: {find()}")
                except RuntimeError as e:
                    print(f"{name}: {e}")
            return 0
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"error: unknown command {command!r}\n\n{__doc__.strip()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    # Exit quietly when the reader closes the pipe (`| head`).
    try:
        sys.exit(main())
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
