#!/usr/bin/env bash
# Registers WorkManager's search attributes in a Temporal namespace.
# Usage: deploy/temporal/search-attributes.sh [--address host:port] [--namespace ns]
set -euo pipefail
temporal=${TEMPORAL:-temporal}
for name in WorkerId WorkerTopic WorkerGroup WorkerStatus WorkerTenant; do
  "$temporal" operator search-attribute create --name "$name" --type Keyword "$@" || true
done
