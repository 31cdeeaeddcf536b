#!/usr/bin/env bash
# Checks the OCI image the way an operator meets it. First its contents, read
# from the OCI archive itself (skopeo for the config, umoci to unpack the root
# filesystem): entrypoint, command, user, environment, port, stop signal and
# labels; the files, their owners and modes; the binary's libraries resolved
# by the loader inside the root filesystem. Then the image in the local
# containers storage runs under podman (or, where podman cannot start a
# container, from the unpacked root filesystem under `unshare --root` with the
# config's user, working directory and environment) against the local broker
# and PostgreSQL: it refuses to start open to the network without tokens, its
# data directory is writable by its user with the default SQLite database,
# and `serve` becomes ready, answers its health check, cancels an order at its
# deadline and stops cleanly on SIGTERM within its drain time. Whatever the
# outcome, the containers, the database, the broker vhost and the unpacked
# files are removed at the end.
#
#   scripts/image-test.sh target/image/order-timeout-<version>.oci.tar
#
# Needs root, podman, skopeo, umoci, curl, jq, psql, the local RabbitMQ
# (AMQP 5672 and management API 15672, guest/guest) and PostgreSQL
# (127.0.0.1:5432, user postgres, trust). Containers share the host's network,
# so the service reaches 127.0.0.1.
#
# Environment: IMAGE_TEST_RUNTIME (the OCI runtime podman uses; default runc
# where installed: crun refuses the hybrid cgroup hierarchy of some machines),
# IMAGE_TEST_RUNNER (podman or unshare; default: podman if it can start the
# image, else unshare, saying why).
set -euo pipefail

die() { echo "image-test: FAILED: $*" >&2; exit 1; }
[[ $# -eq 1 ]] || die "expected one OCI archive, got $# arguments: ${*:-none}"
archive=$1
[[ -f "$archive" ]] || die "no such file: $archive"
((EUID == 0)) || die "needs root (podman's storage, chroot, owners in the unpacked image)"
cd "$(dirname "$0")/.."

# What the image must be: the same names scripts/image.sh builds with.
version=$(awk '/^\[/ { p = ($0 == "[package]") } p && $1 == "version" { gsub(/"/, "", $3); print $3; exit }' Cargo.toml)
uid=10001
bin_path=/usr/local/bin/order-timeout
config_path=/etc/order-timeout/order-timeout.toml
data_dir=/var/lib/order-timeout
ca_file=/etc/ssl/certs/ca-certificates.crt
tag="localhost/order-timeout:$version"
# SHUTDOWN_LIMIT plus CLOSE_LIMIT in src/app.rs: the longest a clean stop takes.
drain_ms=22000

mgmt=http://127.0.0.1:15672/api
run_id="$$-$RANDOM"
vhost="ot-test-image-$run_id"
database="ot_image_test_${run_id//-/_}"
ctr="ot-image-test-$run_id"
work=""
pid=""
checks=0
db_made=""
vhost_made=""

ok() { checks=$((checks + 1)); echo "  ok  $*"; }
check() {
    local what=$1
    shift
    "$@" || die "$what"
    ok "$what"
}
# lacks TEXT FILE: the file does not contain the text.
lacks() { ! grep -q "$1" "$2"; }
quiet() { "$@" >/dev/null 2>&1; }
expect() {
    [[ "$2" == "$3" ]] || die "$1: got '$2', expected '$3'"
    ok "$1"
}

cleanup() {
    local status=$?
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && ! podman container exists "$ctr" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$pid" 2>/dev/null || true
        if ((status != 0)) && [[ -s "$work/service.log" ]]; then
            echo "--- last lines of the service's log ---" >&2
            tail -n 40 "$work/service.log" >&2
        fi
    fi
    if podman container exists "$ctr" 2>/dev/null; then
        if ((status != 0)); then
            echo "--- last lines of the container's log ---" >&2
            podman logs "$ctr" 2>&1 | tail -n 40 >&2 || true
        fi
        podman rm -f -v -t 30 "$ctr" >/dev/null 2>&1 || echo "image-test: could not remove container $ctr" >&2
    fi
    if [[ -n "$vhost_made" ]]; then
        curl -sf -u guest:guest -X DELETE "$mgmt/vhosts/$vhost" >/dev/null || echo "image-test: could not delete vhost $vhost" >&2
    fi
    if [[ -n "$db_made" ]]; then
        psql -q -h 127.0.0.1 -U postgres -d postgres -c "DROP DATABASE IF EXISTS \"$database\" WITH (FORCE)" >/dev/null \
            || echo "image-test: could not drop database $database" >&2
    fi
    [[ -n "$work" ]] && rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
work=$(mktemp -d)

echo "image-test: the image's config ($archive)"
skopeo inspect --config "oci-archive:$archive" >"$work/config.json" || die "skopeo cannot read $archive"
cfg() { jq -c "$1" "$work/config.json"; }
expect "user $uid:$uid (numeric, not root)" "$(cfg .config.User)" "\"$uid:$uid\""
expect "entrypoint" "$(cfg .config.Entrypoint)" "[\"$bin_path\"]"
expect "command serve" "$(cfg .config.Cmd)" '["serve"]'
expect "working directory $data_dir" "$(cfg .config.WorkingDir)" "\"$data_dir\""
expect "port 8080/tcp exposed" "$(cfg '.config.ExposedPorts | keys')" '["8080/tcp"]'
expect "stop signal SIGTERM" "$(cfg .config.StopSignal)" '"SIGTERM"'
expect "ORDER_TIMEOUT_CONFIG=$config_path" \
    "$(cfg "[.config.Env[] | select(startswith(\"ORDER_TIMEOUT_CONFIG=\"))]")" "[\"ORDER_TIMEOUT_CONFIG=$config_path\"]"
expect "architecture amd64, os linux" "$(cfg '[.architecture, .os]')" '["amd64","linux"]'
label() { jq -r --arg k "org.opencontainers.image.$1" '.config.Labels[$k] // ""' "$work/config.json"; }
expect "label title" "$(label title)" order-timeout
expect "label version" "$(label version)" "$version"
expect "label licenses" "$(label licenses)" "MIT OR Apache-2.0"
check "label revision is a commit" grep -Eqx '[0-9a-f]{40}' <<<"$(label revision)"
repository=$(awk '/^\[/ { p = ($0 == "[package]") } p && $1 == "repository" { gsub(/"/, "", $3); print $3; exit }' Cargo.toml)
if [[ -n "$repository" ]]; then
    expect "label source" "$(label source)" "$repository"
else
    echo "  --  Cargo.toml names no repository: the source label is not checked"
fi

echo "image-test: the root filesystem, unpacked from the archive"
mkdir "$work/layout"
tar -xf "$archive" -C "$work/layout"
ref=$(jq -r '.manifests[0].annotations["org.opencontainers.image.ref.name"] // empty' "$work/layout/index.json")
[[ -n "$ref" ]] || die "the archive's index names no image"
umoci unpack --image "$work/layout:$ref" "$work/bundle" >/dev/null || die "umoci cannot unpack $archive"
rootfs="$work/bundle/rootfs"
owner_mode() { stat -c '%u:%g %a' "$rootfs$1"; }
expect "binary root-owned 0755" "$(owner_mode "$bin_path")" "0:0 755"
check "passwd: uid $uid, no shell" grep -Eqx "[a-z-]+:x:$uid:$uid:[^:]*:$data_dir:/usr/sbin/nologin" "$rootfs/etc/passwd"
check "group: gid $uid" grep -Eq "^[a-z-]+:x:$uid:" "$rootfs/etc/group"
check "CA certificates are this machine's" cmp -s "$ca_file" "$rootfs$ca_file"
check "settings file at $config_path" test -f "$rootfs$config_path"
check "it binds every address, port 8080" grep -qx 'bind = "0.0.0.0:8080"' "$rootfs$config_path"
expect "data directory owned by $uid, 0750" "$(owner_mode "$data_dir")" "$uid:$uid 750"
expect "/tmp 1777" "$(owner_mode /tmp)" "0:0 1777"
check "licence texts" test -f "$rootfs/usr/share/doc/order-timeout/LICENSE-MIT" -a -f "$rootfs/usr/share/doc/order-timeout/LICENSE-APACHE"
interpreter=$(readelf -l "$rootfs$bin_path" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
check "the loader $interpreter is in the image" test -x "$rootfs$interpreter"
chroot "$rootfs" "$interpreter" --list "$bin_path" >"$work/ldd" 2>&1 || die "the loader in the image cannot list $bin_path: $(cat "$work/ldd")"
check "every library resolves inside the image" lacks 'not found' "$work/ldd"
expect "it runs there as $uid" "$(chroot --userspec="$uid:$uid" "$rootfs" "$bin_path" --version | cut -d" " -f1-2)" "order-timeout $version"
extra=$(find "$rootfs" -xdev -type f \( -perm -4000 -o -perm -2000 \) -print -quit)
check "no setuid or setgid file" test -z "$extra"

echo "image-test: the image in containers storage"
check "$tag in local storage" podman image exists "$tag"
expect "storage and archive hold the same image" \
    "$(podman image inspect --format '{{.Id}}' "$tag")" "$(skopeo inspect --raw "oci-archive:$archive" | jq -r .config.digest | sed 's/^sha256://')"

# How the image runs: under podman, or, where podman cannot start a
# container, from the unpacked root filesystem with the image config's
# entrypoint, command, user, working directory and environment (unshare
# --root, the host's network). IMAGE_TEST_RUNNER=podman|unshare forces one.
runtime=${IMAGE_TEST_RUNTIME:-$(command -v runc >/dev/null && echo runc || echo crun)}
# The host's network, to reach the local broker and database; limits at or
# below this shell's own, which a process without CAP_SYS_RESOURCE cannot raise.
nofile=$(ulimit -Hn)
[[ "$nofile" == unlimited ]] && nofile=1048576
run_opts=(--runtime "$runtime" --network host --ulimit "nofile=$nofile:$nofile" --ulimit nproc=4096:4096)
runner=${IMAGE_TEST_RUNNER:-auto}
if [[ "$runner" == auto ]]; then
    if podman run --rm "${run_opts[@]}" "$tag" --version >"$work/probe" 2>&1; then
        runner=podman
    elif grep -Eq 'OCI runtime|OCI permission|crun:|runc:' "$work/probe"; then
        echo "  --  podman cannot start a container here ($(head -n 1 "$work/probe")):"
        echo "      the image runs from its unpacked root filesystem instead (unshare --root)"
        runner=unshare
    else
        die "podman run $tag --version: $(cat "$work/probe")"
    fi
fi
mapfile -t image_env < <(jq -r '.config.Env[]' "$work/config.json")
mapfile -t image_cmd < <(jq -r '.config.Entrypoint[], .config.Cmd[]' "$work/config.json")
image_workdir=$(jq -r .config.WorkingDir "$work/config.json")
IFS=: read -r image_uid image_gid < <(jq -r .config.User "$work/config.json")
# in_image VAR=VALUE... -- [ARG...]: the image's entrypoint with these
# arguments (none: its command), its environment plus these variables.
in_image() {
    local env=()
    while [[ "$1" != -- ]]; do env+=("$1"); shift; done
    shift
    if [[ "$runner" == podman ]]; then
        local opts=()
        for v in "${env[@]}"; do opts+=(-e "$v"); done
        podman run --rm "${run_opts[@]}" "${opts[@]}" "$tag" "$@"
    else
        local args=("${image_cmd[@]}")
        (($# > 0)) && args=("${image_cmd[0]}" "$@")
        env -i "${image_env[@]}" "${env[@]}" unshare --root="$rootfs" --wd="$image_workdir" \
            --setgid "$image_gid" --setuid "$image_uid" -- "${args[@]}"
    fi
}
echo "image-test: the image run ($runner)"

admin_token="admin-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
checkout_token="checkout-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
tokens=("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS=$admin_token" "ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS=$checkout_token")

status=0
in_image -- config >"$work/open.out" 2>"$work/open.err" || status=$?
expect "without tokens it refuses to start (exit 2, configuration error)" "$status" 2
check "naming http.bind" grep -q 'http.bind' "$work/open.err"
in_image "${tokens[@]}" -- config >"$work/config.toml" 2>"$work/config.err" \
    || die "config with tokens: $(cat "$work/config.err")"
check "with tokens its settings load: bind 0.0.0.0:8080 from $config_path" \
    grep -qx "bind = \"0.0.0.0:8080\"  # from file $config_path" "$work/config.toml"
in_image "${tokens[@]}" -- migrate up >"$work/migrate.out" 2>&1 \
    || die "migrate up on the default SQLite file in $data_dir: $(tail -n 5 "$work/migrate.out")"
ok "the default SQLite database is created and migrated in $data_dir as $uid"

curl -sf -u guest:guest -X PUT "$mgmt/vhosts/$vhost" >/dev/null || die "cannot create vhost $vhost through $mgmt"
vhost_made=1
curl -sf -u guest:guest -X PUT -H 'content-type: application/json' \
    -d '{"configure":".*","write":".*","read":".*"}' "$mgmt/permissions/$vhost/guest" >/dev/null
psql -q -h 127.0.0.1 -U postgres -d postgres -c "CREATE DATABASE \"$database\"" >/dev/null || die "cannot create database $database"
db_made=1
port=""
for _ in $(seq 1 50); do
    candidate=$((20000 + RANDOM % 30000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then port=$candidate; break; fi
done
[[ -n "$port" ]] || die "no free port found"
base="http://127.0.0.1:$port"

# The image's own entrypoint and command (serve), with what an operator gives
# it: the database and broker, tokens, and (host network) a free port on the
# image's bind address. The health command is the one docs/deploying.md gives.
service_env=("${tokens[@]}"
    "ORDER_TIMEOUT__DATABASE__URL=postgres://postgres@127.0.0.1:5432/$database"
    "ORDER_TIMEOUT__AMQP__URL=amqp://guest:guest@127.0.0.1:5672/$vhost"
    "ORDER_TIMEOUT__HTTP__BIND=0.0.0.0:$port")
if [[ "$runner" == podman ]]; then
    opts=()
    for v in "${service_env[@]}"; do opts+=(-e "$v"); done
    podman run -d --name "$ctr" "${run_opts[@]}" "${opts[@]}" \
        --health-cmd "[\"$bin_path\", \"ctl\", \"status\"]" --health-interval disable \
        "$tag" >/dev/null || die "podman run $tag"
    pid=$(podman inspect --format '{{.State.Pid}}' "$ctr")
else
    # exec all the way down: $! is the service itself, for the signal below.
    (exec env -i "${image_env[@]}" "${service_env[@]}" unshare --root="$rootfs" --wd="$image_workdir" \
        --setgid "$image_gid" --setuid "$image_uid" -- "${image_cmd[@]}") >"$work/service.log" 2>&1 &
    pid=$!
fi
for _ in $(seq 1 240); do
    curl -sf -o /dev/null "$base/readyz" && break
    kill -0 "$pid" 2>/dev/null || die "the service exited before it was ready"
    sleep 0.5
done
expect "GET /readyz: ready" "$(curl -sf "$base/readyz" | jq -r .status)" ready
check "GET /healthz" curl -sf -o /dev/null "$base/healthz"
expect "the service runs as uid $uid" "$(awk '/^Uid:/ { print $2 }' "/proc/$pid/status")" "$uid"
if [[ "$runner" == podman ]]; then
    expect "it is the container's process 1" "$(awk '/^NSpid:/ { print $NF }' "/proc/$pid/status")" 1
    check "podman healthcheck run (order-timeout ctl status)" podman healthcheck run "$ctr"
else
    check "the health command (order-timeout ctl status)" quiet in_image "${service_env[@]}" -- ctl status
fi

millis() { date -u -d "$1" +%s%3N; }
api() { curl -sS -H 'content-type: application/json' "$@"; }
check "PUT /inventory/A" api -sf -o /dev/null -H "authorization: Bearer $admin_token" \
    -X PUT -d '{"available": 5}' "$base/inventory/A"
api -o "$work/order.json" -w '%{http_code}' -H "authorization: Bearer $checkout_token" -X POST \
    -d '{"items":[{"sku":"A","quantity":2}],"payment_window":"2s"}' "$base/orders" >"$work/code"
expect "POST /orders answers 201" "$(cat "$work/code")" 201
id=$(jq -er .id "$work/order.json") || die "no id in $(cat "$work/order.json")"
for _ in $(seq 1 100); do
    api -sf -H "authorization: Bearer $checkout_token" "$base/orders/$id" >"$work/order.json" || die "GET /orders/$id"
    [[ "$(jq -r .status "$work/order.json")" == cancelled ]] && break
    sleep 0.2
done
expect "order $id cancelled" "$(jq -r .status "$work/order.json")" cancelled
late=$(($(millis "$(jq -r .cancelled_at "$work/order.json")") - $(millis "$(jq -r .pay_deadline "$work/order.json")")))
check "cancelled ${late} ms after its deadline, not before" test "$late" -ge 0
expect "stock back" "$(api -sf -H "authorization: Bearer $admin_token" "$base/inventory/A" | jq -c '[.available, .reserved]')" "[5,0]"

# podman stop sends the image's stop signal, then SIGKILL after -t seconds.
started=$(date +%s%N)
if [[ "$runner" == podman ]]; then
    podman stop -t 60 "$ctr" >/dev/null || die "podman stop"
    status=$(podman inspect --format '{{.State.ExitCode}}' "$ctr")
    podman logs "$ctr" >"$work/service.log" 2>&1
else
    kill -TERM "$pid"
    status=0
    wait "$pid" || status=$?
fi
pid=""
took=$((($(date +%s%N) - started) / 1000000))
expect "SIGTERM: exit status 0" "$status" 0
check "stopped in ${took} ms, within the drain time (${drain_ms} ms)" test "$took" -lt "$drain_ms"
check "the log says it stopped" grep -Eq 'stopped$' "$work/service.log"
check "nothing abandoned" lacks 'shutdown limit reached' "$work/service.log"

echo "image-test: $checks passed, 0 failed"
