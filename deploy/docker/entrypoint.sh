#!/usr/bin/env bash
# The image's entrypoint: runs the Python coordinator with the arguments and the environment that
# CLP's deployments give the Rust `compression-coordinator`. The image installs it as
# /usr/local/bin/coordinator-entrypoint and links /opt/clp/bin/compression-coordinator to it, so
# CLP's unchanged command (`/opt/clp/bin/compression-coordinator --config /etc/clp-config.yaml`)
# starts the service.
#
#   entrypoint.sh [MODE] [--config PATH | -c PATH] [ARG...]
#
# MODE (default: run)
#   run                 exec coordinator run --config PATH [--log-level LEVEL] [ARG...]
#   db-upgrade|upgrade  exec coordinator db upgrade --config PATH [--log-level LEVEL] [ARG...]
#                       (the schema step, run once before the service starts)
#   health              exec coordinator health --config PATH [ARG...]
#                       (HEALTHCHECK, Kubernetes exec probes)
#   coordinator ARG...  exec coordinator ARG... (any other command, arguments unchanged)
#   help                print this text
#
# PATH defaults to /etc/clp-config.yaml, where CLP mounts its configuration. A first argument that
# names the Rust binary (`/opt/clp/bin/compression-coordinator`, as Compose passes CLP's command
# after the image's entrypoint) is dropped. Every other argument goes to the coordinator unchanged.
#
# Environment: CLP_DB_USER, CLP_DB_PASS, CLP_LOGS_DIR, OTEL_* and the rest pass through. RUST_LOG
# (CLP's logging level, e.g. INFO, or a tracing filter such as `info,compression_coordinator=debug`)
# becomes `--log-level` (not for `health`) unless COORDINATOR_LOG_LEVEL is set, which the
# coordinator reads itself: the level of the filter's directive for `compression_coordinator` if it
# has one, else the filter's default level; trace is debug, off is error.
#
# Each mode ends in `exec`: the coordinator is the container's process and receives its signals
# (SIGTERM from `docker stop` or Kubernetes) directly. Exit status 2: bad arguments.
set -euo pipefail

readonly NAME=${0##*/}
readonly DEFAULT_CONFIG=/etc/clp-config.yaml
readonly RUST_BINARY=/opt/clp/bin/compression-coordinator
readonly MODES="run, db-upgrade, upgrade, health, coordinator, help"

usage() { # the comment at the top of this file
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
}

fail() {
  echo "$NAME: $1" >&2
  exit 2
}

# The Python level of a tracing level (`trace` … `error`, `off`, or 0–5); nothing if unknown.
python_level() {
  case ${1,,} in
    trace | debug | 5 | 4) echo debug ;;
    info | 3) echo info ;;
    warn | warning | 2) echo warning ;;
    error | off | 1 | 0) echo error ;;
  esac
}

# The Python level that a RUST_LOG filter asks of the coordinator; nothing if it names none.
level_from_rust_log() {
  local default_level="" own_level="" directive target level
  local -a directives
  IFS=, read -r -a directives <<<"$1"
  for directive in "${directives[@]}"; do
    directive=${directive//[[:space:]]/}
    if [[ $directive == *=* ]]; then
      target=${directive%%=*}
      level=${directive##*=}
    elif [[ -n $(python_level "$directive") ]]; then
      default_level=$directive
      continue
    else
      target=$directive # a bare target: everything of it, down to trace
      level=trace
    fi
    target=${target%%\[*} # without a span filter: target[span{field=value}]
    if [[ $target == compression_coordinator || $target == compression_coordinator::* ]]; then
      own_level=$level
    fi
  done
  python_level "${own_level:-$default_level}"
}

mode=run
if (($# > 0)) && [[ $1 == "$RUST_BINARY" || $1 == compression-coordinator ]]; then
  shift
fi
if (($# > 0)) && [[ $1 != -* ]]; then
  mode=$1
  shift
fi

case $mode in
  help)
    usage
    exit 0
    ;;
  coordinator)
    exec coordinator "$@"
    ;;
  run | db-upgrade | upgrade | health) ;;
  *)
    fail "unknown mode '$mode' (modes: $MODES; '$NAME help' explains them)"
    ;;
esac

config=$DEFAULT_CONFIG
args=()
while (($# > 0)); do
  case $1 in
    -c | --config)
      (($# > 1)) || fail "$1 needs a path"
      config=$2
      shift 2
      ;;
    --config=*)
      config=${1#--config=}
      shift
      ;;
    -c?*)
      config=${1#-c}
      shift
      ;;
    --)
      args+=("$@")
      break
      ;;
    *)
      args+=("$1")
      shift
      ;;
  esac
done
[[ -n $config ]] || fail "--config needs a path"

log_level=()
if [[ -z ${COORDINATOR_LOG_LEVEL:-} && -n ${RUST_LOG:-} && $mode != health ]]; then
  level=$(level_from_rust_log "$RUST_LOG")
  if [[ -n $level ]]; then
    log_level=(--log-level "$level")
  else
    echo "$NAME: RUST_LOG='$RUST_LOG' names no log level; the coordinator's default applies" >&2
  fi
fi

case $mode in
  run)
    exec coordinator run --config "$config" "${log_level[@]}" "${args[@]}"
    ;;
  db-upgrade | upgrade)
    exec coordinator db upgrade --config "$config" "${log_level[@]}" "${args[@]}"
    ;;
  health)
    exec coordinator health --config "$config" "${args[@]}"
    ;;
esac
