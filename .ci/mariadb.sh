# Sourced by .ci/test: a private, throw-away MariaDB server for the test suite.
# mariadb_start sets MARIADB_RUN_DIR and COORDINATOR_TEST_MARIADB_URL; mariadb_stop removes it all.
# The server runs as root (--user=root), on 127.0.0.1 only, on a free non-default port.

mariadb_available() {
  command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ]
}

# mariadb-server for the MariaDB half of the suite, graphviz for the SVG diagram: installed with
# apt-get when missing and running as root; otherwise left to the caller.
install_system_packages() {
  local missing=()
  mariadb_available || missing+=(mariadb-server)
  command -v dot >/dev/null 2>&1 || missing+=(graphviz)
  [ "${#missing[@]}" -gt 0 ] || return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "Installing ${missing[*]} with apt-get..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

mariadb_start() {
  local port mariadbd
  mariadbd=$(command -v mariadbd || echo /usr/sbin/mariadbd)
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
  MARIADB_RUN_DIR=$(mktemp -d /tmp/coordinator-mariadb.XXXXXX)
  cat >"$MARIADB_RUN_DIR/my.cnf" <<CNF
[mariadbd]
datadir=$MARIADB_RUN_DIR/data
socket=$MARIADB_RUN_DIR/mariadb.sock
port=$port
bind-address=127.0.0.1
pid-file=$MARIADB_RUN_DIR/mariadb.pid
log-error=$MARIADB_RUN_DIR/error.log
user=root
skip-name-resolve
innodb_buffer_pool_size=256M
innodb_flush_log_at_trx_commit=2
max_connections=500
CNF
  mariadb-install-db --defaults-file="$MARIADB_RUN_DIR/my.cnf" --user=root \
    --auth-root-authentication-method=normal --skip-test-db >"$MARIADB_RUN_DIR/install.log" 2>&1
  "$mariadbd" --defaults-file="$MARIADB_RUN_DIR/my.cnf" >/dev/null 2>&1 &
  local tries=0
  until mariadb-admin --socket="$MARIADB_RUN_DIR/mariadb.sock" -uroot ping >/dev/null 2>&1; do
    tries=$((tries + 1))
    if [ "$tries" -gt 300 ]; then
      echo "MariaDB did not start; its log:" >&2
      cat "$MARIADB_RUN_DIR/error.log" >&2
      return 1
    fi
    sleep 0.1
  done
  mariadb --socket="$MARIADB_RUN_DIR/mariadb.sock" -uroot -e \
    "CREATE USER 'coordinator'@'127.0.0.1' IDENTIFIED BY 'coordinator';
     GRANT ALL ON *.* TO 'coordinator'@'127.0.0.1' WITH GRANT OPTION;"
  export COORDINATOR_TEST_MARIADB_URL="mysql+pymysql://coordinator:coordinator@127.0.0.1:$port/"
  echo "Private MariaDB on 127.0.0.1:$port ($MARIADB_RUN_DIR): $(mariadb --version)"
}

mariadb_stop() {
  [ -n "${MARIADB_RUN_DIR:-}" ] || return 0
  mariadb-admin --socket="$MARIADB_RUN_DIR/mariadb.sock" -uroot shutdown >/dev/null 2>&1 || true
  local tries=0
  while [ -e "$MARIADB_RUN_DIR/mariadb.pid" ] && [ "$tries" -lt 100 ]; do
    tries=$((tries + 1))
    sleep 0.1
  done
  rm -rf "$MARIADB_RUN_DIR"
  MARIADB_RUN_DIR=
}
