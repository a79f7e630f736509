"""`failslow run [--trace-dir DIR] [--job-id ID] -- COMMAND...` — trace a job, no code.

Runs COMMAND (``torchrun ... train.py``, ``python train.py``, a shell script) with a
start-up file on ``PYTHONPATH`` that arms the training hook in every Python process it
starts (``collectors.autohook``), and ``FAILSLOW_TRACE_DIR`` / ``FAILSLOW_JOB_ID`` /
``FAILSLOW_RUN_ID`` set, so all ranks write one run's folder:
``DIR/<job id>/<run id>/rank<N>.jsonl``. Ends with that folder and the ``failslow
detect`` line to run on it, and exits with COMMAND's exit status. SIGTERM is passed on
to COMMAND.

The start-up file is a ``sitecustomize`` module; one already on the path (a
distribution's, a site's) still runs, after it.

``failslow run --install-hook`` arms every Python of this environment instead, for
good: a ``failslow-hook.pth`` file in its site-packages (``--site-dir``) runs the same
start-up at each interpreter start, so ``FAILSLOW_TRACE_DIR=DIR torchrun ...`` traces a
job with no launcher; without that variable it costs a dictionary look-up.
``--uninstall-hook`` removes it. The ranks then agree on a run id through
torch.distributed's store.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from failslow.collectors.runs import (
    ENV_JOB_ID,
    ENV_RUN_ID,
    ENV_TRACE_DIR,
    default_job_id,
    new_run_id,
    run_dir,
)
from failslow.errors import FailslowError

HELP = "run a training command with the hook in every rank, no code change; traces to files"

# Python runs the first ``sitecustomize`` on sys.path and no other: this one arms the
# hook, then finds and runs the one it shadows.
SITECUSTOMIZE = '''\
"""failslow's start-up file, put on PYTHONPATH by `failslow run`."""


def _failslow_boot():
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    if os.environ.get("FAILSLOW_TRACE_DIR"):
        try:
            from failslow.collectors.autohook import boot

            boot()
        except Exception as exc:
            print(f"failslow: not instrumenting: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        try:
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        except Exception as exc:
            print(f"Error in sitecustomize ({spec.origin}): {exc}", file=sys.stderr)


_failslow_boot()
'''


PTH_NAME = "failslow-hook.pth"
# site runs a .pth line that starts with "import"; the rest of the line must stay on it
PTH = ('import os; exec("try:\\n from failslow.collectors.autohook import boot\\n boot()\\n'
       'except Exception as exc:\\n import sys\\n print(\\"failslow: not instrumenting:\\", '
       'exc, file=sys.stderr)") if os.environ.get("FAILSLOW_TRACE_DIR") else None\n')


class RunError(FailslowError):
    """The command cannot be started."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace-dir", metavar="DIR",
                        help=f"root of the traces [{ENV_TRACE_DIR}, ./failslow-traces]")
    parser.add_argument("--job-id", metavar="ID",
                        help=f"the job's id in the events [{ENV_JOB_ID}, SLURM_JOB_ID, "
                             "the training script's name]")
    parser.add_argument("--install-hook", action="store_true",
                        help=f"arm every Python of this environment when {ENV_TRACE_DIR} is "
                             f"set (writes {PTH_NAME} into site-packages), then exit")
    parser.add_argument("--uninstall-hook", action="store_true",
                        help=f"remove {PTH_NAME}, then exit")
    parser.add_argument("--site-dir", metavar="DIR",
                        help="where --install-hook/--uninstall-hook write "
                             "[this environment's site-packages]")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                        help="the job, e.g. `-- torchrun --nproc-per-node 8 train.py`")


def boot_dir(root: Path) -> Path:
    """Write the start-up file into ``root`` (a folder of its own) and return it."""
    (root / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return root


def job_env(env: dict[str, str], boot: Path, trace_dir: str, job_id: str,
            run_id: str) -> dict[str, str]:
    """``env`` with the hook armed for one run."""
    out = dict(env)
    out[ENV_TRACE_DIR] = str(Path(trace_dir).resolve())
    out[ENV_JOB_ID], out[ENV_RUN_ID] = job_id, run_id
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(boot), env.get("PYTHONPATH")) if p)
    return out


def install_hook(site_dir: str | None, remove: bool = False) -> Path:
    """Write (or remove) the .pth file; returns its path."""
    path = Path(site_dir or sysconfig.get_paths()["purelib"]) / PTH_NAME
    try:
        if remove:
            path.unlink(missing_ok=True)
        else:
            path.write_text(PTH)
    except OSError as exc:
        raise RunError(f"cannot write {path}: {exc.strerror}") from None
    return path


def run(args: argparse.Namespace) -> int:
    if args.install_hook or args.uninstall_hook:
        path = install_hook(args.site_dir, remove=args.uninstall_hook)
        print(f"failslow: removed {path}" if args.uninstall_hook else
              f"failslow: wrote {path}: {ENV_TRACE_DIR}=DIR now traces the jobs of any "
              f"Python reading {path.parent}", file=sys.stderr)
        return 0
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise RunError("no command to run: failslow run -- torchrun ... train.py")
    trace_dir = args.trace_dir or os.environ.get(ENV_TRACE_DIR) or "failslow-traces"
    job_id = args.job_id or default_job_id(os.environ, command)
    run_id = os.environ.get(ENV_RUN_ID) or new_run_id()  # nodes of one job may share one
    where = run_dir(Path(trace_dir).resolve(), job_id, run_id)
    with tempfile.TemporaryDirectory(prefix="failslow-boot-") as tmp:
        env = job_env(dict(os.environ), boot_dir(Path(tmp)), trace_dir, job_id, run_id)
        try:
            child = subprocess.Popen(command, env=env)
        except OSError as exc:
            raise RunError(f"cannot start {shlex.join(command)}: {exc.strerror}") from None
        previous = signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
        try:
            rc = _wait(child)
        finally:
            signal.signal(signal.SIGTERM, previous)
    files = sorted(where.glob("rank*.jsonl"))
    if files:
        print(f"failslow: {len(files)} rank trace(s) in {where}/\n"
              f"failslow: find stragglers: failslow detect {where}/rank*.jsonl",
              file=sys.stderr)
    else:
        print(f"failslow: no rank wrote a trace to {where}/ (the lines above say why)",
              file=sys.stderr)
    return rc


def _wait(child: subprocess.Popen) -> int:
    """The child's exit status; Ctrl-C reaches it from the terminal, so keep waiting."""
    while True:
        try:
            rc = child.wait()
            return rc if rc >= 0 else 128 - rc  # killed by a signal: as a shell says it
        except KeyboardInterrupt:
            continue
