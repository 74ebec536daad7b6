"""Which Kafka and Schema Registry client settings are secrets: a module of its own, without the
Kafka client, so the settings (and a notebook importing the test harness) can ask without importing
librdkafka."""

from __future__ import annotations

import re

# The one list of client settings whose values are secrets; they travel as SecretStr, whose repr and
# str never show the value, and the settings' log lines mask them. A word anywhere in the dotted name
# catches the Java client's names and future librdkafka ones too (ssl.keystore.password,
# sasl.oauthbearer.client.secret, sasl.jaas.config, ...). Not "key": ssl.key.location and
# ssl.keystore.location are paths, which a log must show; a private key itself is a "key.pem". Not
# "token": sasl.oauthbearer.token.endpoint.url is a URL. Public material (sasl.username, the CA's and
# the client's certificate PEM) stays readable, though librdkafka's own sensitive list has some of it.
SECRET_WORDS = frozenset({"password", "passphrase", "secret", "jaas"})
# Secrets by name that no word gives away: the OAUTHBEARER unsecured-JWT config holds SASL extensions;
# the Schema Registry client's user:password and static bearer token.
SECRET_NAMES = frozenset({"sasl.oauthbearer.config", "basic.auth.user.info", "bearer.auth.token"})


def is_secret(key: str) -> bool:
    """Whether a client setting's value is a secret (a password, a private key, a client secret...)."""
    name = key.lower()
    return name in SECRET_NAMES or name.endswith("key.pem") or not SECRET_WORDS.isdisjoint(re.split(r"[._]", name))
