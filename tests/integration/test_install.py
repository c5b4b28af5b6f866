"""The package as users get it: ``python -m build``'s sdist and wheel, and ``pip install -e .``.

The checkout is copied (so it gets no build files) and built once with
``python -m build``, which makes the wheel from the sdist: a file the sdist
lacked would be missing from the wheel too. Each case installs into a fresh
virtual environment without network and runs the three daemons and the
``nsqtw`` command from an unrelated directory. The new environment's own
site-packages come first; the dependencies come from the environment
running the tests (``sys.prefix``'s site-packages, a venv's when run from
one), never from the base interpreter's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from collections.abc import Iterable
from pathlib import Path

import pytest

from nsqtw import speedups
from tests.daemon import AdminDaemon, Daemon, LookupdDaemon

ROOT = Path(__file__).resolve().parents[2]
#: the builds here run without build isolation: the compiled speed-ups need mypyc from this environment
CAN_COMPILE = bool(shutil.which("cc")) and importlib.util.find_spec("mypyc") is not None


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


def running_site_packages() -> list[str]:
    """The site-packages of the environment running the tests (a venv's own when run from one)."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def make_venv(dest: Path) -> Path:
    """A fresh virtual environment that also sees the running environment's packages; its python.

    ``--system-site-packages`` would show the *base* interpreter's packages,
    which lack the test dependencies when the suite runs from a venv. A
    ``.pth`` file named to be read last appends the running environment's
    site-packages instead, after the new environment's own, so what is
    installed into it wins; pip comes from there too (``--without-pip``).
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    python = dest / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "zz-running-environment.pth").write_text("\n".join(running_site_packages()) + "\n")
    return python


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NSQTW_NO_SPEEDUPS")}


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``python -m build`` of a copy of the checkout, once: {"sdist": path, "wheel": path}."""
    if not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to copy")
    top = tmp_path_factory.mktemp("build")
    project = _copy_checkout(top / "project")
    out = top / "dist"
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(project)],
                          cwd=top, env=clean_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (sdist,) = out.glob("nsqtw-*.tar.gz")
    (wheel,) = out.glob("nsqtw-*.whl")
    return {"sdist": sdist, "wheel": wheel, "project": project}


def _package_files() -> set[str]:
    """What the package is made of: git's files under nsqtw/ and twisted/plugins/ (no tests, no docs)."""
    listed = subprocess.run(["git", "ls-files", "nsqtw", "twisted"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.split()
    return set(listed)


def test_sdist_and_wheel_carry_the_package(dists: dict[str, Path]) -> None:
    """The sdist holds every file of the package and what building needs; the wheel every file
    that runs (the admin's pages, the twistd plugins, py.typed) and, where a C compiler works,
    the compiled speed-ups (the mypyc build of nsqtw.speedups.MODULES)."""
    with tarfile.open(dists["sdist"]) as tar:
        top = tar.getnames()[0].split("/")[0]
        in_sdist = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    missing = (_package_files() | {"setup.py", "setup.cfg", "pyproject.toml", "README.md"}) - in_sdist
    assert missing == set(), f"{top} lacks {sorted(missing)}"
    with zipfile.ZipFile(dists["wheel"]) as whl:
        in_wheel = set(whl.namelist())
    runs = {n for n in _package_files() if not n.endswith(".c")}
    assert runs - in_wheel == set(), sorted(runs - in_wheel)
    if CAN_COMPILE:
        assert _compiled(in_wheel) == _COMPILED, sorted(in_wheel)


#: the files of the mypyc build (nsqtw/speedups.py): its shared library and one module per compiled .py
_COMPILED = {speedups.GROUP} | set(speedups.MODULES)


def _compiled(names: Iterable[str]) -> set[str]:
    """Which parts of the mypyc build are among these paths (relative to site-packages or the checkout)."""
    found = set()
    for name in names:
        stem, dot, rest = name.partition(".")
        if dot and rest.endswith(".so"):
            found.add(stem.replace("/", "."))
    return found & _COMPILED


def _ping(daemon: Daemon) -> str:
    with urllib.request.urlopen(f"http://{daemon.http_address}/ping", timeout=30) as resp:
        return resp.read().decode()


@pytest.mark.parametrize("how", ["editable", "wheel", "sdist-no-compiler"])
def test_installed_package_runs(tmp_path: Path, dists: dict[str, Path], how: str) -> None:
    """After the install, ``twistd -n nsqtw``, ``nsqtw-lookupd`` and ``nsqtw-admin`` start and answer
    /ping, the package and its plugins come from this install, and the ``nsqtw`` command works. The
    compiled speed-ups come with the wheel where a C compiler works and are in use; the sdist
    installed where the compiler fails (``CC=false``) installs without them and runs the same
    modules from their ``.py`` files."""
    python = make_venv(tmp_path / "venv")
    venv = tmp_path / "venv"
    env = clean_env()
    if how == "sdist-no-compiler":
        env["CC"] = "false"
    project = dists["project"]
    target = {"editable": ["-e", str(project)], "wheel": [str(dists["wheel"])],
              "sdist-no-compiler": [str(dists["sdist"])]}[how]
    # --ignore-installed: the nsqtw the running environment may hold (a venv made by the README's
    # command) must not count as already installed
    install = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", "--no-build-isolation",
               "--no-index"]
    done = subprocess.run(install + target, env=env, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    home = project if how == "editable" else venv
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = json.loads(subprocess.run(
        [str(python), "-c", "import json, nsqtw; from nsqtw import speedups; from nsqtw.core import message as m; "
                            "print(json.dumps([nsqtw.__file__, m.__file__, speedups.IN_USE, speedups.NOTE]))"],
        env=env, cwd=elsewhere, capture_output=True, text=True, check=True).stdout)
    assert where[0].startswith(str(home)) and where[1].startswith(str(home)), where
    built = _compiled(str(p.relative_to(home)).split("site-packages/")[-1] for p in home.rglob("*.so"))
    if how == "sdist-no-compiler":
        # installed, and as plain Python: the same modules from their .py files
        assert (built, where[1].endswith(".py"), where[2]) == (set(), True, False), where
        assert "not built" in where[3], where
    elif CAN_COMPILE:
        assert (built, where[2]) == (_COMPILED, True), where + [done.stdout, done.stderr]
        assert not where[1].endswith(".py") and where[3].startswith("compiled speed-ups: in use"), where
    # the three daemons, as twistd runs them, answer /ping
    daemons: list[Daemon] = []
    try:
        for kind in (Daemon, LookupdDaemon, AdminDaemon):
            installed = type("Installed" + kind.__name__, (kind,), {"python": str(python), "checkout": False})
            data = tmp_path / kind.plugin
            data.mkdir()
            args = [f"--lookupd-http-address={daemons[1].http_address}"] if kind is AdminDaemon else []
            daemons.append(installed(str(data), *args, env=env).start(timeout=120))
            assert _ping(daemons[-1]) == "OK", daemons[-1].read_output()
    finally:
        codes = [d.stop() for d in daemons]
    for d, code in zip(daemons, codes, strict=True):
        assert code == 0 and "Traceback" not in d.read_output(), d.read_output()
    # the nsqtw console script (docs/tools.md) is installed with its subcommands
    nsqtw = str(venv / "bin" / "nsqtw")
    out = subprocess.run([nsqtw, "--help"], env=env, cwd=elsewhere, capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stdout.splitlines()[0]) == (0, "usage: nsqtw <command> [flags]"), out
    out = subprocess.run([nsqtw, "tail", "-h"], env=env, cwd=elsewhere, capture_output=True, text=True, timeout=120)
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
