"""docs/contract.md is the one source of truth for producers: its field tables agree with
the validator's SPECS both ways (every field, required-ness, type), its topic table with
schema/topics.py, and every JSON example in it validates."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from failslow.schema import decode, validate
from failslow.schema.batches import BATCH_KINDS, to_batch
from failslow.schema.events import NESTED, SPECS
from failslow.schema.topics import KIND_TOPIC, Topics

DOC = Path(__file__).resolve().parent.parent / "docs" / "contract.md"
TYPES = {"string": "str", "int64": "int", "int32": "i32", "number": "num", "time": "time",
         "bool": "bool", "list of int64": "ints", "list of number": "nums", "object": "obj",
         "list of ops entries": "ops"}


def _text() -> str:
    return DOC.read_text(encoding="utf-8")


def _doc_type(cell: str):
    cell = cell.strip()
    if cell.startswith("one of:"):
        return tuple(v.strip() for v in cell[len("one of:"):].split(","))
    assert cell in TYPES, f"unknown type {cell!r} in docs/contract.md"
    return TYPES[cell]


def field_tables() -> dict[str, tuple[dict, dict]]:
    """{kind or nested type: (required {field: type}, optional {field: type})} from the
    tables under the headings ``### `kind``` and ``#### `ops` entries``."""
    tables: dict[str, tuple[dict, dict]] = {}
    name = None
    for line in _text().splitlines():
        heading = re.match(r"#{3,4} `(\w+)`", line)
        if heading:
            name = heading.group(1)
            continue
        if line.startswith("## "):
            name = None
        row = re.match(r"\| `(\w+)` \| ([^|]+) \| (yes|no) \|", line)
        if name and row:
            required, optional = tables.setdefault(name, ({}, {}))
            field, ftype, req = row.groups()
            assert field not in required and field not in optional, f"{name}.{field} twice"
            (required if req == "yes" else optional)[field] = _doc_type(ftype)
    return tables


def test_every_kind_and_field_of_the_schema_is_documented_and_nothing_else():
    tables = field_tables()
    assert set(tables) == set(SPECS) | set(NESTED)
    for name, spec in (*SPECS.items(), *NESTED.items()):
        doc_required, doc_optional = tables[name]
        required, optional = spec
        assert doc_required == required, name
        assert doc_optional == optional, name


def test_the_topic_table_is_the_code_s():
    rows = re.findall(r"^\| `failslow\.(\w+)` \| ([^|]+) \|", _text(), flags=re.M)
    documented = {kind: topic for topic, kinds in rows
                  for kind in re.findall(r"`(\w+)`", kinds)}
    assert documented == KIND_TOPIC
    assert {t for t, _ in rows} == {t.removeprefix("failslow.") for t in Topics().all()}


def _examples() -> list[str]:
    return re.findall(r"```json\n(.*?)\n```", _text(), flags=re.S)


def test_there_is_an_example_of_every_kind():
    kinds = {orjson.loads(e).get("kind") for e in _examples()}
    assert set(SPECS) <= kinds


@pytest.mark.parametrize("example", _examples())
def test_every_json_example_validates(example):
    obj = orjson.loads(example)
    if obj.get("kind") in BATCH_KINDS:
        # a batch example: its rows are valid events, and it is what the writer makes of them
        rows = decode(example)
        assert rows and to_batch(rows) == obj
    elif "kind" in obj:
        assert validate(obj) is obj
        assert decode(orjson.dumps([obj, obj])) == [obj, obj]
        # every field the example shows is one the contract defines
        required, optional = SPECS[obj["kind"]]
        assert set(obj) <= {"v", "kind", *required, *optional}
    else:  # a dead letter
        assert set(obj) == {"error", "topic", "raw"}
        assert all(isinstance(v, str) for v in obj.values())
