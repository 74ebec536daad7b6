"""Peer (2): a plain confluent-kafka loop in one Python process, the ceiling for Python here.

Consume a batch, parse it, run the same pandas detector, produce the detections, flush, commit.
Usage: plain_loop.py BOOTSTRAP INPUT OUTPUT GROUP MODULE:DETECTOR
"""

import importlib
import json
import signal
import sys

import pandas as pd
from confluent_kafka import Consumer, Producer, TopicPartition

from detectorkit.kafka import clients


def main(bootstrap, input_topic, output_topic, group, detector_path):
    module, _, attr = detector_path.partition(":")
    detector = getattr(importlib.import_module(module), attr)
    config = detector.load_config()
    base = clients.base(bootstrap)
    consumer = Consumer(clients.consumer(base, group, **{"auto.offset.reset": "earliest"}))
    producer = Producer(clients.producer(base))
    consumer.subscribe([input_topic])
    running = True

    def stop(*_):
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while running:
        messages = [m for m in consumer.consume(10_000, timeout=0.05) if m.error() is None]
        if not messages:
            continue
        rows, positions = [], []
        for i, m in enumerate(messages):
            try:
                record = json.loads(m.value())
            except ValueError:
                continue
            if isinstance(record, dict) and all(record.get(f) is not None for f in detector.required_fields):
                rows.append(record)
                positions.append(i)
        if rows:
            out = detector.detect(pd.DataFrame.from_records(rows, index=positions), config)
            for position, fields in zip(out.index, out.to_dict(orient="records"), strict=True):
                m = messages[position]
                value = {
                    "service": "plain-loop",
                    "detection": fields,
                    "source": {"topic": m.topic(), "partition": m.partition(), "offset": m.offset(), "timestamp_ms": m.timestamp()[1]},
                }
                producer.produce(output_topic, key=m.key(), value=json.dumps(value).encode())
        producer.flush()
        ends = {}
        for m in messages:
            ends[(m.topic(), m.partition())] = max(ends.get((m.topic(), m.partition()), 0), m.offset() + 1)
        consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in ends.items()], asynchronous=False)
    consumer.close()


if __name__ == "__main__":
    main(*sys.argv[1:6])
