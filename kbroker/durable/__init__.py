"""Durable files of the broker: checked, atomically written files (``files``), the append-only journal
(``journal``) and ``fs``, the one seam every write, fsync, truncate, rename and unlink goes through (tests
install a faulty file system there). Storage, the coordinators, security and quotas all use them; this package
imports nothing else of kbroker, so none of them reaches into kbroker/storage for them.
"""
