"""kbroker: a Kafka-compatible broker written in Python."""

import time as _time

__version__ = "0.1.0"

# Where /proc/self/stat cannot say when the process started, the ready line counts from here (kbroker.cli).
IMPORTED_AT = _time.perf_counter()
