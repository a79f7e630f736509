"""The import graph points downward: no module of a lower package imports the command
line (``failslow/``), neither by an import statement nor by naming one of its modules as
a string (``python -m failslow.cli``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOWER = ("schema", "models", "storage", "collectors", "alerting", "simulator", "streams")
# Dotted module names only: "failslow" (a database, a user agent) and topic names such as
# "failslow.steps" are strings too.
CLI_MODULES = {
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for p in (ROOT / "failslow").rglob("*.py")} - {"failslow"}


def upward_imports(source: str) -> list[str]:
    """The ``failslow`` modules one source file imports or names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Constant) and node.value in CLI_MODULES:
            found.append(node.value)
    return [n for n in found if n == "failslow" or n.startswith("failslow.")]


@pytest.mark.parametrize("package", LOWER)
def test_lower_packages_do_not_import_failslow(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    hits = {str(f.relative_to(ROOT)): upward_imports(f.read_text()) for f in files}
    assert {f: h for f, h in hits.items() if h} == {}


def test_the_check_sees_each_form() -> None:
    src = ("import failslow.cli\nfrom failslow.errors import X\nfrom failslow import y\n"
           "CMD = ['-m', 'failslow.cli']\nfrom schema.errors import FailslowError\n"
           "TOPIC = 'failslow.steps'\n")
    assert sorted(upward_imports(src)) == sorted(
        ["failslow.cli", "failslow.errors", "failslow", "failslow.cli"])
