#!/usr/bin/env bash
# Registers WorkManager's search attributes in a Temporal namespace, by
# hand: the API does the same at every start (internal/temporalconn) and
# reports on /health when it cannot. Use this where the API may not (an
# authorizer that refuses it), from a place that reaches the frontend
# (inside the cluster: e.g. the Helm chart's admin-tools pod).
# Idempotent: an attribute already registered as Keyword is left alone;
# any other failure stops the script with the CLI's error.
# Usage: deploy/temporal/search-attributes.sh [--address host:port] [--namespace ns] [other temporal CLI flags]
set -euo pipefail
temporal=${TEMPORAL:-temporal}
existing=$("$temporal" operator search-attribute list "$@")
for name in WorkerId WorkerTopic WorkerGroup WorkerStatus WorkerTenant; do
  if grep -Eq "^[[:space:]]*${name}[[:space:]]+Keyword[[:space:]]*$" <<<"$existing"; then
    echo "$name: already registered"
    continue
  fi
  if grep -Eq "^[[:space:]]*${name}[[:space:]]" <<<"$existing"; then
    echo "$name is registered with another type than Keyword: remove it first" >&2
    exit 1
  fi
  "$temporal" operator search-attribute create --name "$name" --type Keyword "$@"
  echo "$name: registered"
done
