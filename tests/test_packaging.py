"""What a remote worker receives: the package Beam builds from ``--setup_file ./setup.py``.

Beam's stager builds an sdist from the pipeline's ``setup.py`` in the
launching environment and installs it on every worker. These checks build it
the same way (through ``Stager.create_job_resources``, from a copy of the
repository's tracked files), install it where the repository is not on the
path, and run the console scripts and the jobs' sample inputs from there:
a job that reads ``examples/`` or imports a top-level ``pipelines`` would fail.
"""

from __future__ import annotations

import glob
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = ("beam-supertable", "beam-supertable-upsert", "beam-supertable-load",
           "beam-supertable-search", "beam-supertable-optimize", "beam-upsert-changes")

pytestmark = pytest.mark.slow


def tracked_copy(target: pathlib.Path) -> pathlib.Path:
    """The repository as a fresh clone has it (tracked and new files, nothing ignored)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                            cwd=ROOT, capture_output=True, check=True).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The sdist Beam's stager builds, the wheel pip builds from it, and a --target install."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.stager import Stager

    base = tmp_path_factory.mktemp("packaging")
    source = tracked_copy(base / "source")
    staged = base / "staged"
    staged.mkdir()
    Stager.create_job_resources(PipelineOptions(["--setup_file", str(source / "setup.py")]),
                                str(staged))
    [sdist] = glob.glob(str(staged / "*.tar.gz"))
    wheels = base / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(wheels), sdist], check=True)
    [wheel] = glob.glob(str(wheels / "*.whl"))
    target = base / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--target", str(target), wheel], check=True)
    return pathlib.Path(sdist), pathlib.Path(wheel), target


def test_the_staged_sdist_holds_the_packages_their_samples_and_the_build_files(built):
    sdist, _, _ = built
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for needed in ("setup.py", "pyproject.toml", "README.md", "LICENSE",
                   "beam_upsert/__init__.py", "beam_supertable/__init__.py",
                   "beam_supertable/jobs/samples/commands.jsonl",
                   "beam_supertable/jobs/samples/chunks.jsonl",
                   "beam_supertable/yaml/providers.yaml"):
        assert needed in names, needed
    assert not {n for n in names if n.split("/")[0] in ("pipelines", "tests", "examples",
                                                        "benchmarks", "flink")}


def test_the_wheel_installs_only_the_two_packages_and_the_console_scripts(built):
    _, wheel, _ = built
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top_level == {"beam_upsert", "beam_supertable"}
    assert "beam_supertable/jobs/samples/commands.jsonl" in names
    assert "beam_supertable/yaml/providers.yaml" in names   # Beam YAML's include: target
    for folder in sorted(p.parent.name for p in ROOT.glob("beam_supertable/*/__init__.py")):
        assert f"beam_supertable/{folder}/__init__.py" in names, folder
    for script in SCRIPTS:
        assert f"{script} = " in scripts, script


def installed(target: pathlib.Path, *argv: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    """Runs a console script of the --target install, with only that install on the path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    script = target / "bin" / argv[0]
    return subprocess.run([sys.executable, str(script), *argv[1:]], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_every_console_script_answers_help_and_version_from_the_installed_package(built,
                                                                                  tmp_path):
    _, _, target = built
    from beam_supertable import __version__
    for script in SCRIPTS:
        done = installed(target, script, "--help", cwd=tmp_path)
        assert done.returncode == 0, (script, done.stderr)
        assert done.stdout.startswith(f"usage: {script} "), (script, done.stdout)
        assert done.stderr == "", (script, done.stderr)
        version = installed(target, script, "--version", cwd=tmp_path)
        assert version.returncode == 0, (script, version.stderr)
        assert version.stdout.startswith(f"{script} (beam-upsert-supertable {__version__})")


def test_the_installed_jobs_run_on_their_packaged_samples_outside_the_repository(built, tmp_path):
    _, _, target = built
    where = subprocess.run([sys.executable, "-c", "import beam_supertable; "
                            "print(beam_supertable.__file__)"], cwd=tmp_path, capture_output=True,
                           text=True, check=True,
                           env={**os.environ, "PYTHONPATH": str(target)}).stdout.strip()
    assert where.startswith(str(target)), where

    upsert = installed(target, "beam-supertable-upsert", cwd=tmp_path)
    assert upsert.returncode == 0, upsert.stderr
    assert "inserts=48 updates=76 deletes=13 dropped=0 invalid=7" in upsert.stdout
    load = installed(target, "beam-supertable-load", cwd=tmp_path)
    assert load.returncode == 0 and " -> out/chunks" in load.stdout, load.stderr
    search = installed(target, "beam-supertable-search", cwd=tmp_path)
    assert search.returncode == 0, search.stderr
    assert (tmp_path / "out").exists()
    changes = installed(target, "beam-upsert-changes", cwd=tmp_path)
    assert changes.returncode == 0, changes.stderr
    optimize = installed(target, "beam-supertable-optimize", "--table", "out/chunks", cwd=tmp_path)
    assert optimize.returncode == 0, optimize.stderr
    inspect = installed(target, "beam-supertable", "inspect", "--table", "out/sensors",
                        cwd=tmp_path)
    assert inspect.returncode == 0 and "rows" in inspect.stdout, inspect.stderr
    assert not (tmp_path / "examples").exists()


def test_the_setup_file_names_the_setuptools_it_needs_when_the_environment_is_older(tmp_path):
    """An old setuptools cannot read pyproject.toml's license: one line naming the fix.

    A new virtualenv gets the setuptools its Python bundles (65.5 on 3.11),
    the situation of a user who launches from a fresh environment.
    """
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    old = subprocess.run([str(python), "-c", "import setuptools; print(setuptools.__version__)"],
                         capture_output=True, text=True)
    if old.returncode != 0 or int(old.stdout.split(".")[0]) >= 77:
        pytest.skip("this Python's bundled setuptools is new enough (or absent)")
    done = subprocess.run([str(python), "setup.py", "sdist"], cwd=tracked_copy(tmp_path / "src"),
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "setup.py: building beam-upsert-supertable needs setuptools>=77, and this environment "
        f"has {old.stdout.strip()}; run: pip install 'setuptools>=77'"]
