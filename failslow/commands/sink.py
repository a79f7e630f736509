"""`failslow sink`: Kafka -> ClickHouse writer (all raw topics, incidents, dead letters).

Applies the schema first (idempotent). With a chdb URL this process owns the data
folder and serves queries to other processes on 127.0.0.1 (`failslow query`
finds it through ``<folder>.owner.json``). SIGINT/SIGTERM: write what is
buffered, commit, close.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

import orjson

from failslow.metrics import SINK, add_metrics_flags, serve_metrics

HELP = "Kafka -> ClickHouse writer"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--group", default="failslow-sink", help="consumer group id")
    parser.add_argument("--batch-rows", type=int, default=20_000,
                        help="write when this many rows are buffered (default 20000)")
    parser.add_argument("--max-delay-s", type=float, default=0.5,
                        help="write at least this often while data flows, seconds (0.5)")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="stop after this many seconds (tests, demos)")
    parser.add_argument("--idle-exit-s", type=float, default=None,
                        help="stop once no record arrived for this many seconds")
    parser.add_argument("--no-serve", action="store_true",
                        help="chdb: do not serve queries to other processes")
    add_metrics_flags(parser)


def run(args: argparse.Namespace) -> int:
    from failslow.config import clickhouse_url, resolve
    from failslow.schema import Topics
    from failslow.storage.client import connect
    from failslow.storage.embedded import ChdbClient
    from failslow.storage.migrations import migrate
    from failslow.storage.serve import QueryServer
    from failslow.storage.sink import Sink

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = resolve(args)
    client = connect(clickhouse_url(settings), own=True)
    server = None
    stop = threading.Event()
    try:
        migrate(client)
        if isinstance(client, ChdbClient) and not args.no_serve:
            server = QueryServer(client).start()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        sink = Sink(client, settings.bootstrap, Topics(settings.topic_prefix),
                    group_id=args.group, batch_rows=args.batch_rows,
                    max_delay_s=args.max_delay_s)
        serve_metrics(args, lambda: {**sink.stats.as_dict(), "buffered": sink.writer.pending},
                      SINK)
        stats = sink.run(stop, max_seconds=args.max_seconds, idle_exit_s=args.idle_exit_s)
    finally:
        if server is not None:
            server.stop()
        client.close()
    print(orjson.dumps({"sink": stats.as_dict()}).decode())
    return 0
