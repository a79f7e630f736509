"""Pure, synchronous detection models: no I/O, no asyncio, no Kafka, no ClickHouse.

The whole decision lives in ``models.pipeline.Detector``: feed it CONTRACT.md
events, get incident events back. ``failslow detect`` and the stream workers run
this same code.
"""
