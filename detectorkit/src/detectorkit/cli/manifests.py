"""`<service> kafka-manifests`: the Strimzi resources the service needs (kafka.manifests), as YAML on
stdout, from the settings and the detector exactly as the live service reads them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from detectorkit import settings as settings_mod
from detectorkit.cli.exits import fail
from detectorkit.detector import Detector
from detectorkit.kafka import manifests
from detectorkit.settings import Settings, SettingsError
from detectorkit.state import State


def service_of(settings: Settings, name: str, state: State | None) -> manifests.Service:
    """The job as its Kafka resources see it: its settings, and its state's changelog."""
    from detectorkit.state.changelog import TOPIC_CONFIG

    return manifests.Service(
        name=name,
        input_topic=settings.input_topic,
        output_topic=settings.output_topic,
        dlq_topic=settings.dlq_topic,
        consumer_group=settings.consumer_group,
        partitions=settings.topic_partitions,
        exactly_once=settings.exactly_once,
        metrics_topic=None if settings.metrics_bootstrap_servers else settings.metrics_topic,
        changelog=state.changelog_topic(settings.consumer_group) if state is not None else None,
        changelog_config=dict(TOPIC_CONFIG),
    )


def manifests_main(detector: Detector, argv: Sequence[str], defaults: Mapping[str, Any] | None = None) -> int:
    from detectorkit.runtime.stage import as_stage

    prog = f"{detector.name} kafka-manifests"
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Print the service's Strimzi KafkaTopics (its dead letters, its state's changelog) and its KafkaUser with "
        "the rights the job uses, for a deployment with TOPICS_AS_CODE=true.",
    )
    parser.add_argument("--cluster", required=True, help="the Strimzi Kafka cluster's name (the strimzi.io/cluster label)")
    parser.add_argument("--authentication", choices=manifests.AUTHENTICATIONS, default="tls", help="the user's authentication (default: tls)")
    parser.add_argument("--replicas", type=int, default=3, help="replicas of the topics it owns (default: 3)")
    settings_mod.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        settings = settings_mod.load(args, defaults=defaults).for_service(detector.name)
        state = as_stage(detector.configured(detector.load_config())).state
    except SettingsError as exc:
        return fail(str(exc))
    try:
        import yaml
    except ImportError:
        return fail("kafka-manifests writes YAML with PyYAML: pip install 'detectorkit[dev]'")
    docs = manifests.manifests(service_of(settings, detector.name, state), args.cluster, args.authentication, args.replicas)
    sys.stdout.write(f"# Written by `{prog} --cluster {args.cluster}`; the service's own test compares them with what it would write.\n")
    sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True))
    return 0
