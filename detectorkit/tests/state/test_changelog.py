"""Creating the changelog topic at start, without a broker: the metadata of a topic created a
moment ago (by this job or another instance) may not show it yet."""

import pytest

from detectorkit.settings import SettingsError
from detectorkit.state import changelog


@pytest.fixture
def broker(monkeypatch):
    """A broker whose metadata shows the changelog only after `late` asks."""
    state = {"exists": False, "late": 2, "partitions": 4}

    def topic_partitions(admin, topic, timeout):
        if topic == "in":
            return [0, 1, 2, 3]
        if state["late"] > 0:
            state["late"] -= 1
            raise LookupError(f"topic {topic!r} does not exist")
        return list(range(state["partitions"]))

    monkeypatch.setattr(changelog.clients, "new_admin", lambda conf: object())
    monkeypatch.setattr(changelog.clients, "topic_partitions", topic_partitions)
    monkeypatch.setattr(changelog.clients, "create_topics", lambda conf, topics, timeout, config=None: [] if state["exists"] else list(topics))
    return state


def test_a_changelog_created_now_is_not_looked_up_before_its_metadata_arrives(broker):
    changelog.create({}, "svc.state", "in", "kafka", timeout=1)  # seen failing the diamond's burst detector at start


def test_one_another_instance_created_is_awaited_and_checked(broker):
    broker["exists"] = True
    changelog.create({}, "svc.state", "in", "kafka", timeout=5)
    broker.update(late=0, partitions=2)
    with pytest.raises(SettingsError, match="has 2 partitions, input topic 'in' has 4"):
        changelog.create({}, "svc.state", "in", "kafka", timeout=5)
