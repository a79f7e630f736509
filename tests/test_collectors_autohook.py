"""The no-code hook's rules: job and run ids, per-run files, `failslow run` around jobs
it cannot instrument, and the edge cases of one-rank torch jobs (several optimizers,
the `failslow.step()` marker, a DDP comm hook of the job's own, a rerun into the same
files). The 4-rank jobs that must name a slow rank are in test_collectors_autohook_jobs.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from failslow.collectors.file_publisher import FilePublisher
from failslow.collectors.runs import default_job_id, trace_path
from failslow.commands.run import PTH, boot_dir, install_hook
from failslow.stack import free_port

ROOT = Path(__file__).resolve().parent.parent
FAILSLOW = [sys.executable, "-m", "failslow.cli"]
WORLD1 = ROOT / "tests" / "instrument_jobs" / "world1.py"


def test_job_id_comes_from_failslow_then_the_scheduler_then_torchrun_then_the_script():
    env = {"FAILSLOW_JOB_ID": "mine", "SLURM_JOB_ID": "77", "TORCHELASTIC_RUN_ID": "rdzv"}
    assert default_job_id(env, ["train.py"]) == "mine"
    del env["FAILSLOW_JOB_ID"]
    assert default_job_id(env, ["train.py"]) == "77"
    del env["SLURM_JOB_ID"]
    assert default_job_id(env, ["train.py"]) == "rdzv"
    # torchrun --standalone makes up a UUID, its default is "none": neither names a job
    for made_up in ("none", "0b4e7a0e-5d1c-4d2a-8c7e-2f3b1a9c6d4e"):
        assert default_job_id({"TORCHELASTIC_RUN_ID": made_up},
                              ["torchrun", "--nproc-per-node", "8", "/src/pretrain.py"]) == "pretrain"


def test_each_run_has_its_own_folder_and_a_safe_path():
    a, b = trace_path("t", "job/../x y", "r1", 3), trace_path("t", "job/../x y", "r2", 3)
    assert a.parent != b.parent and a.name == b.name == "rank3.jsonl"
    assert a.parts[:2] == ("t", "job_.._x_y")  # one folder, not a way out of the trace dir


def test_file_publisher_refuses_to_append_to_an_earlier_run(tmp_path):
    path = tmp_path / "rank0.jsonl"
    first = FilePublisher(path)
    first.publish([{"v": 1, "kind": "host", "ts": 1.0, "host": "h0"}])
    first.close()
    with pytest.raises(FileExistsError, match="earlier run"):
        FilePublisher(path)
    again = FilePublisher(path, append=True)
    again.publish([{"v": 1, "kind": "host", "ts": 2.0, "host": "h0"}])
    again.close()
    assert [orjson.loads(line)["ts"] for line in path.read_bytes().splitlines()] == [1.0, 2.0]


def run_cli(args: list[str], env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([*FAILSLOW, *args], env=full, cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_run_leaves_a_job_it_cannot_trace_alone_and_says_so(tmp_path):
    # a sitecustomize of the site's own, which failslow's start-up file shadows
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['SITE_RAN'] = 'yes'\n")
    code = ("import os, sys; print('torch' in sys.modules, os.environ.get('SITE_RAN'), "
            "os.environ['FAILSLOW_JOB_ID']); sys.exit(3)")
    p = run_cli(["run", "--trace-dir", str(tmp_path / "t"), "--", sys.executable, "-c", code],
                env={"PYTHONPATH": f"{ROOT}{os.pathsep}{site}"})
    assert p.returncode == 3, p.stderr  # the job's own status
    # nothing heavy imported at start-up, the shadowed sitecustomize ran, the id defaulted
    assert p.stdout.split() == ["False", "yes", Path(sys.executable).stem]
    assert "no rank wrote a trace" in p.stderr
    assert not list((tmp_path / "t").rglob("*.jsonl"))


def test_a_rank_that_never_starts_torch_distributed_says_why(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed (pip install failslow[torch])")
    p = run_cli(["run", "--trace-dir", str(tmp_path), "--job-id", "j", "--", sys.executable,
                 "-c", "import torch; print(torch.ones(2).sum().item())"], env={"RANK": "0"})
    assert p.returncode == 0 and p.stdout.strip() == "2.0", p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("failslow:")]
    assert "not instrumented: torch.distributed.init_process_group was never called" in lines[0]


def test_run_without_a_command_is_a_one_line_error():
    p = run_cli(["run", "--job-id", "j"])
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0
    assert "no command to run" in p.stderr


def test_install_hook_writes_a_pth_that_site_runs_and_uninstall_removes_it(tmp_path):
    path = install_hook(str(tmp_path))
    assert path.read_text() == PTH and PTH.startswith("import ") and PTH.count("\n") == 1
    install_hook(str(tmp_path), remove=True)
    assert not path.exists()


def world1(tmp_path: Path, mode: str, run_id: str = "r1") -> tuple[
        subprocess.CompletedProcess, list[dict]]:
    pytest.importorskip("torch", reason="torch is not installed (pip install failslow[torch])")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FAILSLOW_TRACE_DIR": str(tmp_path),
           "FAILSLOW_JOB_ID": "w1", "FAILSLOW_RUN_ID": run_id, "MASTER_PORT": str(free_port())}
    boot = tmp_path / "boot"
    boot.mkdir(exist_ok=True)
    env["PYTHONPATH"] = f"{boot_dir(boot)}{os.pathsep}{ROOT}"
    p = subprocess.run([sys.executable, str(WORLD1), mode], env=env, capture_output=True,
                       text=True, timeout=120)
    path = trace_path(tmp_path, "w1", run_id, 0)
    events = [orjson.loads(line) for line in path.read_bytes().splitlines()] \
        if path.exists() else []
    return p, events


def steps(events: list[dict]) -> list[int]:
    return [e["step"] for e in events if e["kind"] == "step"]


def test_only_the_first_optimizer_marks_steps(tmp_path):
    p, events = world1(tmp_path, "optimizers")
    assert p.returncode == 0, p.stderr
    # 6 iterations: a step runs from one step() of the first optimizer to its next (5
    # such, 11 if the second counted too); the one begun at the sixth is still open at
    # the end and dropped (it would hold the teardown)
    assert steps(events) == [0, 1, 2, 3, 4]


def test_the_marker_replaces_the_optimizer(tmp_path):
    p, events = world1(tmp_path, "marker")
    assert p.returncode == 0, p.stderr
    assert steps(events) == [0, 1, 2]
    reduces = [e for e in events if e["kind"] == "comm" and e["step"] in (0, 1, 2)]
    assert sum(o["n"] for r in reduces for o in r["ops"] if o["op"] == "allreduce") == 3


def test_a_comm_hook_of_the_jobs_own_still_runs(tmp_path):
    p, events = world1(tmp_path, "user_comm_hook")
    assert p.returncode == 0, p.stderr
    assert "user hook calls: 3" in p.stdout
    assert steps(events) == [0, 1]


def test_a_rerun_into_the_same_files_is_refused_and_the_job_runs_on(tmp_path):
    first, events = world1(tmp_path, "optimizers", run_id="same")
    again, events_after = world1(tmp_path, "optimizers", run_id="same")
    assert first.returncode == again.returncode == 0, again.stderr
    assert events_after == events  # the earlier run's trace is untouched
    said = [ln for ln in again.stderr.splitlines() if ln.startswith("failslow:")]
    assert len(said) == 1 and "not instrumenting this rank: FileExistsError" in said[0]


LIGHTNING_ALONE = """
import lightning as L, torch
from failslow.collectors.lightning import FailslowCallback

class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        return self.lin(batch[0]).sum()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = torch.utils.data.TensorDataset(torch.randn(8, 4))
L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
          enable_progress_bar=False, enable_model_summary=False,
          callbacks=[FailslowCallback(TRACES)]).fit(Net(), torch.utils.data.DataLoader(data))
print("trained")
"""


def test_a_single_process_trainer_trains_and_the_callback_says_why_it_traces_nothing(tmp_path):
    pytest.importorskip("lightning", reason="lightning is not installed (failslow[lightning])")
    code = f"TRACES = {str(tmp_path)!r}\n" + LIGHTNING_ALONE
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0 and p.stdout.strip().endswith("trained"), p.stderr[-2000:]
    said = [ln for ln in p.stderr.splitlines() if ln.startswith("failslow:")]
    assert said == ["failslow: not instrumenting: torch.distributed is not initialized "
                    "(a single-process run)"]
    assert not list(tmp_path.rglob("*.jsonl"))
