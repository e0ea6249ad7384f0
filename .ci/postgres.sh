#!/usr/bin/env bash
# A throwaway PostgreSQL server for tests and benchmarks: Debian's package, one cluster in DIR, loopback only.
#
#   .ci/postgres.sh start DIR [PORT]   install the server if missing (root: apt-get), initdb into DIR/data,
#                                      start it on 127.0.0.1:PORT (default: a free port), create the database
#                                      "gradebook"; prints its SQLAlchemy URL on stdout
#   .ci/postgres.sh stop DIR           stop that server (DIR itself is the caller's to remove)
#
# Trust authentication on loopback and fsync off: a test server that holds nothing worth keeping. As root, the
# server runs as Debian's `postgres` user (PostgreSQL refuses to run as root) and DIR is handed to it.
set -euo pipefail

die() { echo "postgres.sh: $*" >&2; exit 1; }

server_bin() {
  # Debian installs each major version's server programs under /usr/lib/postgresql/<version>/bin
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

install_server() {
  [ -n "$(server_bin)" ] && [ -x "$(server_bin)/initdb" ] && return 0
  [ "$(id -u)" -eq 0 ] || die "PostgreSQL is not installed; run: sudo apt-get install postgresql"
  echo "postgres.sh: installing Debian's postgresql (once)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends postgresql >&2
  [ -x "$(server_bin)/initdb" ] || die "apt-get installed postgresql but no initdb was found"
}

# Run a server program as the user that owns the cluster.
as_owner() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
  local dir=$1 port=${2:-}
  install_server
  local bin
  bin=$(server_bin)
  port=${port:-$(free_port)}
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  [ "$(id -u)" -eq 0 ] && chown -R postgres: "$dir"
  as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth=trust --encoding=UTF8 --no-locale >"$dir/initdb.log" 2>&1 \
    || die "initdb failed: $(tail -n 5 "$dir/initdb.log")"
  # the socket in DIR, not /var/run/postgresql: no clash with a system server or another test's
  as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=50" start >/dev/null \
    || die "the server did not start: $(tail -n 5 "$dir/server.log")"
  as_owner "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres gradebook \
    || die "createdb failed: $(tail -n 5 "$dir/server.log")"
  echo "postgresql://postgres@127.0.0.1:$port/gradebook"
}

stop() {
  local dir=$1
  [ -d "$dir/data" ] || return 0
  as_owner "$(server_bin)/pg_ctl" -D "$dir/data" -m immediate -w -t 60 stop >/dev/null 2>&1 || true
}

cmd=${1:-}
case "$cmd" in
  start) [ $# -ge 2 ] || die "usage: $0 start DIR [PORT]"; start "$2" "${3:-}" ;;
  stop)  [ $# -ge 2 ] || die "usage: $0 stop DIR"; stop "$2" ;;
  *) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; [ -z "$cmd" ] || exit 2 ;;
esac
