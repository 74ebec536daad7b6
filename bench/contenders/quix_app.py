"""Peer (3): the same detection as a Quix Streams application (runs in its own virtualenv, since
Quix Streams pins an older confluent-kafka). Records go one by one through a filter, as Quix does.
Usage: quix_app.py BOOTSTRAP INPUT OUTPUT GROUP THRESHOLD
"""

import sys

from quixstreams import Application


def main(bootstrap, input_topic, output_topic, group, threshold):
    threshold = float(threshold)
    # The same client settings as the project's (measured on Tansu): quick joins, no fetch stalls.
    app = Application(
        broker_address=bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        consumer_extra_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500, "fetch.queue.backoff.ms": 10, "fetch.wait.max.ms": 50},
        producer_extra_config={"linger.ms": 5, "batch.size": 1024 * 1024},
        auto_create_topics=False,
    )
    source = app.topic(input_topic, value_deserializer="json")
    sink = app.topic(output_topic, value_serializer="json")
    sdf = app.dataframe(source)
    sdf = sdf.filter(lambda record: isinstance(record.get("amount"), (int, float)) and record["amount"] > threshold)
    sdf = sdf.apply(
        lambda record, key, timestamp, headers: {
            "service": "quix-streams",
            "detection": {"rule": "amount_above_threshold", "amount": record["amount"], "threshold": threshold},
            "source": {"timestamp_ms": timestamp},
        },
        metadata=True,
    )
    sdf.to_topic(sink)
    app.run()


if __name__ == "__main__":
    main(*sys.argv[1:6])
