"""`<service> kafka-manifests` (and `detectorkit normalise|notify kafka-manifests`): the Strimzi
resources the service needs (detectorkit.manifests), as YAML on stdout, from the settings and the detector
or stage exactly as the live job reads them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from detectorkit import manifests
from detectorkit import settings as settings_mod
from detectorkit.cli.exits import fail
from detectorkit.detector import Detector
from detectorkit.settings import Settings, SettingsError
from detectorkit.state import State

if TYPE_CHECKING:
    from detectorkit.runtime.stage import Stage


def service_of(
    settings: Settings, name: str, state: State | None, also_reads: tuple[tuple[str, str], ...] = (), repartitioned: bool = False
) -> manifests.Service:
    """The job as its Kafka resources see it: its settings, its state's changelog, what its relay
    reads (Stage.also_reads), and its repartition topic if it re-keys its input (Stage.repartition_field)."""
    from detectorkit.runtime import repartition
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
        also_reads=also_reads,
        repartition=repartition.topic_of(settings.consumer_group) if repartitioned else None,
        repartition_config=dict(repartition.TOPIC_CONFIG) if repartitioned else {},
    )


def manifests_main(detector: Detector | Stage, argv: Sequence[str], defaults: Mapping[str, Any] | None = None, prog: str | None = None) -> int:
    from detectorkit.runtime.stage import as_stage

    prog = prog or f"{detector.name} kafka-manifests"
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Print the service's Strimzi KafkaTopics (its dead letters, its state's changelog) and its KafkaUser with "
        "the rights the job uses, for a deployment with TOPICS_AS_CODE=true.",
    )
    manifests.add_arguments(parser)
    settings_mod.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        settings = settings_mod.load(args, defaults=defaults).for_service(detector.name)
        stage = as_stage(detector)
        stage = stage.configured(stage.load_config())
    except SettingsError as exc:
        return fail(str(exc))
    service = service_of(settings, detector.name, stage.state, stage.also_reads(settings), stage.repartition_field is not None)
    try:
        text = manifests.as_yaml(manifests.manifests(service, args.cluster, args.authentication, args.replicas), f"{prog} --cluster {args.cluster}")
    except ImportError as exc:
        return fail(str(exc))
    sys.stdout.write(text)
    return 0
