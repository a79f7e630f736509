"""The wheel installs one top-level package, ``failslow``, so it sits beside any training
repository: one with its own ``models/`` and ``schema/`` imports both its own and ours.

The wheel is built from this checkout and installed (not editable) into a fresh virtual
environment; its dependencies come from the project's environment through a ``.pth``
line, so nothing is downloaded.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("schema", "models", "storage", "collectors", "alerting", "simulator", "streams")

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(ROOT)],
        check=True, capture_output=True, cwd=build, timeout=300)
    (found,) = out.glob("failslow-*.whl")
    return found


def test_the_wheel_holds_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"failslow"}
    for part in PARTS:
        assert f"failslow/{part}/__init__.py" in names


def test_a_training_repo_with_its_own_models_and_schema_imports_both(
        wheel: Path, tmp_path: Path) -> None:
    env = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=120)
    site = subprocess.run(
        [str(env / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip()
    # the dependencies, from the project's environment (its editable failslow is a .pth
    # hook that a plain path line does not run)
    (Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True, timeout=300)
    repo = tmp_path / "trainer"
    for own in ("models", "schema"):
        (repo / own).mkdir(parents=True)
        (repo / own / "__init__.py").write_text(f"WHOSE = 'the trainer {own}'\n")
    script = (
        "import models, schema\n"
        "import failslow.collectors.torch_hook as hook\n"
        "import failslow.models.job, failslow.schema.events\n"
        "print(models.WHOSE, '|', schema.WHOSE, '|', hook.__file__)\n")
    run = subprocess.run([str(env / "bin" / "python"), "-c", script], cwd=repo,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    mine_models, mine_schema, hook_file = (s.strip() for s in run.stdout.split("|"))
    assert (mine_models, mine_schema) == ("the trainer models", "the trainer schema")
    assert Path(hook_file).is_relative_to(site), hook_file
    cli = subprocess.run([str(env / "bin" / "failslow"), "--help"], cwd=repo,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and "detect" in cli.stdout, cli.stderr
