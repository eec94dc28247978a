"""sasl.jaas.config parsing (kbroker/security/sasl/jaas.py) with the rules of Kafka's JaasConfig
(java.io.StreamTokenizer): words, quotes and escapes, comments, several options, and each malformed value's
one-line ConfigError with Kafka's reason. Every case here was given to kafka-clients 4.3's JaasConfig, with the
same outcome; the one exception is said where it is."""

from __future__ import annotations

import pytest

from kbroker.config_registry import ConfigError
from kbroker.security.sasl.jaas import PLAIN_LOGIN_MODULE, JaasConfig, parse_jaas_config, parse_jaas_entries


def test_plain_users_with_quotes_and_several_options() -> None:
    config = parse_jaas_config(
        f'{PLAIN_LOGIN_MODULE} required username="admin" password="admin-secret" '
        'user_admin="admin-secret" user_alice="alice secret";'
    )
    assert config == JaasConfig(
        PLAIN_LOGIN_MODULE,
        "REQUIRED",
        {"username": "admin", "password": "admin-secret", "user_admin": "admin-secret", "user_alice": "alice secret"},
    )
    assert config.plain_users() == {"admin": "admin-secret", "alice": "alice secret"}


def test_unquoted_words_single_quotes_escapes_and_comments() -> None:
    config = parse_jaas_config(
        "// a comment line\n"
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule Optional /* inline */\n"
        "  unsecuredValidatorRequiredScope=read-only_$x\n"
        "  unsecuredValidatorAllowableClockSkewMs='1000'\n"
        '  tricky="a\\"b\\\\c\\n\\101\\tz" ;'
    )
    assert config.control_flag == "OPTIONAL"
    assert config.options == {
        "unsecuredValidatorRequiredScope": "read-only_$x",
        "unsecuredValidatorAllowableClockSkewMs": "1000",
        "tricky": 'a"b\\c\nA\tz',
    }


def test_a_repeated_key_keeps_its_last_value() -> None:
    assert parse_jaas_config("x REQUIRED a=b c=d a=e;").options == {"a": "e", "c": "d"}


def test_several_entries_are_parsed_but_a_listener_takes_one() -> None:
    text = "a.B required; c.D sufficient x=y;"
    assert [entry.login_module for entry in parse_jaas_entries(text)] == ["a.B", "c.D"]
    with pytest.raises(ConfigError, match="^JAAS config property contains 2 login modules, should be 1 module$"):
        parse_jaas_config(text)


@pytest.mark.parametrize(
    "text, problem",
    [
        (f'{PLAIN_LOGIN_MODULE} required user_alice="secret"', "JAAS config entry not terminated by semi-colon"),
        ("", "Login module not specified in JAAS config"),
        ("   // only a comment", "Login module not specified in JAAS config"),
        (PLAIN_LOGIN_MODULE, "Login module control flag not specified in JAAS config"),
        (f"{PLAIN_LOGIN_MODULE} mandatory;", "Invalid login module control flag 'mandatory' in JAAS config"),
        (f"{PLAIN_LOGIN_MODULE} ;", "Login module control flag is not available in the JAAS config"),
        (f"{PLAIN_LOGIN_MODULE} required skew=1000;", "Value not specified for key 'skew' in JAAS config"),
        (f"{PLAIN_LOGIN_MODULE} required user_alice;", "Value not specified for key 'user_alice' in JAAS config"),
        (f"{PLAIN_LOGIN_MODULE} required user_alice=;", "Value not specified for key 'user_alice' in JAAS config"),
        (f"{PLAIN_LOGIN_MODULE} required user_alice=", "Value not specified for key 'user_alice' in JAAS config"),
        ('"quoted.Module required;', "Login module control flag not specified in JAAS config"),
        ("= required;", "Login module not specified in JAAS config"),  # Kafka's message: "null"
        ("x required a=-b;", "Value not specified for key 'a' in JAAS config"),  # "-" alone is not a word
        ('x required a="unterminated', "JAAS config entry not terminated by semi-colon"),
    ],
)
def test_malformed_configs_are_one_line_config_errors(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_jaas_config(text)
    assert str(caught.value) == problem
