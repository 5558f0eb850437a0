"""Builds the Rust parts of the package with cargo and puts them in ``mrstack/_bin/``:
``libmrstack_c.so`` (the C library, crate ``mrstack-capi``) and ``mrstack`` (the command,
crate ``mrstack-cli``), from the repository this folder is in.

``MRSTACK_CARGO_PROFILE`` picks cargo's profile (default ``release``; ``dev`` reuses a debug
build, for tests); ``CARGO_TARGET_DIR`` is honoured; ``CARGO`` names the cargo to run.
The wheel is tagged ``py3-none-<platform>``: the package is plain Python over the library,
for any Python 3 on the platform it was built on.
"""

import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools older than 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ARTIFACTS = ("libmrstack_c.so", "mrstack")


def cargo_build():
    """Builds the library and the command; their paths."""
    if not os.path.isfile(os.path.join(ROOT, "capi", "Cargo.toml")):
        sys.exit(f"mrstack: {ROOT} is not the mrstack repository (no capi/Cargo.toml): the "
                 "package builds from a checkout of it (pip install python/)")
    profile = os.environ.get("MRSTACK_CARGO_PROFILE", "release")
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    cargo = os.environ.get("CARGO", "cargo")
    env = dict(os.environ)
    if profile == "release":
        # No debug info in the shipped files (the workspace's release profile keeps some).
        env.setdefault("CARGO_PROFILE_RELEASE_DEBUG", "0")
    cmd = [cargo, "build", "--profile", profile, "-p", "mrstack-capi", "-p", "mrstack-cli"]
    print("mrstack:", " ".join(cmd), flush=True)
    subprocess.check_call(cmd, cwd=ROOT, env=env)
    out = os.path.join(target, "debug" if profile == "dev" else profile)
    paths = [os.path.join(out, name) for name in ARTIFACTS]
    for p in paths:
        if not os.path.isfile(p):
            sys.exit(f"mrstack: cargo built no {p}")
    return paths


class BuildWithRust(build_py):
    """``build_py`` that first builds the Rust parts into the package's ``_bin/``."""

    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "mrstack", "_bin")
        os.makedirs(dest, exist_ok=True)
        for p in cargo_build():
            target = os.path.join(dest, os.path.basename(p))
            shutil.copy2(p, target)
            os.chmod(target, 0o755)


class PlatformWheel(bdist_wheel):
    """A wheel for any Python 3 on this platform (``py3-none-linux_x86_64``)."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(cmdclass={"build_py": BuildWithRust, "bdist_wheel": PlatformWheel})
