"""Moving a data directory written before the metadata log onto it, once, at start-up.

Older kbrokers kept topics (ids, partition counts, config overrides) in ``topics.json``. At the first start on
this code its topics are written into the metadata log with the same topic ids, in one metadata transaction, and
the file is then renamed ``topics.json.migrated`` (kept for the operator, never read again). A crash between the
two leaves both: the next start finds the topics already in the log with the same ids and only renames the file;
a crash inside the transaction leaves it open, and the controller aborts it at the next start, which migrates
again. A topics.json that cannot be read, or that names a topic the log has under another id, stops start-up
with one line and changes nothing. A data directory with partition directories but neither topics.json nor a
metadata log has its topics rebuilt from the directories' ``partition.metadata``, as before.

ACLs, which older kbrokers kept in the checked file ``acls``, move the same way: its bindings are written as
AccessControlEntryRecords in one metadata transaction (those already in the log skipped, so a crash before the
rename only renames at the next start), and the file is renamed ``acls.migrated``. A damaged ACL file stops
start-up with one line and changes nothing.

SCRAM credentials (``scram-credentials``) and client quotas (``client-quotas``) move the same way, as
UserScramCredentialRecords and ClientQuotaRecords (what the log already holds skipped), each file renamed
``.migrated`` after its records are committed; the names of the users ``--sasl-user`` created, the one thing
about them that is not cluster metadata, are kept in ``sasl-users`` (kbroker/security/scram_credentials.py).

Finalized features, which older kbrokers kept in ``finalized-features.json`` (a level per feature finalized above
0; without the file, the defaults), become FeatureLevelRecords the same way, and the file is renamed
``finalized-features.json.migrated``. A metadata log such a kbroker wrote names only metadata.version, so without
the file the defaults it answered with are written. The next producer id block's start, which older kbrokers kept
in ``producer-id-block`` (fsynced before any id below it was handed out), becomes a ProducerIdsRecord, so no id is
handed out twice; the file is renamed ``producer-id-block.migrated``. Either file damaged stops start-up with one
line and changes nothing.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from kbroker.durable.files import DamagedFileError, StorageError, fsync_directory, read_checked_json, read_offset_file
from kbroker.metadata.controller import LocalController
from kbroker.metadata.features import DEFAULT_LEVELS
from kbroker.metadata.image import METADATA_VERSION_FEATURE
from kbroker.storage.manager import TOPICS_FILE, read_topics_file, topics_from_directories

log = logging.getLogger("kbroker.metadata")

MIGRATED_SUFFIX = ".migrated"
ACLS_FILE = "acls"  # where older kbrokers kept the ACLs (kbroker/security/authorizer.py reads it)
SCRAM_CREDENTIALS_FILE = "scram-credentials"  # kbroker/security/scram_credentials.py reads it
CLIENT_QUOTAS_FILE = "client-quotas"  # kbroker/quotas.py reads it
SASL_USERS_FILE = "sasl-users"  # the names of the users --sasl-user created (kbroker/security/scram_credentials.py)
FEATURES_FILE = "finalized-features.json"  # where older kbrokers kept the finalized feature levels
_FEATURES_FILE_KIND, _FEATURES_FILE_VERSION = "finalized-features", 1
PRODUCER_ID_BLOCK_FILE = "producer-id-block"  # where older kbrokers kept the next producer id block's start


def migrate_topic_catalog(controller: LocalController, data_dir: Path, *, fresh: bool) -> None:
    """``fresh``: no start on the metadata log got as far as registering this broker."""
    path = data_dir / TOPICS_FILE
    if path.exists():
        _, topics = read_topics_file(path)
        source = str(path)
    elif fresh:
        topics = topics_from_directories(data_dir)
        source = f"the partition directories of {data_dir} (topic config overrides could not be recovered)"
    else:
        return
    try:
        written = controller.migrate_topics((t.name, t.topic_id, t.partitions, t.configs) for t in topics)
    except StorageError as exc:
        if not path.exists():
            raise
        raise StorageError(
            f"{path}: {exc}; move {path} out of the data directory if the metadata log is right"
        ) from None
    if written:
        log.warning("moved %d topic(s) from %s into the metadata log", written, source)
    if path.exists():
        os.replace(path, path.with_name(TOPICS_FILE + MIGRATED_SUFFIX))
        fsync_directory(data_dir)


def migrate_acl_file(controller: LocalController, data_dir: Path) -> None:
    path = data_dir / ACLS_FILE
    if not path.exists():
        return
    from kbroker.security.authorizer import read_acl_file  # only for a data directory that has the file

    written = controller.migrate_acls(read_acl_file(path))
    if written:
        log.warning("moved %d ACL(s) from %s into the metadata log", written, path)
    os.replace(path, path.with_name(ACLS_FILE + MIGRATED_SUFFIX))
    fsync_directory(data_dir)


def migrate_older_files(controller: LocalController, data_dir: Path) -> None:
    """The SCRAM credentials and client quotas files of an older kbroker, each moved into the metadata log once
    (their modules are imported only for a data directory that has the file)."""
    if (data_dir / SCRAM_CREDENTIALS_FILE).exists():
        from kbroker.security.scram_credentials import migrate_credentials_file

        written = migrate_credentials_file(controller, data_dir)
        if written:
            log.warning("moved %d SCRAM credential(s) from %s into the metadata log", written, SCRAM_CREDENTIALS_FILE)
    path = data_dir / CLIENT_QUOTAS_FILE
    if path.exists():
        from kbroker.quotas import quota_record, read_quotas_file

        stored = controller.image.client_quotas
        records = [
            quota_record(entity, key, value)
            for entity, values in sorted(read_quotas_file(path).items(), key=lambda item: repr(item[0]))
            for key, value in sorted(values.items())
            if stored.get(entity, {}).get(key) != value
        ]
        if records:
            controller.commit_now(records, transaction="migration of the client quotas file")
            log.warning("moved %d client quota(s) from %s into the metadata log", len(records), path)
        os.replace(path, path.with_name(CLIENT_QUOTAS_FILE + MIGRATED_SUFFIX))
        fsync_directory(data_dir)


def written_before_features(controller: LocalController) -> bool:
    """The metadata log was written by a kbroker that kept features elsewhere: it holds records (not a new log),
    no snapshot, and no FeatureLevelRecord but metadata.version's. Asked before ``bootstrap``."""
    image = controller.image
    return (
        image.metadata_version != 0
        and not controller.loaded_snapshot
        and controller.replayed_features <= {METADATA_VERSION_FEATURE}
    )


def migrate_features(controller: LocalController, data_dir: Path, *, older_log: bool) -> None:
    """``older_log``: ``written_before_features`` said so before bootstrap."""
    path = data_dir / FEATURES_FILE
    if path.exists():
        _, document = read_checked_json(path, _FEATURES_FILE_KIND, {_FEATURES_FILE_VERSION})
        try:
            levels = {str(name): int(level) for name, level in document["levels"].items()}
        except (KeyError, TypeError, ValueError, AttributeError):
            raise DamagedFileError(path, "its levels are not feature names with integer levels") from None
        source = str(path)
    elif older_log:
        levels, source = dict(DEFAULT_LEVELS), "the defaults of older kbrokers"
    else:
        return
    written = controller.migrate_features(levels)
    if written:
        log.warning("moved %d feature level(s) from %s into the metadata log", written, source)
    if path.exists():
        os.replace(path, path.with_name(FEATURES_FILE + MIGRATED_SUFFIX))
        fsync_directory(data_dir)


def migrate_producer_id_block(controller: LocalController, data_dir: Path, broker_id: int) -> None:
    """After this broker registered (the ProducerIdsRecord names its epoch)."""
    path = data_dir / PRODUCER_ID_BLOCK_FILE
    if not path.exists():
        return
    next_producer_id = read_offset_file(path, PRODUCER_ID_BLOCK_FILE, "the next producer id")
    if controller.migrate_producer_ids(next_producer_id, broker_id):
        log.warning("moved the next producer id block (from %d) from %s into the metadata log", next_producer_id, path)
    os.replace(path, path.with_name(PRODUCER_ID_BLOCK_FILE + MIGRATED_SUFFIX))
    fsync_directory(data_dir)
