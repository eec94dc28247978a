#!/bin/sh
# kbroker's container entrypoint: turns environment variables into `kbroker serve` arguments.
#
#   KBROKER_LISTENER                  HOST:PORT to listen on (default 0.0.0.0:9092); with KBROKER_CONFIG_LISTENERS
#                                     the config's listeners are served instead, and this names the one
#                                     the health check asks
#   KBROKER_ADVERTISED_LISTENER       HOST:PORT given to clients in Metadata (default: localhost and the
#                                     listener's port); port 0 means "the port actually bound"
#   KBROKER_ADVERTISED_LISTENER_FILE  wait for this file, then advertise the HOST:PORT it holds (set by
#                                     kbroker.testcontainers.KBrokerContainer once Docker has mapped the port)
#   KBROKER_DATA_DIR                  log directory (default /var/lib/kbroker/data, the image's volume)
#   KBROKER_LOG_LEVEL                 DEBUG, INFO (default), WARNING or ERROR
#   KBROKER_CONFIG_<KEY>              any server.properties key, upper case with dots as underscores:
#                                     KBROKER_CONFIG_NUM_PARTITIONS=3 is num.partitions=3
#   KBROKER_CLUSTER_ID                a broker of a KRaft cluster (KBROKER_CONFIG_PROCESS_ROLES=broker): its
#                                     data directory is formatted for this cluster id and
#                                     KBROKER_CONFIG_NODE_ID first (kbroker format; kept as is once formatted)
#
# Arguments: none or options (added to `kbroker serve`); `health` (the image's health check: ApiVersions and
# Metadata against the listener's port on this host); anything else is run as a command.
set -eu

listener="${KBROKER_LISTENER:-0.0.0.0:9092}"

if [ "${1:-}" = "health" ]; then
    shift
    address="${listener#*://}"
    host="${address%:*}"
    case "$host" in
        "" | 0.0.0.0 | "::" | "[::]") host=127.0.0.1 ;;  # listening everywhere: ask on loopback
    esac
    exec kbroker health --bootstrap "${host}:${address##*:}" "$@"
fi

if [ "$#" -gt 0 ] && [ "${1#-}" = "$1" ]; then
    exec "$@"
fi

advertised="${KBROKER_ADVERTISED_LISTENER:-}"
if [ -n "${KBROKER_ADVERTISED_LISTENER_FILE:-}" ]; then
    echo "kbroker-entrypoint: waiting for ${KBROKER_ADVERTISED_LISTENER_FILE}" >&2
    while [ ! -s "$KBROKER_ADVERTISED_LISTENER_FILE" ]; do
        sleep 0.1
    done
    advertised="$(cat "$KBROKER_ADVERTISED_LISTENER_FILE")"
fi

# Options go in front of the caller's, so a caller's --override can still win over the environment.
for name in $(env | sed -n 's/^KBROKER_CONFIG_\([A-Za-z0-9_]*\)=.*/\1/p' | sort); do
    eval "value=\${KBROKER_CONFIG_${name}}"
    key="$(printf '%s' "$name" | tr 'A-Z_' 'a-z.')"
    set -- --override "${key}=${value}" "$@"
done
if [ -n "$advertised" ]; then
    set -- --advertised-listener "$advertised" "$@"
fi

if [ -z "${KBROKER_CONFIG_LISTENERS:-}" ]; then
    set -- --listen "$listener" "$@"
fi
data_dir="${KBROKER_DATA_DIR:-/var/lib/kbroker/data}"
if [ -n "${KBROKER_CLUSTER_ID:-}" ]; then
    kbroker format --cluster-id "$KBROKER_CLUSTER_ID" --dir "$data_dir" --ignore-formatted \
        --node-id "${KBROKER_CONFIG_NODE_ID:?is needed with KBROKER_CLUSTER_ID}" >&2
fi

exec kbroker serve \
    --data-dir "$data_dir" \
    --log-level "${KBROKER_LOG_LEVEL:-INFO}" \
    "$@"
