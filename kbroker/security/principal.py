"""The principal of a TLS client certificate, as Kafka names it.

Kafka's DefaultKafkaPrincipalBuilder takes the certificate's subject as Java's ``X500Principal.getName()`` writes
it (RFC 2253: the most specific RDN first, Java's keywords and escaping) and maps it through
``ssl.principal.mapping.rules``: a comma-separated list of ``RULE:pattern/replacement/[LU]`` and ``DEFAULT``,
the first rule whose pattern matches the whole DN giving the name (``DEFAULT`` is the DN itself). No client
certificate is ``User:ANONYMOUS``. The rules are Java regular expressions; they are translated to Python's ``re``
where the two differ (named groups, ``\\Q..\\E``, ASCII ``\\w``/``\\d``/``\\s``), and replacements follow
``Matcher.replaceAll`` (``$1``, ``${name}``, ``\\$``), with Kafka's treatment of references to missing groups.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from kbroker.config_registry import ConfigError

ANONYMOUS = "User:ANONYMOUS"
DEFAULT_RULES = "DEFAULT"

# Kafka's own grammar (SslPrincipalMapper.RULE_PATTERN): DEFAULT, RULE:pattern/replacement/[LU], or anything else
# (which then fails the whole-rule check below). Escaped characters (\/ and \\) may appear in both parts.
_RULE = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_RULE_SPLITTER = re.compile(r"\s*(" + _RULE + r")\s*(,\s*|$)")
_RULE_PARSER = re.compile(_RULE)


class PrincipalMappingError(ValueError):
    """No rule maps the DN, or a rule's replacement cannot be applied (Kafka fails the authentication)."""


@dataclass(frozen=True)
class MappingRule:
    """One rule; ``pattern`` None is DEFAULT."""

    pattern: re.Pattern[str] | None
    java_pattern: str = ""
    replacement: str = ""
    to_lower: bool = False
    to_upper: bool = False

    def __str__(self) -> str:  # as Kafka's Rule.toString, so a rule list reads the same in both brokers' logs
        if self.pattern is None:
            return "DEFAULT"
        text = f"RULE:{self.java_pattern}/{self.replacement}"
        return text + ("/L" if self.to_lower else "/U" if self.to_upper else "")

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        if self.pattern.fullmatch(dn) is None:
            return None
        result = _java_replace_all(self.pattern, self.replacement, dn)
        # Kafka's toLowerCase/toUpperCase(Locale.ENGLISH): Unicode's default case mapping, as Python's
        if self.to_lower:
            return result.lower()
        if self.to_upper:
            return result.upper()
        return result


@dataclass(frozen=True)
class MappingRules:
    rules: tuple[MappingRule, ...]

    def __str__(self) -> str:
        return f"SslPrincipalMapper(rules = [{', '.join(str(rule) for rule in self.rules)}])"

    def name_of(self, dn: str) -> str:
        """The mapped name of a DN; PrincipalMappingError when no rule applies (Kafka's NoMatchingRule)."""
        for rule in self.rules:
            name = rule.apply(dn)
            if name is not None:
                return name
        raise PrincipalMappingError(f"No rules apply to {dn}, rules [{', '.join(str(rule) for rule in self.rules)}]")


def parse_mapping_rules(text: str | None) -> MappingRules:
    """Kafka's ssl.principal.mapping.rules; ConfigError for a malformed rule (Kafka refuses to start)."""
    if text is None:
        text = DEFAULT_RULES
    rules: list[MappingRule] = []
    for match in _RULE_SPLITTER.finditer(text.strip()):
        rule_text = match.group(1)
        parsed = _RULE_PARSER.match(rule_text)
        assert parsed is not None  # the last alternative matches anything, the empty string included
        if parsed.end() != len(rule_text):
            raise ConfigError(
                f"ssl.principal.mapping.rules: Invalid rule: `{rule_text}`, unmatched substring: "
                f"`{rule_text[parsed.end() :]}`"
            )
        if parsed.group(1) is not None:
            rules.append(MappingRule(None))
        elif parsed.group(2) is not None:
            java_pattern, replacement, case = parsed.group(2), parsed.group(4), parsed.group(6)
            try:
                pattern = re.compile(java_regex_to_python(java_pattern), re.ASCII)
            except re.error as exc:
                raise ConfigError(f"ssl.principal.mapping.rules: bad pattern in rule `{rule_text}`: {exc}") from None
            rules.append(MappingRule(pattern, java_pattern, replacement, case == "L", case == "U"))
        # anything else is an empty rule, which Kafka ignores
    return MappingRules(tuple(rules))


def principal_of_certificate(der: bytes | None, rules: str | MappingRules) -> str:
    """``User:<name>`` for a client certificate (DER), ``User:ANONYMOUS`` without one.

    Raises PrincipalMappingError when no rule maps the DN: Kafka then fails the client's authentication
    ("Failed to map name for '<DN>' based on SSL principal mapping rules.").
    """
    if der is None:
        return ANONYMOUS
    mapping = rules if isinstance(rules, MappingRules) else parse_mapping_rules(rules)
    dn = subject_dn(der)
    try:
        return "User:" + mapping.name_of(dn)
    except PrincipalMappingError as exc:
        raise PrincipalMappingError(
            f"Failed to map name for '{dn}' based on SSL principal mapping rules. ({exc})"
        ) from None


# --- Java regular expressions and replacements -------------------------------------------------------------


def java_regex_to_python(pattern: str) -> str:
    """Rewrite the parts of a Java regex Python's re spells differently; the rest is the same language."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith(r"\Q", i):  # \Q...\E quotes literally
            end = pattern.find(r"\E", i + 2)
            literal = pattern[i + 2 :] if end < 0 else pattern[i + 2 : end]
            out.append(re.escape(literal))
            i = len(pattern) if end < 0 else end + 2
        elif pattern[i] == "\\" and pattern.startswith("k<", i + 1):  # \k<name> back reference
            end = pattern.index(">", i)
            out.append(f"(?P={pattern[i + 3 : end]})")
            i = end + 1
        elif pattern[i] == "\\" and i + 1 < len(pattern):
            out.append(pattern[i : i + 2])
            i += 2
        elif pattern.startswith("(?<", i) and i + 3 < len(pattern) and pattern[i + 3] not in "=!":
            out.append("(?P<")  # a named group, not a look-behind
            i += 3
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


def _java_replace_all(pattern: re.Pattern[str], replacement: str, text: str) -> str:
    """String.replaceAll, which Kafka runs over the DN: every match is replaced, not only the whole string.

    Not re.sub: after an empty match Java moves on one character, where Python may match again, non-empty, at
    the same position (``.*?`` over "ab" is "<>a<>b<>" in Java, "<><a><><b><>" with re.sub).
    """
    out: list[str] = []
    copied_up_to = 0
    position = 0
    while position <= len(text):
        match = pattern.search(text, position)
        if match is None:
            break
        out.append(text[copied_up_to : match.start()])
        out.append(_expand_java_replacement(replacement, match, pattern.groups))
        copied_up_to = match.end()
        position = match.end() + 1 if match.end() == match.start() else match.end()
    out.append(text[copied_up_to:])
    return "".join(out)


def _expand_java_replacement(replacement: str, match: re.Match[str], group_count: int) -> str:
    """Matcher.appendReplacement's expansion, after Kafka's escapeLiteralBackReferences: a ``$n`` naming a group
    the pattern does not have is kept as literal text (``$123`` with 12 groups is group 12 then ``3``)."""
    out: list[str] = []
    i = 0
    while i < len(replacement):
        char = replacement[i]
        if char == "\\":
            if i + 1 >= len(replacement):
                raise PrincipalMappingError("character to be escaped is missing")
            out.append(replacement[i + 1])
            i += 2
        elif char == "$":
            i += 1
            if i >= len(replacement):
                raise PrincipalMappingError("Illegal group reference: group index is missing")
            if replacement[i] == "{":
                end = replacement.find("}", i)
                if end < 0:
                    raise PrincipalMappingError("named capturing group is missing trailing '}'")
                name = replacement[i + 1 : end]
                if name not in match.re.groupindex:
                    raise PrincipalMappingError(f"No group with name {{{name}}}")
                out.append(match.group(name) or "")
                i = end + 1
                continue
            if not replacement[i].isdigit() or not replacement[i].isascii():
                raise PrincipalMappingError("Illegal group reference")
            digits_start = i
            while i < len(replacement) and replacement[i].isascii() and replacement[i].isdigit():
                i += 1
            digits = replacement[digits_start:i]
            if group_count and not digits.startswith("0") and int(digits[0]) > group_count:
                out.append("$" + digits)  # Kafka escapes a reference to a group that does not exist
                continue
            # Java takes the first digit, then more while the number stays a group of the pattern
            number = int(digits[0])
            used = 1
            while used < len(digits) and int(digits[: used + 1]) <= group_count:
                number = int(digits[: used + 1])
                used += 1
            if number > group_count:
                raise PrincipalMappingError(f"No group {number}")
            out.append(match.group(number) or "")
            out.append(digits[used:])
        else:
            out.append(char)
            i += 1
    return "".join(out)


# --- The DN as X500Principal.getName() writes it -------------------------------------------------------------

# Java's RFC 2253 keywords (sun.security.x509.AVAKeyword entries marked RFC 2253 compliant); any other attribute,
# emailAddress and serialNumber included, is written as its dotted OID with a #hex value.
_RFC2253_KEYWORDS = {
    "2.5.4.3": "CN",
    "2.5.4.6": "C",
    "2.5.4.7": "L",
    "2.5.4.8": "ST",
    "2.5.4.10": "O",
    "2.5.4.11": "OU",
    "2.5.4.9": "STREET",
    "0.9.2342.19200300.100.1.25": "DC",
    "0.9.2342.19200300.100.1.1": "UID",
}
# The string types Java writes as text (AVA.isDerString, non-canonical): Printable, T61, IA5, General, BMP, UTF8.
_STRING_TAGS = {0x13, 0x14, 0x16, 0x1B, 0x1E, 0x0C}
_ESCAPED = ',=+<>#;"\\'  # Java escapes '=' as well as RFC 2253's list

_SEQUENCE, _SET, _OID = 0x30, 0x31, 0x06


class CertificateParseError(ValueError):
    pass


def _tlv(data: bytes, offset: int) -> tuple[int, int, int, int]:
    """(tag, content start, content end, element end) of the DER element at offset."""
    if offset + 2 > len(data):
        raise CertificateParseError("truncated DER element")
    tag = data[offset]
    length = data[offset + 1]
    start = offset + 2
    if length & 0x80:
        size = length & 0x7F
        if size == 0 or size > 4 or start + size > len(data):
            raise CertificateParseError("bad DER length")
        length = int.from_bytes(data[start : start + size], "big")
        start += size
    end = start + length
    if end > len(data):
        raise CertificateParseError("truncated DER element")
    return tag, start, end, end


def _children(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    offset = start
    while offset < end:
        element = _tlv(data, offset)
        yield (offset, *element[:3])
        offset = element[3]


def _oid_text(content: bytes) -> str:
    arcs: list[int] = []
    value = 0
    for byte in content:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            arcs.append(value)
            value = 0
    if not arcs:
        raise CertificateParseError("empty OID")
    first = min(arcs[0] // 40, 2)
    return ".".join(str(arc) for arc in [first, arcs[0] - 40 * first, *arcs[1:]])


def subject_dn(certificate_der: bytes) -> str:
    """The certificate's subject as Java's X500Principal.getName() (RFC 2253) writes it."""
    try:
        _, cert_start, _, _ = _tlv(certificate_der, 0)
        _, tbs_start, tbs_end, _ = _tlv(certificate_der, cert_start)
        fields = list(_children(certificate_der, tbs_start, tbs_end))
        if fields and fields[0][1] == 0xA0:  # explicit [0] version
            fields = fields[1:]
        # serialNumber, signature, issuer, validity, subject
        subject_offset, tag, name_start, name_end = fields[4]
        if tag != _SEQUENCE:
            raise CertificateParseError("subject is not a SEQUENCE")
        return _rfc2253_name(certificate_der, name_start, name_end)
    except (IndexError, ValueError) as exc:
        raise CertificateParseError(f"cannot read the certificate's subject: {exc}") from None


def _rfc2253_name(data: bytes, start: int, end: int) -> str:
    rdns: list[str] = []
    for _, tag, rdn_start, rdn_end in _children(data, start, end):
        if tag != _SET:
            raise CertificateParseError("RDN is not a SET")
        attributes = []
        for _, ava_tag, ava_start, ava_end in _children(data, rdn_start, rdn_end):
            if ava_tag != _SEQUENCE:
                raise CertificateParseError("attribute is not a SEQUENCE")
            (_, oid_tag, oid_start, oid_end), (value_offset, value_tag, value_start, value_end) = list(
                _children(data, ava_start, ava_end)
            )
            if oid_tag != _OID:
                raise CertificateParseError("attribute type is not an OID")
            oid = _oid_text(data[oid_start:oid_end])
            attributes.append(
                _rfc2253_attribute(oid, value_tag, data[value_offset:value_end], data[value_start:value_end])
            )
        rdns.append("+".join(attributes))  # Java keeps a multi-valued RDN's encoded order
    return ",".join(reversed(rdns))  # most specific (last encoded) first


def _rfc2253_attribute(oid: str, tag: int, encoded: bytes, content: bytes) -> str:
    keyword = _RFC2253_KEYWORDS.get(oid)
    if keyword is None or tag not in _STRING_TAGS:
        return f"{keyword or oid}=#{encoded.hex()}"
    # Java decodes the value's bytes as UTF-8 whatever the string type (malformed input becomes U+FFFD)
    text = content.decode("utf-8", errors="replace")
    # Java escapes its special characters with a backslash and NUL as \00; the rest is written as it is
    escaped = "".join("\\" + char if char in _ESCAPED else "\\00" if char == "\0" else char for char in text)
    lead = len(escaped) - len(escaped.lstrip(" \r"))
    trail = len(escaped) - len(escaped.rstrip(" \r"))
    if lead == len(escaped):  # all whitespace: every character is both leading and trailing
        return f"{keyword}=" + "".join("\\" + char for char in escaped)
    middle = escaped[lead : len(escaped) - trail]
    head = "".join("\\" + char for char in escaped[:lead])
    tail = "".join("\\" + char for char in escaped[len(escaped) - trail :])
    return f"{keyword}={head}{middle}{tail}"
