"""ClickHouse storage: schema migrations, two transports behind one client, the
batched columnar writer and the Kafka -> ClickHouse sink.

- ``storage.client.connect(url)``: ``chdb:///folder`` (embedded) or
  ``clickhouse://user:pw@host:9000/db`` (server, native protocol).
- ``storage.migrations.migrate(client)``: apply the schema (idempotent).
- ``storage.writer.Writer(client)``: events -> Arrow batches -> tables.
- ``storage.sink.Sink``: Kafka consumer loop, commits only after ClickHouse acked.
- ``storage.serve.QueryServer``: the chdb folder's owner serves other processes.
"""
