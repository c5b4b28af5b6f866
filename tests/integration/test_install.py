"""pip install -e . and pip install . both give a twistd that knows nsqtw, nsqtw-lookupd and nsqtw-admin.

Each case installs a copy of the checkout (so the checkout gets no build
files) into a fresh virtual environment that sees the already installed
dependencies, without network, then runs twistd from an unrelated directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TWISTD = "import sys; from twisted.scripts.twistd import run; sys.argv[0] = 'twistd'; run()"


def _copy_checkout(dest: Path) -> Path:
    """The files git tracks (plus untracked, unignored ones), as a fresh project directory."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = ROOT / name
        if src.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dest


@pytest.mark.parametrize(("editable", "compiler"), [(True, True), (False, True), (False, False)],
                         ids=["editable", "regular", "no-compiler"])
def test_twistd_finds_the_plugins(tmp_path: Path, editable: bool, compiler: bool) -> None:
    """After the install, ``twistd nsqtw|nsqtw-lookupd|nsqtw-admin --help`` and ``nsqtw tail -h`` answer,
    and the admin's pages ship. The compiled speed-ups are built with the package where a C
    compiler works; where it fails (``CC=false``) the install still succeeds without them."""
    if not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to copy")
    project = _copy_checkout(tmp_path / "project")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NSQTW_NO_SPEEDUPS")}
    if not compiler:
        env["CC"] = "false"
    install = [python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    install += ["-e", str(project)] if editable else [str(project)]
    done = subprocess.run(install, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    built = sorted(p.name for p in (project if editable else venv).rglob("_nsqtw_speedups*.so"))
    if compiler and shutil.which("cc"):
        assert built, done.stdout + done.stderr
        where = subprocess.run(
            [python, "-c", "import _nsqtw_speedups as s; from nsqtw.core import message as m; "
                           "print(m.SPEEDUPS, s.__file__)"],
            env=env, cwd=elsewhere, capture_output=True, text=True, check=True).stdout
        assert where.startswith(f"True {project if editable else venv}"), where
    elif not compiler:
        assert built == [], built
    for plugin, first_line in (("nsqtw", "Usage: twistd nsqtw [flags]"),
                               ("nsqtw-lookupd", "Usage: twistd nsqtw-lookupd [flags]"),
                               ("nsqtw-admin", "Usage: twistd nsqtw-admin [flags]")):
        out = subprocess.run([python, "-c", TWISTD, plugin, "--help"], env=env, cwd=elsewhere,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.splitlines()[0] == first_line, out.stdout
        # the plugin really comes from this install, not from the checkout under test
        where = subprocess.run([python, "-c", "import nsqtw; print(nsqtw.__file__)"], env=env,
                               cwd=elsewhere, capture_output=True, text=True, check=True).stdout
        assert where.startswith(str(project if editable else venv)), where
    # the pages' assets are package data: a regular install has them too
    assets = subprocess.run(
        [python, "-c", "from importlib import resources; print(sorted(p.name for p in "
                       "resources.files('nsqtw.admin').joinpath('static').iterdir()))"],
        env=env, cwd=elsewhere, capture_output=True, text=True, check=True).stdout
    for name in ("admin.css", "admin.js", "favicon.svg", "index.html"):
        assert name in assets, assets
    # the nsqtw console script (docs/tools.md) is installed with its subcommands
    out = subprocess.run([str(venv / "bin" / "nsqtw"), "tail", "-h"], env=env, cwd=elsewhere,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stderr.startswith("Usage of nsqtw tail:\n"), out.stderr


def test_setup_cfg_lists_every_package() -> None:
    """Every package under nsqtw/ is in setup.cfg's explicit list (a regular install needs it)."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    found = {".".join(p.relative_to(ROOT).parts[:-1]) for p in (ROOT / "nsqtw").rglob("__init__.py")}
    assert found - listed == set()
    assert "twisted.plugins" in listed
