"""The brokers the project starts by itself, chosen by engine: the embedded Tansu
(`embedded_broker`) or Apache Kafka (`kafka_broker`).

The choice lives apart from both so that neither broker's module imports the other.
"""

from __future__ import annotations

from detectorkit.devtools.broker_net import BrokerError
from detectorkit.devtools.embedded_broker import EmbeddedBroker
from detectorkit.devtools.kafka_broker import KafkaBroker

ENGINES = ("tansu", "kafka")


def start_broker(engine: str = "tansu", port: int | None = None, data_dir: str | None = None) -> EmbeddedBroker | KafkaBroker:
    """A started broker of the given engine: `EmbeddedBroker` (Tansu) or `KafkaBroker` (Apache Kafka)."""
    if engine == "tansu":
        if data_dir:
            raise BrokerError("the embedded broker (Tansu) keeps everything in memory: --data-dir needs --engine kafka")
        return EmbeddedBroker(port=port).start()
    if engine == "kafka":
        return KafkaBroker(port=port, data_dir=data_dir).start()
    raise BrokerError(f"unknown broker engine {engine!r}; one of: {', '.join(ENGINES)}")
