#!/usr/bin/env bash
# A real three-node RabbitMQ cluster on this machine, beside the main broker.
#
# Three nodes of an installed broker (no containers), run as its rabbitmq user
# so they share its Erlang cookie (/var/lib/rabbitmq/.erlang.cookie). Which
# installation: OT_CLUSTER_ROOT, the root directory it is installed in.
#   unset, empty or /   the machine's own (/usr/lib/rabbitmq/bin/rabbitmq-server,
#                       the one rabbit@localhost runs: RabbitMQ 3.10 here)
#   /srv/rabbitmq43     RabbitMQ 4.3 in the chroot of ../shared/rabbitmq43/start.sh
#                       (Khepri only, no delayed-message plugin); every node and
#                       every rabbitmqctl runs chrooted there, beside and apart
#                       from that chroot's own rabbit43@localhost (5677)
# Only one cluster runs at a time (same names and ports): `start` records its
# root in /run/ot-cluster.root, and the other commands, OT_CLUSTER_ROOT unset or
# empty, act on the cluster recorded there.
#
#   node                    AMQP   management  Erlang distribution
#   ot-cluster-1@localhost  5681   15681       25681
#   ot-cluster-2@localhost  5682   15682       25682
#   ot-cluster-3@localhost  5683   15683       25683
#
# Each node has its own config, enabled-plugins file, data and logs under
# $OT_CLUSTER_BASE/<n> (default /var/lib/rabbitmq/ot-cluster, inside the root:
# /srv/rabbitmq43/var/lib/rabbitmq/ot-cluster for 4.3), listens on
# 127.0.0.1 only, and has the management plugin (and the delayed-message
# plugin when the broker has it). Nodes 2 and 3 boot beside node 1 and join it
# as they boot (classic peer discovery, see prepare_node). guest/guest works
# since every client is local. The main broker (rabbit@localhost, 5672/15672)
# is left alone. Needs root.
#
# Usage: scripts/cluster.sh COMMAND [N]
#   start        start the cluster (idempotent), print its URLs and members
#   stop         kill the nodes and remove their directories (idempotent)
#   status       which nodes run; exit 0 when all three do, 1 otherwise
#   stop-app N   rabbitmqctl stop_app on node N (1..3); its VM keeps running
#   start-app N  rabbitmqctl start_app on node N (it returns once the app runs)
#   kill N       SIGKILL node N's Erlang VM, wait until it is gone
#   restart N    start node N again after a kill (it keeps its data and
#                rejoins the cluster by itself), wait until it is back
#   replace N    after a kill: node N's data is lost; it is forgotten by the
#                cluster, started empty and joins as it boots (a node replaced)
#   rebalance    spread the quorum queues' leaders over the running nodes
#                (rabbitmq-queues rebalance quorum)
#
# Environment: OT_CLUSTER_ROOT (the installation, above), OT_CLUSTER_BASE
# (directory of the nodes' files, as the nodes see it), OT_CLUSTER_TIMEOUT
# (seconds to wait for a node, default 90).
set -euo pipefail

BASE=${OT_CLUSTER_BASE:-/var/lib/rabbitmq/ot-cluster}
TIMEOUT=${OT_CLUSTER_TIMEOUT:-90}
RABBITMQ_BIN=/usr/lib/rabbitmq/bin
NODES=(1 2 3)
# The root of the running cluster's installation, written by start.
STATE=/run/ot-cluster.root
# The installation's root, "" for the machine's own: set by pick_root.
ROOT=

usage() {
    sed -n '/^# Usage:/,/^# Environment:/p' "$0" | sed -e 's/^# \{0,1\}//' | sed '$d'
}

die() { echo "cluster: $*" >&2; exit 1; }
say() { echo "cluster: $*"; }

# "" for the machine's own installation, else the root without a trailing /.
normal_root() {
    local r=${1%/}
    echo "$r"
}

# The root recorded by start, when one is.
recorded_root() {
    [ -f "$STATE" ] && cat "$STATE"
}

# Sets ROOT for command $1: OT_CLUSTER_ROOT when given; otherwise `start`
# means the machine's installation and every other command the recorded one.
pick_root() {
    local cmd=$1 asked recorded
    asked=$(normal_root "${OT_CLUSTER_ROOT:-}")
    recorded=$(recorded_root || true)
    if [ -n "${OT_CLUSTER_ROOT:-}" ]; then
        ROOT=$asked
    elif [ "$cmd" = start ]; then
        ROOT=
    else
        ROOT=$recorded
    fi
    if [ -f "$STATE" ] && [ "$ROOT" != "$recorded" ] && any_node_up "$recorded"; then
        die "the cluster running is the one from $(root_words "$recorded") (OT_CLUSTER_ROOT=${recorded:-/}): stop it first (scripts/cluster.sh stop)"
    fi
    if [ -n "$ROOT" ]; then
        [ -x "$ROOT$RABBITMQ_BIN/rabbitmq-server" ] ||
            die "no RabbitMQ in $ROOT ($ROOT$RABBITMQ_BIN/rabbitmq-server): for 4.3 run ../shared/rabbitmq43/start.sh first"
    fi
}

# The installation in root $1, in words.
root_words() {
    if [ -n "$1" ]; then echo "$1"; else echo "the machine's installation"; fi
}

# Where a path of the installation is on this machine.
host_path() { echo "$ROOT$1"; }

# Runs a command of the installation: chrooted into it, or as it is.
in_root() {
    if [ -n "$ROOT" ]; then
        chroot "$ROOT" "$@"
    else
        "$@"
    fi
}

# The chroot's /proc and /dev, bind-mounted as ../shared/rabbitmq43/start.sh
# does (its stop.sh releases them): the Erlang VM needs both.
mount_root() {
    [ -n "$ROOT" ] || return 0
    mountpoint -q "$ROOT/proc" || mount --bind /proc "$ROOT/proc"
    mountpoint -q "$ROOT/dev" || mount --bind /dev "$ROOT/dev"
}

# The installation's version, from its package directory (rabbitmq_server-X).
installed_version() {
    local d
    for d in "$(host_path /usr/lib/rabbitmq/lib)"/rabbitmq_server-*; do
        [ -d "$d" ] && echo "${d##*rabbitmq_server-}" && return 0
    done
    echo "?"
}

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

# The delayed-message plugin, when the broker's plugin directories hold it
# (never in the 4.3 chroot: the plugin needs Mnesia, which 4.3 removed).
delayed_plugin_installed() {
    local d
    for d in "$(host_path /usr/lib/rabbitmq/plugins)" "$(host_path /usr/lib/rabbitmq/lib)"/rabbitmq_server-*/plugins; do
        compgen -G "$d/rabbitmq_delayed_message_exchange*" >/dev/null && return 0
    done
    return 1
}

# Writes node N's files (config, plugins, env file) and its directories. With
# SEED (a node number), node N joins SEED's cluster as it boots with no data
# (classic peer discovery; a node with data ignores it), so no second boot
# (stop_app, reset, join_cluster, start_app) is needed; until SEED answers it
# asks again every second, up to $TIMEOUT times, so that it may boot beside
# SEED.
prepare_node() {
    local n=$1 seed=${2:-} dir plugins=rabbitmq_management
    dir=$(host_path "$(node_dir "$n")")
    mkdir -p "$dir/mnesia" "$dir/log"
    delayed_plugin_installed && plugins="$plugins,rabbitmq_delayed_message_exchange"
    cat >"$dir/rabbitmq.conf" <<EOF
# $(node_name "$n"), written by scripts/cluster.sh
listeners.tcp.local = 127.0.0.1:$(amqp_port "$n")
management.tcp.ip = 127.0.0.1
management.tcp.port = $(mgmt_port "$n")
cluster_name = ot-cluster
EOF
    if [ -n "$seed" ]; then
        cat >>"$dir/rabbitmq.conf" <<EOF
cluster_formation.peer_discovery_backend = classic_config
cluster_formation.classic_config.nodes.1 = $(node_name "$seed")
cluster_formation.discovery_retry_limit = $TIMEOUT
cluster_formation.discovery_retry_interval = 1000
EOF
    fi
    echo "[$plugins]." >"$dir/enabled_plugins"
    # Replaces /etc/rabbitmq/rabbitmq-env.conf, which names the main node.
    node_env "$n" | sed -e 's/^export //' >"$dir/rabbitmq-env.conf"
    # The installation's rabbitmq user: the chroot's has another uid.
    in_root chown -R rabbitmq:rabbitmq "$BASE"
}

# The pid of node N's Erlang VM (beam.smp) of the installation in root $2
# (default ROOT), found by the RABBITMQ_NODENAME in its environment and the
# root it runs in: rabbitmq-server starts distribution from inside the VM, so
# no -sname is on the command line (only our -ot_cluster_node marker).
node_pid() {
    local want pid root=${2-$ROOT}
    want="RABBITMQ_NODENAME=$(node_name "$1")"
    for pid in $(pgrep -x beam.smp || true); do
        [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "${root:-/}" ] || continue
        if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qxF "$want"; then
            echo "$pid"
            return 0
        fi
    done
    return 1
}

# 0 when a node of the installation in root $1 runs.
any_node_up() {
    local n
    for n in "${NODES[@]}"; do node_pid "$n" "$1" >/dev/null && return 0; done
    return 1
}

ctl() { in_root rabbitmqctl "$@"; }

# rabbitmqctl, its output shown only when it fails (join_cluster logs harmless
# feature-flag warnings and "Failed to create a tracked connection table").
ctl_quiet() {
    local out
    out=$(ctl "$@" 2>&1) || { echo "$out" >&2; die "rabbitmqctl $* failed"; }
}

# 0 when the rabbit application runs on node N.
app_running() {
    in_root rabbitmq-diagnostics -q -n "$(node_name "$1")" check_running >/dev/null 2>&1
}

log_tail() {
    local n=$1 f
    f="$(host_path "$(node_dir "$n")")/log/$(node_name "$n").log"
    echo "--- last lines of $f:" >&2
    tail -n 30 "$f" >&2 2>/dev/null || echo "(no log)" >&2
    f="$(host_path "$(node_dir "$n")")/log/startup_log"
    if [ -s "$f" ]; then echo "--- $f:" >&2; tail -n 15 "$f" >&2; fi
}

# Waits until the rabbit application runs on node N, or fails after $TIMEOUT s:
# until its VM is registered with epmd (a look every 0.2 s that costs nothing,
# failing at once when the VM exits), then until it has booted: one
# `await_startup`, which the node answers the moment it is up. (Polling with
# the CLI costs a second or more of CPU a call while nodes boot.)
wait_running() {
    local n=$1 deadline
    deadline=$((SECONDS + TIMEOUT))
    until grep -q "^name ot-cluster-$n at " <<<"$(epmd -names 2>/dev/null)"; do
        node_pid "$n" >/dev/null || { log_tail "$n"; die "$(node_name "$n") exited while starting"; }
        [ "$SECONDS" -lt "$deadline" ] || { log_tail "$n"; die "$(node_name "$n") is not running after ${TIMEOUT}s"; }
        sleep 0.2
    done
    ctl -q -n "$(node_name "$n")" await_startup --timeout $((deadline - SECONDS + 1)) >/dev/null 2>&1 ||
        { log_tail "$n"; die "$(node_name "$n") is not running after ${TIMEOUT}s"; }
}

# Fails, naming the holder, when one of node N's ports is taken.
check_ports() {
    local n=$1 p holder
    for p in "$(amqp_port "$n")" "$(mgmt_port "$n")" "$(dist_port "$n")"; do
        holder=$(ss -Hltnp "( sport = :$p )" 2>/dev/null || true)
        [ -z "$holder" ] || die "port $p (for $(node_name "$n")) is taken: $holder"
    done
}

# Starts node N's VM with node_env, detached, as the rabbitmq user (of the
# chroot, in it, for another installation).
launch() {
    local n=$1 dir
    dir=$(node_dir "$n")
    check_ports "$n"
    # Not /usr/sbin/rabbitmq-server: as the rabbitmq user it writes the main
    # broker's /var/log/rabbitmq/startup_log.
    in_root su rabbitmq -s /bin/bash -c "cd '$dir' && $(node_env "$n" | tr '\n' ';')
        exec $RABBITMQ_BIN/rabbitmq-server -detached >>'$dir/log/startup_log' 2>&1"
}

# The nodes node N's cluster has running, one a line.
running_nodes() {
    ctl -q -n "$(node_name "$1")" eval \
        'io:format("~s~n", [string:join([atom_to_list(N) || N <- rabbit_nodes:all_running()], "\n")]).' 2>/dev/null |
        grep '^ot-cluster' || true
}

# 0 when node N is a (disc) member of node ASK's cluster (default node 1),
# running or not.
is_member() {
    local all
    # Read whole before grep -q: under pipefail, a CLI cut off by grep's early
    # exit (EPIPE) would fail the check.
    all=$(ctl -q -n "$(node_name "${2:-1}")" eval 'io:format("~p~n", [rabbit_nodes:all()]).' 2>/dev/null || true)
    grep -qF "'$(node_name "$1")'" <<<"$all"
}

# Waits until node N's cluster, as node N sees it, runs node N and at least
# COUNT nodes in all (default 2), or fails after $TIMEOUT s; prints the
# running nodes, one a line. One CLI call: the node itself looks every 0.2 s.
wait_in_cluster() {
    local n=$1 count=${2:-2} nodes
    nodes=$(ctl -q -n "$(node_name "$n")" eval "
        Until = erlang:monotonic_time(millisecond) + $TIMEOUT * 1000,
        Wait = fun Loop() ->
            R = rabbit_nodes:all_running(),
            case (length(R) >= $count andalso lists:member(node(), R))
                 orelse erlang:monotonic_time(millisecond) > Until of
                true -> R;
                false -> timer:sleep(200), Loop()
            end
        end,
        io:format(\"~s~n\", [string:join([atom_to_list(N) || N <- Wait()], \"\\n\")])." 2>/dev/null |
        grep '^ot-cluster' || true)
    if ! grep -qxF "$(node_name "$n")" <<<"$nodes" || [ "$(grep -c . <<<"$nodes")" -lt "$count" ]; then
        log_tail "$n"
        die "$(node_name "$n") is not in a cluster of $count running nodes after ${TIMEOUT}s (running: $(tr '\n' ' ' <<<"$nodes"))"
    fi
    echo "$nodes"
}

# Joins node N, running alone, to node SEED's cluster: for a node that did not
# join as it booted (started before the cluster existed, say).
join_node() {
    local n=$1 seed=$2
    say "$(node_name "$n") joins $(node_name "$seed")"
    ctl_quiet -q -n "$(node_name "$n")" stop_app
    ctl_quiet -q -n "$(node_name "$n")" reset
    ctl_quiet -q -n "$(node_name "$n")" join_cluster "$(node_name "$seed")"
    ctl_quiet -q -n "$(node_name "$n")" start_app
}

node_arg() {
    [[ ${1:-} =~ ^[123]$ ]] || die "a node number 1, 2 or 3 is needed (got '${1:-}')"
    echo "$1"
}

# Prints the installation, URLs and NODES (running nodes, one a line).
print_summary() {
    local n nodes=$1
    echo "RabbitMQ $(installed_version) from $(root_words "$ROOT")"
    echo "AMQP:       $(for n in "${NODES[@]}"; do printf 'amqp://guest:guest@127.0.0.1:%s ' "$(amqp_port "$n")"; done)"
    echo "management: $(for n in "${NODES[@]}"; do printf 'http://127.0.0.1:%s ' "$(mgmt_port "$n")"; done)"
    echo "running nodes (as $(node_name 1) sees them):"
    sed -e 's/^/  /' <<<"$nodes"
}

# Node 1 first, nodes 2 and 3 booting beside it and joining it as they boot
# (prepare_node's seed); a node left running alone is joined afterwards.
cmd_start() {
    local n started=() nodes
    if node_pid 1 >/dev/null; then
        nodes=$(running_nodes 1)
        if [ "$(grep -c . <<<"$nodes")" -eq 3 ]; then
            say "already running with three nodes"
            print_summary "$nodes"
            return 0
        fi
    fi
    in_root id rabbitmq >/dev/null 2>&1 || die "no rabbitmq user: is RabbitMQ installed?"
    [ -x "$(host_path "$RABBITMQ_BIN/rabbitmq-server")" ] || die "$(host_path "$RABBITMQ_BIN/rabbitmq-server") not found"
    mount_root
    echo "$ROOT" >"$STATE"
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
        if [ "$n" = 1 ]; then prepare_node "$n"; else prepare_node "$n" 1; fi
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
    if [ "$(running_nodes 1 | grep -c .)" -lt 3 ]; then
        for n in 2 3; do
            is_member "$n" || join_node "$n" 1
        done
    fi
    nodes=$(wait_in_cluster 1 3)
    say "cluster up"
    print_summary "$nodes"
}

# Stops the nodes: SIGKILL, all at once. Their data is removed right after, so
# a graceful stop (`rabbitmqctl stop`, a node after the other) would keep
# nothing and take seconds a node.
cmd_stop() {
    local n pid pids=() base
    base=$(host_path "$BASE")
    for n in "${NODES[@]}"; do
        pid=$(node_pid "$n") && pids+=("$pid")
    done
    if [ "${#pids[@]}" -eq 0 ] && [ ! -e "$base" ]; then
        rm -f "$STATE"
        say "nothing running"
        return 0
    fi
    if [ "${#pids[@]}" -eq 0 ]; then
        say "no node running"
    else
        say "stopping the nodes (SIGKILL of pids ${pids[*]})"
        kill -KILL "${pids[@]}" 2>/dev/null || true
        for pid in "${pids[@]}"; do
            while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
        done
    fi
    for n in "${NODES[@]}"; do
        ! node_pid "$n" >/dev/null || die "$(node_name "$n") is still running"
    done
    case $BASE in
    /*/*) rm -rf -- "$base" ;;
    *) die "refusing to remove '$base'" ;;
    esac
    rm -f "$STATE"
    say "stopped; removed $base"
}

cmd_status() {
    local n pid all=0
    echo "installation: RabbitMQ $(installed_version) from $(root_words "$ROOT")"
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
    # start_app returns once the application has booted: nothing to wait for.
    ctl -q -n "$(node_name "$n")" start_app
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
    local n nodes
    n=$(node_arg "${1:-}")
    [ -d "$(host_path "$(node_dir "$n")")/mnesia" ] || die "$(node_name "$n") has no data in $(node_dir "$n"): use start"
    if node_pid "$n" >/dev/null; then
        say "$(node_name "$n") is already up"
        app_running "$n" || ctl -q -n "$(node_name "$n")" start_app
    else
        say "starting $(node_name "$n")"
        launch "$n"
    fi
    wait_running "$n"
    nodes=$(wait_in_cluster "$n")
    say "$(node_name "$n") back in the cluster: $(tr '\n' ' ' <<<"$nodes")"
}

cmd_replace() {
    local n o other="" nodes
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
    rm -rf "$(host_path "$(node_dir "$n")")"
    # Empty, it joins $other's cluster as it boots (prepare_node's seed).
    prepare_node "$n" "$other"
    say "starting $(node_name "$n") empty"
    launch "$n"
    wait_running "$n"
    is_member "$n" "$other" || join_node "$n" "$other"
    nodes=$(wait_in_cluster "$n")
    say "$(node_name "$n") replaced: $(tr '\n' ' ' <<<"$nodes")"
}

cmd_rebalance() {
    local out
    node_pid 1 >/dev/null || die "$(node_name 1) is not running"
    out=$(in_root rabbitmq-queues -q -n "$(node_name 1)" rebalance quorum 2>&1) ||
        { echo "$out" >&2; die "rabbitmq-queues rebalance quorum failed"; }
    say "quorum queue leaders rebalanced"
}

main() {
    local cmd=${1:-}
    [ $# -gt 0 ] && shift
    case $cmd in
    start | stop | status | stop-app | start-app | kill | restart | replace | rebalance)
        [ "$(id -u)" -eq 0 ] || die "run as root (the nodes run as the rabbitmq user)"
        pick_root "$cmd"
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
    rebalance) cmd_rebalance ;;
    esac
}

main "$@"
