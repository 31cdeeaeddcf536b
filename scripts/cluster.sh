#!/usr/bin/env bash
# A real three-node RabbitMQ cluster on this machine, beside the main broker.
#
# Three nodes of the installed broker (/usr/lib/rabbitmq/bin/rabbitmq-server,
# the one rabbit@localhost runs; no containers), run as the rabbitmq user so
# they share its Erlang cookie (/var/lib/rabbitmq/.erlang.cookie):
#
#   node                    AMQP   management  Erlang distribution
#   ot-cluster-1@localhost  5681   15681       25681
#   ot-cluster-2@localhost  5682   15682       25682
#   ot-cluster-3@localhost  5683   15683       25683
#
# Each node has its own config, enabled-plugins file, data and logs under
# $OT_CLUSTER_BASE/<n> (default /var/lib/rabbitmq/ot-cluster), listens on
# 127.0.0.1 only, and has the management plugin (and the delayed-message
# plugin when the broker has it). Nodes 2 and 3 join node 1. guest/guest works
# since every client is local. The main broker (rabbit@localhost, 5672/15672)
# is left alone. Needs root.
#
# Usage: scripts/cluster.sh COMMAND [N]
#   start        start the cluster (idempotent), print its URLs and members
#   stop         stop the nodes and remove their directories (idempotent)
#   status       which nodes run; exit 0 when all three do, 1 otherwise
#   stop-app N   rabbitmqctl stop_app on node N (1..3); its VM keeps running
#   start-app N  rabbitmqctl start_app on node N, wait until it runs
#   kill N       SIGKILL node N's Erlang VM, wait until it is gone
#   restart N    start node N again after a kill (it keeps its data and
#                rejoins the cluster by itself), wait until it is back
#   replace N    after a kill: node N's data is lost; it is forgotten by the
#                cluster, started empty and joined again (a node replaced)
#
# Environment: OT_CLUSTER_BASE (directory of the nodes' files),
# OT_CLUSTER_TIMEOUT (seconds to wait for a node, default 90).
set -euo pipefail

BASE=${OT_CLUSTER_BASE:-/var/lib/rabbitmq/ot-cluster}
TIMEOUT=${OT_CLUSTER_TIMEOUT:-90}
RABBITMQ_BIN=/usr/lib/rabbitmq/bin
NODES=(1 2 3)

usage() {
    sed -n '/^# Usage:/,/^# Environment:/p' "$0" | sed -e 's/^# \{0,1\}//' | sed '$d'
}

die() { echo "cluster: $*" >&2; exit 1; }
say() { echo "cluster: $*"; }

# Everything specific to node N, in one place: start and restart both use it.
node_name() { echo "ot-cluster-$1@localhost"; }
amqp_port() { echo $((5680 + $1)); }
mgmt_port() { echo $((15680 + $1)); }
dist_port() { echo $((25680 + $1)); }
node_dir() { echo "$BASE/$1"; }

# The environment rabbitmq-server runs with, as `export` lines.
node_env() {
    local n=$1 dir
    dir=$(node_dir "$n")
    cat <<EOF
export RABBITMQ_NODENAME=$(node_name "$n")
export RABBITMQ_DIST_PORT=$(dist_port "$n")
export RABBITMQ_CONFIG_FILE=$dir/rabbitmq.conf
export RABBITMQ_ADVANCED_CONFIG_FILE=$dir/advanced.config
export RABBITMQ_CONF_ENV_FILE=$dir/rabbitmq-env.conf
export RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins
export RABBITMQ_MNESIA_BASE=$dir/mnesia
export RABBITMQ_LOG_BASE=$dir/log
export RABBITMQ_PID_FILE=$dir/node.pid
export ERL_EPMD_ADDRESS=127.0.0.1
export ERL_FLAGS='-kernel inet_dist_use_interface {127,0,0,1}'
export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS='-ot_cluster_node $(node_name "$n")'
EOF
}

# The delayed-message plugin, when the broker's plugin directories hold it.
delayed_plugin_installed() {
    local d
    for d in /usr/lib/rabbitmq/plugins /usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins; do
        compgen -G "$d/rabbitmq_delayed_message_exchange*" >/dev/null && return 0
    done
    return 1
}

# Writes node N's files (config, plugins, env file) and its directories.
prepare_node() {
    local n=$1 dir plugins=rabbitmq_management
    dir=$(node_dir "$n")
    mkdir -p "$dir/mnesia" "$dir/log"
    delayed_plugin_installed && plugins="$plugins,rabbitmq_delayed_message_exchange"
    cat >"$dir/rabbitmq.conf" <<EOF
# $(node_name "$n"), written by scripts/cluster.sh
listeners.tcp.local = 127.0.0.1:$(amqp_port "$n")
management.tcp.ip = 127.0.0.1
management.tcp.port = $(mgmt_port "$n")
cluster_name = ot-cluster
EOF
    echo "[$plugins]." >"$dir/enabled_plugins"
    # Replaces /etc/rabbitmq/rabbitmq-env.conf, which names the main node.
    node_env "$n" | sed -e 's/^export //' >"$dir/rabbitmq-env.conf"
    chown -R rabbitmq:rabbitmq "$BASE"
}

# The pid of node N's Erlang VM (beam.smp), found by the RABBITMQ_NODENAME in
# its environment: rabbitmq-server 3.10 starts distribution from inside the VM,
# so no -sname is on the command line (only our -ot_cluster_node marker).
node_pid() {
    local want pid
    want="RABBITMQ_NODENAME=$(node_name "$1")"
    for pid in $(pgrep -x beam.smp || true); do
        if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qxF "$want"; then
            echo "$pid"
            return 0
        fi
    done
    return 1
}

ctl() { rabbitmqctl "$@"; }

# rabbitmqctl, its output shown only when it fails (join_cluster logs harmless
# feature-flag warnings and "Failed to create a tracked connection table").
ctl_quiet() {
    local out
    out=$(rabbitmqctl "$@" 2>&1) || { echo "$out" >&2; die "rabbitmqctl $* failed"; }
}

# 0 when the rabbit application runs on node N.
app_running() {
    rabbitmq-diagnostics -q -n "$(node_name "$1")" check_running >/dev/null 2>&1
}

log_tail() {
    local n=$1 f
    f="$(node_dir "$n")/log/$(node_name "$n").log"
    echo "--- last lines of $f:" >&2
    tail -n 30 "$f" >&2 2>/dev/null || echo "(no log)" >&2
    f="$(node_dir "$n")/log/startup_log"
    if [ -s "$f" ]; then echo "--- $f:" >&2; tail -n 15 "$f" >&2; fi
}

# Waits until the rabbit application runs on node N, or fails after $TIMEOUT s.
wait_running() {
    local n=$1 deadline
    deadline=$((SECONDS + TIMEOUT))
    until app_running "$n"; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            log_tail "$n"
            die "$(node_name "$n") is not running after ${TIMEOUT}s"
        fi
        if ! node_pid "$n" >/dev/null; then
            sleep 1
            node_pid "$n" >/dev/null || { log_tail "$n"; die "$(node_name "$n") exited while starting"; }
        fi
        sleep 2
    done
}

# Fails, naming the holder, when one of node N's ports is taken.
check_ports() {
    local n=$1 p holder
    for p in "$(amqp_port "$n")" "$(mgmt_port "$n")" "$(dist_port "$n")"; do
        holder=$(ss -Hltnp "( sport = :$p )" 2>/dev/null || true)
        [ -z "$holder" ] || die "port $p (for $(node_name "$n")) is taken: $holder"
    done
}

# Starts node N's VM with node_env, detached, as the rabbitmq user.
launch() {
    local n=$1 dir
    dir=$(node_dir "$n")
    check_ports "$n"
    # Not /usr/sbin/rabbitmq-server: as the rabbitmq user it writes the main
    # broker's /var/log/rabbitmq/startup_log.
    su rabbitmq -s /bin/bash -c "cd '$dir' && $(node_env "$n" | tr '\n' ';')
        exec $RABBITMQ_BIN/rabbitmq-server -detached >>'$dir/log/startup_log' 2>&1"
}

# The nodes node N's cluster has running, one a line.
running_nodes() {
    ctl -q -n "$(node_name "$1")" eval \
        'io:format("~s~n", [string:join([atom_to_list(N) || N <- rabbit_nodes:all_running()], "\n")]).' 2>/dev/null |
        grep '^ot-cluster' || true
}

# 0 when node N is a (disc) member of node 1's cluster, running or not.
is_member() {
    ctl -q -n "$(node_name 1)" eval 'io:format("~p~n", [rabbit_nodes:all()]).' 2>/dev/null |
        grep -qF "'$(node_name "$1")'"
}

# Waits until node N is among the running nodes its cluster reports.
wait_in_cluster() {
    local n=$1 deadline
    deadline=$((SECONDS + TIMEOUT))
    until running_nodes "$n" | grep -qxF "$(node_name "$n")" &&
        [ "$(running_nodes "$n" | wc -l)" -ge 2 ]; do
        [ "$SECONDS" -lt "$deadline" ] || { log_tail "$n"; die "$(node_name "$n") did not rejoin the cluster in ${TIMEOUT}s"; }
        sleep 2
    done
}

node_arg() {
    [[ ${1:-} =~ ^[123]$ ]] || die "a node number 1, 2 or 3 is needed (got '${1:-}')"
    echo "$1"
}

print_summary() {
    local n
    echo "AMQP:       $(for n in "${NODES[@]}"; do printf 'amqp://guest:guest@127.0.0.1:%s ' "$(amqp_port "$n")"; done)"
    echo "management: $(for n in "${NODES[@]}"; do printf 'http://127.0.0.1:%s ' "$(mgmt_port "$n")"; done)"
    echo "running nodes (rabbitmqctl -n $(node_name 1) cluster_status):"
    ctl -q -n "$(node_name 1)" cluster_status --formatter json 2>/dev/null |
        python3 -c 'import json,sys; [print("  " + n) for n in json.load(sys.stdin)["running_nodes"]]' ||
        ctl -n "$(node_name 1)" cluster_status
}

cmd_start() {
    local n started=()
    if [ "$(running_nodes 1 | wc -l)" -eq 3 ]; then
        say "already running with three nodes"
        print_summary
        return 0
    fi
    id rabbitmq >/dev/null 2>&1 || die "no rabbitmq user: is RabbitMQ installed?"
    [ -x "$RABBITMQ_BIN/rabbitmq-server" ] || die "$RABBITMQ_BIN/rabbitmq-server not found"
    for n in "${NODES[@]}"; do
        if node_pid "$n" >/dev/null; then continue; fi
        # Only a node that is down gets ports checked and its files (re)written.
        check_ports "$n"
    done
    for n in "${NODES[@]}"; do
        if node_pid "$n" >/dev/null; then
            say "$(node_name "$n") already up"
            continue
        fi
        prepare_node "$n"
        say "starting $(node_name "$n")"
        launch "$n"
        started+=("$n")
    done
    for n in "${NODES[@]}"; do
        if [[ " ${started[*]} " != *" $n "* ]] && ! app_running "$n"; then
            # A VM that was up, its app stopped (stop-app): start the app.
            say "starting the app of $(node_name "$n")"
            ctl -q -n "$(node_name "$n")" start_app
        fi
        wait_running "$n"
    done
    for n in 2 3; do
        if is_member "$n"; then continue; fi
        say "$(node_name "$n") joins $(node_name 1)"
        ctl_quiet -q -n "$(node_name "$n")" stop_app
        ctl_quiet -q -n "$(node_name "$n")" reset
        ctl_quiet -q -n "$(node_name "$n")" join_cluster "$(node_name 1)"
        ctl_quiet -q -n "$(node_name "$n")" start_app
        wait_running "$n"
    done
    [ "$(running_nodes 1 | wc -l)" -eq 3 ] || die "the cluster does not report three running nodes"
    say "cluster up"
    print_summary
}

# Stops node N's VM (gracefully, then SIGKILL after 30 s), if it runs.
stop_node() {
    local n=$1 pid deadline
    pid=$(node_pid "$n") || return 0
    say "stopping $(node_name "$n")"
    timeout 60 rabbitmqctl -q -n "$(node_name "$n")" stop >/dev/null 2>&1 || true
    deadline=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then
        say "$(node_name "$n") still running: SIGKILL of pid $pid"
        kill -KILL "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
    fi
}

cmd_stop() {
    local n any=
    for n in "${NODES[@]}"; do node_pid "$n" >/dev/null && any=1; done
    if [ -z "$any" ] && [ ! -e "$BASE" ]; then
        say "nothing running"
        return 0
    fi
    [ -n "$any" ] || say "no node running"
    # Nodes 3 and 2 first, so node 1 is the last one stopped.
    for n in 3 2 1; do stop_node "$n"; done
    for n in "${NODES[@]}"; do
        ! node_pid "$n" >/dev/null || die "$(node_name "$n") is still running"
    done
    case $BASE in
    /*/*) rm -rf -- "$BASE" ;;
    *) die "refusing to remove '$BASE'" ;;
    esac
    say "stopped; removed $BASE"
}

cmd_status() {
    local n pid all=0
    for n in "${NODES[@]}"; do
        if ! pid=$(node_pid "$n"); then
            echo "$(node_name "$n"): down"
            all=1
        elif app_running "$n"; then
            echo "$(node_name "$n"): running (pid $pid, amqp $(amqp_port "$n"), management $(mgmt_port "$n"))"
        else
            echo "$(node_name "$n"): VM up (pid $pid), app stopped"
            all=1
        fi
    done
    for n in "${NODES[@]}"; do
        if app_running "$n"; then
            echo "cluster, as $(node_name "$n") sees it: $(running_nodes "$n" | tr '\n' ' ')"
            break
        fi
    done
    return "$all"
}

cmd_stop_app() {
    local n
    n=$(node_arg "${1:-}")
    node_pid "$n" >/dev/null || die "$(node_name "$n") is not running"
    ctl -q -n "$(node_name "$n")" stop_app
    say "$(node_name "$n"): app stopped"
}

cmd_start_app() {
    local n
    n=$(node_arg "${1:-}")
    node_pid "$n" >/dev/null || die "$(node_name "$n") is not running (after a kill: restart $n)"
    ctl -q -n "$(node_name "$n")" start_app
    wait_running "$n"
    say "$(node_name "$n"): app running"
}

cmd_kill() {
    local n pid deadline
    n=$(node_arg "${1:-}")
    pid=$(node_pid "$n") || { say "$(node_name "$n") is not running"; return 0; }
    kill -KILL "$pid"
    deadline=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null; do
        [ "$SECONDS" -lt "$deadline" ] || die "pid $pid of $(node_name "$n") survived SIGKILL"
        sleep 0.2
    done
    say "$(node_name "$n") killed (pid $pid)"
}

cmd_restart() {
    local n
    n=$(node_arg "${1:-}")
    [ -d "$(node_dir "$n")/mnesia" ] || die "$(node_name "$n") has no data in $(node_dir "$n"): use start"
    if node_pid "$n" >/dev/null; then
        say "$(node_name "$n") is already up"
        app_running "$n" || ctl -q -n "$(node_name "$n")" start_app
    else
        say "starting $(node_name "$n")"
        launch "$n"
    fi
    wait_running "$n"
    wait_in_cluster "$n"
    say "$(node_name "$n") back in the cluster: $(running_nodes "$n" | tr '\n' ' ')"
}

cmd_replace() {
    local n other=""
    n=$(node_arg "${1:-}")
    node_pid "$n" >/dev/null && die "$(node_name "$n") runs: kill $n first"
    for o in "${NODES[@]}"; do
        if [ "$o" != "$n" ] && node_pid "$o" >/dev/null && app_running "$o"; then
            other=$o
            break
        fi
    done
    [ -n "$other" ] || die "no other node runs to forget $(node_name "$n")"
    say "$(node_name "$other") forgets $(node_name "$n"); its data is removed"
    ctl_quiet -q -n "$(node_name "$other")" forget_cluster_node "$(node_name "$n")"
    rm -rf "$(node_dir "$n")"
    prepare_node "$n"
    say "starting $(node_name "$n") empty"
    launch "$n"
    wait_running "$n"
    ctl_quiet -q -n "$(node_name "$n")" stop_app
    ctl_quiet -q -n "$(node_name "$n")" reset
    ctl_quiet -q -n "$(node_name "$n")" join_cluster "$(node_name "$other")"
    ctl_quiet -q -n "$(node_name "$n")" start_app
    wait_running "$n"
    wait_in_cluster "$n"
    say "$(node_name "$n") replaced: $(running_nodes "$n" | tr '\n' ' ')"
}

main() {
    local cmd=${1:-}
    [ $# -gt 0 ] && shift
    case $cmd in
    start | stop | status | stop-app | start-app | kill | restart | replace)
        [ "$(id -u)" -eq 0 ] || die "run as root (the nodes run as the rabbitmq user)"
        ;;
    -h | --help | help)
        usage
        return 0
        ;;
    *)
        usage >&2
        return 2
        ;;
    esac
    case $cmd in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    stop-app) cmd_stop_app "$@" ;;
    start-app) cmd_start_app "$@" ;;
    kill) cmd_kill "$@" ;;
    restart) cmd_restart "$@" ;;
    replace) cmd_replace "$@" ;;
    esac
}

main "$@"
