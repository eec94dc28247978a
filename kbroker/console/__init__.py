"""kbroker's web console: cluster overview, topics, a message browser, consumer groups, creating and deleting
topics. ``app`` serves the pages (Starlette + Jinja2 on hypercorn's trio worker), ``cluster`` reads the cluster as
a Kafka client, ``formats`` shows record bytes as text, JSON or hex. Imported only when a console is asked for
(``kbroker console`` or ``kbroker serve --console``): the broker starts without the web stack."""
