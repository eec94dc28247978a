"""``sasl.jaas.config`` values, parsed as Kafka's JaasConfig parses them (java.io.StreamTokenizer's rules).

A value is one or more entries ``<login module class> <flag> [<key>=<value> ...];`` where the flag is required,
requisite, sufficient or optional (any case). Words are letters, digits and ``. - _ $`` (and characters past
U+009F); a value that is anything else, a number included, must be quoted with ``"`` or ``'``, inside which
``\\n``, ``\\t``, ``\\"``, octal escapes and so on are decoded. ``//`` and ``/* */`` are comments. A listener's
config holds exactly one entry (Kafka's JaasContext), which ``parse_jaas_config`` returns; a problem raises
ConfigError with Kafka's one-line reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from kbroker.config_registry import ConfigError

CONTROL_FLAGS = ("REQUIRED", "REQUISITE", "SUFFICIENT", "OPTIONAL")

PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
OAUTHBEARER_LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
PLAIN_USER_PREFIX = "user_"


@dataclass(frozen=True)
class JaasConfig:
    login_module: str
    control_flag: str  # upper case: REQUIRED, REQUISITE, SUFFICIENT or OPTIONAL
    options: dict[str, str] = field(default_factory=dict)

    def plain_users(self) -> dict[str, str]:
        """PLAIN's users: the ``user_<name>="<password>"`` options, by name."""
        return {
            key[len(PLAIN_USER_PREFIX) :]: value
            for key, value in self.options.items()
            if key.startswith(PLAIN_USER_PREFIX)
        }


# Token kinds, as StreamTokenizer's ttype: a word or quoted string (with its text), a number, another character.
WORD, NUMBER, CHAR, EOF = "word", "number", "char", "eof"
Token = tuple[str, str | None]  # (kind, text): text is the word, the quoted string or the character; None for EOF


def _is_word_char(char: str) -> bool:
    code = ord(char)
    return char.isascii() and (char.isalpha() or char in "-_$") or code >= 0xA0


def _is_number_char(char: str) -> bool:
    return char.isdigit() and char.isascii() or char in ".-"


_ESCAPES = {"a": "\x07", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\x0b"}


def _tokens(text: str) -> Iterator[Token]:
    at, end = 0, len(text)
    while at < end:
        char = text[at]
        if ord(char) <= 32:
            at += 1
            continue
        if char == "/" and text.startswith("/*", at):
            close = text.find("*/", at + 2)
            at = end if close == -1 else close + 2
            continue
        if char == "/":  # "//" and a lone "/" (StreamTokenizer's comment character) both run to the line's end
            while at < end and text[at] not in "\r\n":
                at += 1
            continue
        if _is_number_char(char):
            if char == "-" and not (at + 1 < end and (text[at + 1] == "." or "0" <= text[at + 1] <= "9")):
                yield CHAR, "-"
                at += 1
                continue
            start, seen_point = at, False
            at += 1 if char == "-" else 0
            while at < end and ("0" <= text[at] <= "9" or (text[at] == "." and not seen_point)):
                seen_point = seen_point or text[at] == "."
                at += 1
            yield NUMBER, text[start:at]
            continue
        if _is_word_char(char):
            start = at
            while at < end and (_is_word_char(text[at]) or _is_number_char(text[at])):
                at += 1
            yield WORD, text[start:at]
            continue
        if char in "\"'":
            value, at = _quoted(text, at + 1, char)
            yield WORD, value
            continue
        yield CHAR, char
        at += 1
    yield EOF, None


def _quoted(text: str, at: int, quote: str) -> tuple[str, int]:
    """The quoted string starting at ``at`` (after the quote) and where parsing goes on: it ends at the closing
    quote, or (unterminated, as StreamTokenizer allows) at a line end or the text's end."""
    out: list[str] = []
    end = len(text)
    while at < end and text[at] != quote and text[at] not in "\r\n":
        char = text[at]
        at += 1
        if char == "\\" and at < end:
            escaped = text[at]
            at += 1
            if "0" <= escaped <= "7":
                digits = escaped
                limit = 3 if escaped <= "3" else 2
                while len(digits) < limit and at < end and "0" <= text[at] <= "7":
                    digits += text[at]
                    at += 1
                out.append(chr(int(digits, 8)))
            else:
                out.append(_ESCAPES.get(escaped, escaped))
            continue
        out.append(char)
    if at < end and text[at] == quote:
        at += 1
    return "".join(out), at


def parse_jaas_entries(text: str) -> list[JaasConfig]:
    """Every entry of a JAAS config value; ConfigError with Kafka's reason if it is malformed."""
    tokens = _tokens(text)
    entries: list[JaasConfig] = []
    kind, value = next(tokens)
    while kind != EOF:
        login_module = value if kind == WORD else None
        if not login_module:
            raise ConfigError("Login module not specified in JAAS config")
        kind, value = next(tokens)
        if kind == EOF:
            raise ConfigError("Login module control flag not specified in JAAS config")
        if kind != WORD or value is None:
            raise ConfigError("Login module control flag is not available in the JAAS config")
        if value.upper() not in CONTROL_FLAGS:
            raise ConfigError(f"Invalid login module control flag '{value}' in JAAS config")
        flag = value.upper()
        options: dict[str, str] = {}
        kind, value = next(tokens)
        while kind != EOF and (kind, value) != (CHAR, ";"):
            key = value if kind == WORD and value is not None else "null"
            separator = next(tokens)
            option_kind, option_value = next(tokens) if separator == (CHAR, "=") else (EOF, None)
            if option_kind != WORD or option_value is None:
                raise ConfigError(f"Value not specified for key '{key}' in JAAS config")
            options[key] = option_value
            kind, value = next(tokens)
        if kind == EOF:
            raise ConfigError("JAAS config entry not terminated by semi-colon")
        entries.append(JaasConfig(login_module, flag, options))
        kind, value = next(tokens)
    if not entries:
        raise ConfigError("Login module not specified in JAAS config")
    return entries


def parse_jaas_config(text: str) -> JaasConfig:
    """The single entry of a listener's ``sasl.jaas.config`` (Kafka's JaasContext wants exactly one)."""
    entries = parse_jaas_entries(text)
    if len(entries) != 1:
        raise ConfigError(f"JAAS config property contains {len(entries)} login modules, should be 1 module")
    return entries[0]
