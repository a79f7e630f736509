"""A simulated job with its incidents in ClickHouse, for the report and status tests.

As a script (a chdb folder belongs to one process, so CLI tests load it in another):
``python tests/report_support.py FOLDER SCENARIO`` prints the incidents, one JSON a line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from failslow.models.pipeline import Detector  # noqa: E402
from failslow.simulator import SCENARIOS, simulate  # noqa: E402
from failslow.storage.client import Client, connect  # noqa: E402
from failslow.storage.migrations import migrate  # noqa: E402
from failslow.storage.writer import Writer  # noqa: E402


def load_job(client: Client, scenario: str, seed: int = 0, steps: int | None = None) -> list[dict]:
    """Write the scenario's events and the incidents the Detector finds in them."""
    det, writer, incidents = Detector(), Writer(client), []
    for batch in simulate(SCENARIOS[scenario], seed=seed, steps=steps).batches():
        incidents += det.process_batch(batch)
        writer.write(batch)
    incidents += det.flush()
    writer.write(incidents)
    return incidents


if __name__ == "__main__":
    folder, name = sys.argv[1], sys.argv[2]
    c = connect(f"chdb://{folder}", own=True)
    migrate(c)
    for inc in load_job(c, name):
        print(orjson.dumps(inc).decode())
    c.close()
