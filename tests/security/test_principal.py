"""The principal of a client certificate: Java's RFC 2253 rendering of the subject and Kafka's mapping rules.

The expected DNs and mapped names were produced by Java 17's X500Principal.getName() and by kafka-clients 4.3.1's
SslPrincipalMapper over the same inputs; the rule cases include Kafka's SslPrincipalMapperTest.
"""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.name import _ASN1Type
from cryptography.x509.oid import NameOID, ObjectIdentifier

from kbroker.config_registry import ConfigError
from kbroker.security.principal import (
    PrincipalMappingError,
    parse_mapping_rules,
    principal_of_certificate,
    subject_dn,
)

A = x509.NameAttribute
RDN = x509.RelativeDistinguishedName
KEY = ec.generate_private_key(ec.SECP256R1())


def certificate(name: x509.Name) -> bytes:
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(KEY.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(KEY, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.DER)


# (subject as encoded, most general first; the DN Java 17 writes)
DN_CASES = [
    (
        x509.Name(
            [
                A(NameOID.COUNTRY_NAME, "US"),
                A(NameOID.STATE_OR_PROVINCE_NAME, "CA"),
                A(NameOID.LOCALITY_NAME, "Palo Alto"),
                A(NameOID.ORGANIZATION_NAME, "Acme, Inc."),
                A(NameOID.ORGANIZATIONAL_UNIT_NAME, "Eng"),
                A(NameOID.COMMON_NAME, "alice"),
            ]
        ),
        "CN=alice,OU=Eng,O=Acme\\, Inc.,L=Palo Alto,ST=CA,C=US",
    ),
    (
        x509.Name([A(NameOID.COMMON_NAME, '#a=b+c<d>e;f"g\\h, i ')]),
        'CN=\\#a\\=b\\+c\\<d\\>e\\;f\\"g\\\\h\\, i\\ ',
    ),
    (x509.Name([A(NameOID.ORGANIZATION_NAME, "  lead"), A(NameOID.COMMON_NAME, " ")]), "CN=\\ ,O=\\ \\ lead"),
    (
        # a multi-valued RDN keeps its DER (sorted) order
        x509.Name(
            [
                RDN([A(NameOID.ORGANIZATION_NAME, "Org")]),
                RDN(
                    [
                        A(NameOID.COMMON_NAME, "bob"),
                        A(NameOID.USER_ID, "b42"),
                        A(NameOID.ORGANIZATIONAL_UNIT_NAME, "zz"),
                    ]
                ),
            ]
        ),
        "OU=zz+CN=bob+UID=b42,O=Org",
    ),
    (
        # emailAddress and serialNumber are no RFC 2253 keywords: dotted OID and the DER value in hex
        x509.Name(
            [
                A(NameOID.DOMAIN_COMPONENT, "com"),
                A(NameOID.DOMAIN_COMPONENT, "example"),
                A(NameOID.EMAIL_ADDRESS, "a@example.com"),
                A(NameOID.SERIAL_NUMBER, "1234"),
                A(NameOID.COMMON_NAME, "Ünïcødé ☃"),
            ]
        ),
        "CN=Ünïcødé ☃,2.5.4.5=#130431323334,1.2.840.113549.1.9.1=#160d61406578616d706c652e636f6d,DC=example,DC=com",
    ),
    (
        # a BMPString is read as UTF-8 bytes by Java (its NULs written \00); unknown OIDs in hex
        x509.Name(
            [
                A(NameOID.TITLE, "Boss"),
                A(NameOID.GIVEN_NAME, "Al"),
                A(NameOID.STREET_ADDRESS, "1 Main St"),
                A(ObjectIdentifier("1.2.3.4.5"), "x"),
                A(NameOID.COMMON_NAME, "bmp", _type=_ASN1Type.BMPString),
            ]
        ),
        "CN=\\00b\\00m\\00p,1.2.3.4.5=#0c0178,STREET=1 Main St,2.5.4.42=#0c02416c,2.5.4.12=#0c04426f7373",
    ),
]


@pytest.mark.parametrize(("name", "expected"), DN_CASES)
def test_subject_dn_is_what_java_writes(name: x509.Name, expected: str) -> None:
    assert subject_dn(certificate(name)) == expected


def test_no_certificate_is_anonymous() -> None:
    assert principal_of_certificate(None, "RULE:^CN=(.*)$/$1/") == "User:ANONYMOUS"


def test_principal_of_certificate_default_and_rules() -> None:
    der = certificate(x509.Name([A(NameOID.ORGANIZATION_NAME, "Acme"), A(NameOID.COMMON_NAME, "Alice")]))
    assert principal_of_certificate(der, "DEFAULT") == "User:CN=Alice,O=Acme"
    assert principal_of_certificate(der, "RULE:^CN=(.*?),O=.*$/$1/L") == "User:alice"
    rules = parse_mapping_rules("RULE:^CN=(.*?),O=Other$/$1/")
    with pytest.raises(PrincipalMappingError) as raised:
        principal_of_certificate(der, rules)
    assert str(raised.value) == (
        "Failed to map name for 'CN=Alice,O=Acme' based on SSL principal mapping rules. "
        "(No rules apply to CN=Alice,O=Acme, rules [RULE:^CN=(.*?),O=Other$/$1])"
    )


KAFKA_RULES = ", ".join(
    [
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
        "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
        "DEFAULT",
    ]
)

# (rules, DN, mapped name) as kafka-clients 4.3.1 maps them
MAPPING_CASES = [
    (KAFKA_RULES, "CN=Duke,OU=ServiceUsers,O=Org,C=US", "duke"),
    (KAFKA_RULES, "CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US", "duke@sme"),
    (KAFKA_RULES, "cn=duke,ou=sme,dc=mycp,dc=com", "DUKE@SME"),
    (KAFKA_RULES, "cN=duke,OU=JavaSoft,O=Sun Microsystems", "DUKE"),
    (KAFKA_RULES, "OU=JavaSoft,O=Sun Microsystems,C=US", "OU=JavaSoft,O=Sun Microsystems,C=US"),
    ("RULE:^CN=((\\\\, *|\\w)+)(,.*|$)/$1/,DEFAULT", "CN=Tkac\\, Adam,OU=ITZ,DC=geodis,DC=cz", "Tkac\\, Adam"),
    # references to missing groups stay literal ($3); $12 with 2 groups is $1 then "2"; $0 is the whole match
    ("RULE:^CN=(.*?),OU=(.*)$/$1-$3-$12-$21-$0/", "CN=x,OU=Other", "x-$3-x2-Other1-CN=x,OU=Other"),
    ("RULE:^CN=(?<name>[^,]*),.*$/${name}!/U", "CN=x,OU=Other", "X!"),
    # replaceAll replaces every match: empty matches too, moving on one character after each (Java, not re.sub)
    ("RULE:[a-z]*/-/", "abc", "--"),
    ("RULE:.*?/<$0>/", "ab", "<>a<>b<>"),
    ("RULE:CN=([^,]+).*/\\$1 is $1/", "CN=a,O=b", "$1 is a"),
    ("RULE:^CN=(.*?),O=(.*)$/$2\\/$1/, DEFAULT", "CN=a,O=b", "b/a"),
    ("RULE:^CN=(.*)$/$1/L", "CN=ÀÉ", "àé"),
    ("RULE:^CN=(\\w+)$/$1/", "CN=abc_1", "abc_1"),
    ("RULE:(?i)^cn=(.*)$/$1/", "CN=q", "q"),
    ("RULE:^\\QCN=a.b\\E(.*)$/$1/", "CN=a.bzz", "zz"),
]


@pytest.mark.parametrize(("rules", "dn", "expected"), MAPPING_CASES)
def test_mapping_rules_as_kafka_maps(rules: str, dn: str, expected: str) -> None:
    assert parse_mapping_rules(rules).name_of(dn) == expected


# (rules, DN, Kafka's message) where Kafka finds no name
MAPPING_FAILURES = [
    (
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "CN=x,OU=Other",
        "No rules apply to CN=x,OU=Other, rules [RULE:^CN=(.*?),OU=ServiceUsers.*$/$1]",
    ),
    # Java's \w is ASCII
    ("RULE:^CN=(\\w+)$/$1/", "CN=Ünï", "No rules apply to CN=Ünï, rules [RULE:^CN=(\\w+)$/$1]"),
    ("RULE:^\\QCN=a.b\\E(.*)$/$1/", "CN=aXbzz", "No rules apply to CN=aXbzz, rules [RULE:^\\QCN=a.b\\E(.*)$/$1]"),
    ("", "CN=a", "No rules apply to CN=a, rules []"),
    ("RULE:CN=(.*)/$/", "CN=a", "Illegal group reference: group index is missing"),
    ("RULE:CN=.*/$1/", "CN=a", "No group 1"),
    ("RULE:^CN=(.*?)$/${nope}/", "CN=a", "No group with name {nope}"),
]


@pytest.mark.parametrize(("rules", "dn", "message"), MAPPING_FAILURES)
def test_mapping_failures_as_kafka(rules: str, dn: str, message: str) -> None:
    with pytest.raises(PrincipalMappingError) as raised:
        parse_mapping_rules(rules).name_of(dn)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    "rules",
    [
        "DEFAULT",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
        "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U",
        "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/",
        "RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/",
    ],
)
def test_valid_rules(rules: str) -> None:
    parse_mapping_rules(rules)


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ("default", "Invalid rule: `default`, unmatched substring: `default`"),
        ("DEFAUL", "Invalid rule: `DEFAUL`, unmatched substring: `DEFAUL`"),
        ("DEFAULT/L", "Invalid rule: `DEFAULT/L`, unmatched substring: `/L`"),
        ("DEFAULT/U", "Invalid rule: `DEFAULT/U`, unmatched substring: `/U`"),
        ("RULE:CN=(.*?),OU=ServiceUsers.*/$1", None),
        ("rule:^CN=(.*?),OU=ServiceUsers.*$/$1/", None),
        (
            "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
            "Invalid rule: `RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U`, unmatched substring: `/U`",
        ),
        ("RULE:^CN=(.*?),OU=ServiceUsers.*$/L", None),
        ("RULE:^CN=(.*?),OU=ServiceUsers.*$/U", None),
        ("RULE:^CN=(.*?),OU=ServiceUsers.*$/LU", None),
    ],
)
def test_invalid_rules(rules: str, message: str | None) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_mapping_rules(rules)
    text = str(raised.value)
    assert text.startswith("ssl.principal.mapping.rules: Invalid rule: `")
    if message is not None:
        assert text == f"ssl.principal.mapping.rules: {message}"


def test_bad_pattern_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"^ssl.principal.mapping.rules: bad pattern in rule `RULE:\(/x/`"):
        parse_mapping_rules("RULE:(/x/")


@pytest.mark.parametrize(
    ("expected", "rules"),
    [
        ("[]", ""),
        ("[DEFAULT]", "DEFAULT"),
        ("[RULE:/]", "RULE://"),
        ("[RULE:/.*]", "RULE:/.*/"),
        ("[RULE:/.*/L]", "RULE:/.*/L"),
        ("[RULE:/, DEFAULT]", "RULE://,DEFAULT"),
        ("[RULE:/, DEFAULT]", "  RULE:// ,  DEFAULT  "),
        ("[RULE:   /     , DEFAULT]", "  RULE:   /     / ,  DEFAULT  "),
        ("[RULE:  /     /U, DEFAULT]", "  RULE:  /     /U   ,DEFAULT  "),
        ("[RULE:([A-Z]*)/$1/U, RULE:([a-z]+)/$1, DEFAULT]", "  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  "),
        ("[]", ",   , , ,      , , ,   "),
        ("[RULE:/, DEFAULT]", ",,RULE://,,,DEFAULT,,"),
        ("[RULE: /   , DEFAULT]", ",  , RULE: /   /    ,,,   DEFAULT, ,   "),
        ("[RULE:   /  /U, DEFAULT]", "     ,  , RULE:   /  /U    ,,  ,DEFAULT, ,"),
        ("[RULE:\\/\\\\\\(\\)\\n\\t/\\/\\/]", "RULE:\\/\\\\\\(\\)\\n\\t/\\/\\//"),
        ("[RULE:\\**\\/+/*/L, RULE:\\/*\\**/**]", "RULE:\\**\\/+/*/L,RULE:\\/*\\**/**/"),
        (
            "[RULE:,RULE:,/,RULE:,\\//U, RULE:,/RULE:,, RULE:,RULE:,/L,RULE:,/L, RULE:, DEFAULT, /DEFAULT, DEFAULT]",
            "RULE:,RULE:,/,RULE:,\\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,RULE:, DEFAULT, /DEFAULT/,DEFAULT",
        ),
    ],
)
def test_rules_splitting_as_kafka(expected: str, rules: str) -> None:
    """Kafka's testRulesSplitting: the parsed list, written as SslPrincipalMapper.toString writes it."""
    assert str(parse_mapping_rules(rules)) == f"SslPrincipalMapper(rules = {expected})"
