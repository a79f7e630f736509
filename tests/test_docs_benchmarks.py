"""docs/benchmarks.md says which bench/ script answers which question: every script is
listed there, and every script it lists exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_bench_script_is_listed_and_every_listed_one_exists():
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    listed = set(re.findall(r"^\| `([a-z0-9_]+\.py)\b", doc, flags=re.M))
    scripts = {p.name for p in (ROOT / "bench").glob("*.py")}
    assert scripts - listed == set(), "bench scripts missing from docs/benchmarks.md"
    assert listed - scripts == set(), "docs/benchmarks.md lists scripts that are gone"
