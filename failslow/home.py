"""FAILSLOW_HOME is private (0700): it holds the embedded stack's state (pids, ports), its
database, the collectors' spools and the notifier's outbox. Whatever creates it makes it
0700, and every command that reads the settings tightens a looser one, saying so once.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

MODE = 0o700


def private_home(home: Path, create: bool = False) -> None:
    """Make ``home`` mode 0700: create it so when ``create`` and it is missing (the folders
    above it as the umask says: they are not ours), and tighten an existing looser one with
    a one-line warning on stderr. Never raises: what cannot be fixed is warned about, and
    whatever then needs the folder fails with its own error."""
    try:
        st = home.stat()
    except FileNotFoundError:
        if not create:
            return
        try:
            home.parent.mkdir(parents=True, exist_ok=True)
            home.mkdir(mode=MODE, exist_ok=True)
            st = home.stat()
        except OSError:
            return
    except OSError:
        return
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISDIR(st.st_mode) or not mode & 0o077:
        return
    try:
        os.chmod(home, MODE)
    except OSError as exc:
        _warn(f"failslow: FAILSLOW_HOME {home} is mode {mode:04o}, open to other users, and "
              f"cannot be made 0700 ({exc.strerror}): chmod 700 {home}")
        return
    _warn(f"failslow: FAILSLOW_HOME {home} was mode {mode:04o}, open to other users; set "
          "to 0700 (it holds the stack's state and data)")


def _warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
