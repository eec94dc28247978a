"""Security: who a client is (TLS and SASL authentication) and what it may do (ACLs), as Kafka does both.

- ``tls``: the SSLContext of an SSL or SASL_SSL listener from Kafka's ``ssl.*`` settings (PEM or PKCS12 key and
  trust stores, ``ssl.client.auth``, protocols and cipher suites); ``principal``: the principal of a client
  certificate's distinguished name under ``ssl.principal.mapping.rules``; ``certs``: a throwaway CA and broker
  certificate for local TLS (``kbroker certs``).
- ``sasl``: the SASL mechanisms, sans-I/O (PLAIN, SCRAM-SHA-256/512, OAUTHBEARER with Kafka's unsecured JWS
  validator) and JAAS config parsing; ``scram_credentials``: the salted SCRAM credentials of the metadata image,
  which AlterUserScramCredentials changes through the controller. The connection's side of the exchange
  (SaslHandshake, SaslAuthenticate, re-authentication) is kbroker/security/authenticator.py.
- ``acls``: ACL bindings and filters, resource and pattern matching, operation implication; ``authorizer``: Kafka's
  StandardAuthorizer semantics (``super.users``, ``allow.everyone.if.no.acl.found``, deny over allow) over the
  stored ACLs that CreateAcls and DeleteAcls manage. Handlers ask through ``RequestContext.authorize``.
"""
