#!/usr/bin/env bash
# Fetch Delta Lake's jars from Maven Central with Maven into a folder (make's .cache/jars):
#   fetch-delta-jars.sh DIR GROUP:ARTIFACT:VERSION ...
# Maven's own resolver reaches the registry where Spark's Ivy may not; the jars then go to Spark
# as spark.jars (PGLOGREPL_DELTA_JARS). Idempotent: a jar already there is kept.
set -euo pipefail
dir="$1"
shift
mkdir -p "$dir"
for artifact in "$@"; do
  IFS=: read -r _group name version <<<"$artifact"
  if [ -f "$dir/$name-$version.jar" ]; then continue; fi
  echo "fetch-delta-jars: $artifact"
  mvn -q -B dependency:copy -Dartifact="$artifact" -DoutputDirectory="$dir" \
    -Dmdep.overWriteIfNewer=true
done
