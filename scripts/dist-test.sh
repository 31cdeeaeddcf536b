#!/usr/bin/env bash
# Installs the order-timeout package on this machine and checks it the way an
# operator would meet it: the files, their owners and modes, the system user,
# the conffiles; then the installed binary runs with the installed config
# exactly as the installed unit says (its ExecStart, User, WorkingDirectory,
# Environment and EnvironmentFile), through setpriv rather than systemd, so
# it also works in a container. One order is cancelled at its deadline through
# the HTTP API, SIGTERM stops the service cleanly, and the package is removed,
# then purged. Whatever the outcome, the package, the service and the broker
# vhost are gone at the end.
#
#   scripts/dist-test.sh target/dist/order-timeout_<version>_amd64.deb
#
# Needs root, dpkg, curl, jq, setpriv, and the local RabbitMQ (management API on
# 15672, guest/guest). Refuses to run where order-timeout is already installed.
set -euo pipefail

die() { echo "dist-test: FAILED: $*" >&2; exit 1; }
[[ $# -eq 1 ]] || die "expected one .deb, got $# arguments: ${*:-none} (remove old ones from target/dist)"
deb=$1
[[ -f "$deb" ]] || die "no such file: $deb"
((EUID == 0)) || die "needs root (dpkg -i, a system user)"

package=order-timeout
user=order-timeout
unit=/lib/systemd/system/order-timeout.service
mgmt=http://127.0.0.1:15672/api
vhost="ot-test-dist-$$"
work=""
log=""
pid=""
checks=0

ok() { checks=$((checks + 1)); echo "  ok  $*"; }
# check DESCRIPTION COMMAND...: the command must succeed.
check() {
    local what=$1
    shift
    "$@" || die "$what"
    ok "$what"
}
# expect DESCRIPTION ACTUAL EXPECTED
expect() {
    [[ "$2" == "$3" ]] || die "$1: got '$2', expected '$3'"
    ok "$1"
}

cleanup() {
    local status=$?
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    if ((status != 0)) && [[ -s "$log" ]]; then
        echo "--- last lines of the service's log ---" >&2
        tail -n 40 "$log" >&2
    fi
    state=$(installed_state)
    if [[ -n "$state" && "$state" != not-installed ]]; then
        dpkg_retry --purge "$package" >/dev/null 2>&1 || echo "dist-test: could not purge $package" >&2
    fi
    curl -sf -u guest:guest -X DELETE "$mgmt/vhosts/$vhost" >/dev/null || true
    rm -rf "$work"
    exit "$status"
}

# dpkg, waiting while another package operation holds its lock.
dpkg_retry() {
    for _ in $(seq 1 60); do
        if dpkg "$@" 2>"$work/dpkg.err"; then return 0; fi
        grep -qi 'lock' "$work/dpkg.err" || break
        sleep 2
    done
    cat "$work/dpkg.err" >&2
    return 1
}

quiet() { "$@" >/dev/null; }
absent() { ! "$@" >/dev/null; }
stripped() { [[ "$(readelf -S "$1")" != *.symtab* ]]; }
clean_stop() { grep -Eq 'stopped$' "$1" && ! grep -q 'shutdown limit reached' "$1"; }
installed_state() { dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null || true; }
owner_mode() { stat -c '%U:%G %a' "$1"; }
# The last value of KEY= in the installed unit, as systemd reads it.
unit_value() { sed -n "s/^$1=//p" "$unit" | tail -n 1; }
millis() { date -u -d "$1" +%s%3N; }
api() { curl -sS -H 'content-type: application/json' "$@"; }

state=$(installed_state)
[[ -z "$state" || "$state" == not-installed ]] \
    || die "$package is already on this machine ($state); this test installs and purges it"
! getent passwd "$user" >/dev/null || die "user $user exists already; a purge would delete it"
[[ "$(dpkg-deb --field "$deb" Package)" == "$package" ]] || die "$deb is not the $package package"
version=$(dpkg-deb --field "$deb" Version)
trap cleanup EXIT
trap 'exit 130' INT TERM
work=$(mktemp -d)
log="$work/service.log"

echo "dist-test: installing $deb"
dpkg_retry --install "$deb" >/dev/null || die "dpkg --install $deb"
expect "package installed" "$(installed_state)" installed

echo "dist-test: files, owners, modes, user, conffiles"
expect "binary root:root 0755" "$(owner_mode /usr/bin/order-timeout)" "root:root 755"
expect "binary reports version $version" "$(/usr/bin/order-timeout --version | cut -d" " -f1-2)" "order-timeout ${version/\~/-}"
check "binary stripped" stripped /usr/bin/order-timeout
expect "config root:root 0644" "$(owner_mode /etc/order-timeout/order-timeout.toml)" "root:root 644"
expect "env file root:$user 0640" "$(owner_mode /etc/order-timeout/order-timeout.env)" "root:$user 640"
for key in ORDER_TIMEOUT__DATABASE__URL ORDER_TIMEOUT__AMQP__URL; do
    check "env file shows $key" grep -q "^#$key=" /etc/order-timeout/order-timeout.env
done
check "unit installed" test -f "$unit"
for f in rabbitmq.conf enabled_plugins definitions.plugin.json definitions.ttl.json README.md \
    grafana/order-timeout.json examples/python/publish_timeout.py examples/node/publish_timeout.js; do
    check "rabbitmq/$f shipped" test -f "/usr/share/order-timeout/rabbitmq/$f"
done
check "no node_modules or __pycache__ shipped" \
    test -z "$(find /usr/share/order-timeout \( -name node_modules -o -name __pycache__ \) -print -quit)"
check "copyright names the license" grep -q '^License: MIT or Apache-2.0' /usr/share/doc/order-timeout/copyright
IFS=: read -r _ _ uid _ _ home shell < <(getent passwd "$user") || die "no user $user"
check "system user $user (uid $uid)" test "$uid" -lt 1000
expect "its home is /var/lib/order-timeout" "$home" /var/lib/order-timeout
expect "it cannot log in" "$shell" /usr/sbin/nologin
check "group $user" quiet getent group "$user"
expect "state directory $user:$user 0750" "$(owner_mode /var/lib/order-timeout)" "$user:$user 750"
conffiles=$(dpkg-query -W -f='${Conffiles}' "$package")
for f in /etc/order-timeout/order-timeout.toml /etc/order-timeout/order-timeout.env; do
    check "conffile $f" grep -q "^ $f " <<<"$conffiles"
done
if command -v systemd-analyze >/dev/null; then
    check "systemd-analyze verify the unit" systemd-analyze verify "$unit"
else
    echo "  --  systemd-analyze not installed: the unit's syntax is not verified"
fi

# An upgrade to a later version whose config file changed, after the operator
# edited both conffiles: dpkg keeps the edits (the new file goes beside them as
# .dpkg-dist) and the env file keeps its group and mode.
echo "dist-test: upgrade over edited conffiles"
echo "# edited on this machine" >>/etc/order-timeout/order-timeout.toml
echo "# edited on this machine" >>/etc/order-timeout/order-timeout.env
dpkg-deb --raw-extract "$deb" "$work/next"
sed -i "s/^Version: .*/Version: $version+next/" "$work/next/DEBIAN/control"
echo "# changed in the next version" >>"$work/next/etc/order-timeout/order-timeout.toml"
dpkg-deb --root-owner-group -Znone --build "$work/next" "$work/next.deb" >/dev/null
dpkg_retry --install --force-confold "$work/next.deb" >/dev/null || die "dpkg --install (upgrade)"
expect "upgraded to $version+next" "$(dpkg-query -W -f='${Version}' "$package")" "$version+next"
check "edited config kept" grep -q '^# edited on this machine' /etc/order-timeout/order-timeout.toml
check "new config beside it" grep -q '^# changed in the next version' /etc/order-timeout/order-timeout.toml.dpkg-dist
check "edited env file kept" grep -q '^# edited on this machine' /etc/order-timeout/order-timeout.env
expect "env file still root:$user 0640" "$(owner_mode /etc/order-timeout/order-timeout.env)" "root:$user 640"
if command -v systemctl >/dev/null; then
    # Enabled as an operator would; removing the package must disable it.
    systemctl --no-reload enable order-timeout.service >/dev/null 2>&1 || die "systemctl enable"
    wants=/etc/systemd/system/multi-user.target.wants/order-timeout.service
    check "enabled (systemctl enable)" test -L "$wants"
fi

echo "dist-test: the installed service, as its unit runs it"
read -ra exec_start <<<"$(unit_value ExecStart)"
[[ "${exec_start[0]:-}" == /* && "$(unit_value ExecStart)" != *[%\"\']* ]] \
    || die "ExecStart '$(unit_value ExecStart)' is not a plain command line this test can run"
[[ "${exec_start[-1]}" == serve ]] || die "ExecStart does not run serve: ${exec_start[*]}"
workdir=$(unit_value WorkingDirectory)
[[ "$(unit_value User)" == "$user" && "$(unit_value Group)" == "$user" ]] || die "the unit does not run as $user"
stop_limit=$(unit_value TimeoutStopSec)
stop_limit=${stop_limit%s}
[[ "$stop_limit" =~ ^[0-9]+$ ]] || die "TimeoutStopSec '$stop_limit' is not whole seconds"
[[ "$(unit_value KillSignal)" == SIGTERM ]] || die "KillSignal is not SIGTERM"

# What systemd hands the service: a clean environment, the unit's Environment=,
# then its EnvironmentFile= (a leading '-' makes the file optional).
environment=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    LANG=C.UTF-8 HOME="$home" USER="$user" LOGNAME="$user" SHELL="$shell")
while read -r assignment; do
    environment+=("$assignment")
done < <(sed -n 's/^Environment=//p' "$unit" | tr ' ' '\n')
envfile=$(unit_value EnvironmentFile)
envfile=${envfile#-}
while IFS= read -r line || [[ -n "$line" ]]; do
    [[ "$line" =~ ^[[:space:]]*(#|$) ]] && continue
    [[ "$line" =~ ^[A-Za-z_][A-Za-z0-9_]*=.*$ ]] || die "$envfile: not KEY=value: $line"
    environment+=("$line")
done <"$envfile"
ok "environment file parses ($envfile)"

curl -sf -u guest:guest -X PUT "$mgmt/vhosts/$vhost" >/dev/null || die "cannot create vhost $vhost through $mgmt"
curl -sf -u guest:guest -X PUT -H 'content-type: application/json' \
    -d '{"configure":".*","write":".*","read":".*"}' "$mgmt/permissions/$vhost/guest" >/dev/null
port=""
for _ in $(seq 1 50); do
    candidate=$((20000 + RANDOM % 30000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then port=$candidate; break; fi
done
[[ -n "$port" ]] || die "no free port found"
base="http://127.0.0.1:$port"
db="dist-test-$$.db"
# The test's own broker vhost, a relative SQLite file (so it lands in the
# working directory), a free port and a short payment window.
environment+=(
    "ORDER_TIMEOUT__AMQP__URL=amqp://guest:guest@127.0.0.1:5672/$vhost"
    "ORDER_TIMEOUT__DATABASE__URL=sqlite://$db?mode=rwc"
    "ORDER_TIMEOUT__HTTP__BIND=127.0.0.1:$port"
    "ORDER_TIMEOUT__WINDOWS__PAYMENT=2s"
)
# As User=/Group= with NoNewPrivileges= and no capabilities; the directory is
# entered as that user, as systemd does. exec: the caller's $! is the service.
as_service() {
    exec setpriv --reuid="$user" --regid="$user" --init-groups --no-new-privs \
        --inh-caps=-all --bounding-set=-all -- \
        env -i -C "$workdir" "${environment[@]}" "$@"
}
(as_service "${exec_start[@]}") >"$log" 2>&1 &
pid=$!
for _ in $(seq 1 240); do
    curl -sf "$base/readyz" >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || die "the service exited before it was ready"
    sleep 0.5
done
check "ready on $base/readyz" curl -sf -o /dev/null "$base/readyz"
expect "SQLite file created in $workdir by $user" "$(stat -c %U "$workdir/$db" 2>/dev/null)" "$user"
doctor=0
(as_service "${exec_start[@]:0:${#exec_start[@]}-1}" doctor) >"$work/doctor.log" 2>&1 || doctor=$?
((doctor == 0)) || { cat "$work/doctor.log" >&2; die "doctor exited with $doctor"; }
ok "doctor passes with the installed config"
mode=$(grep -o 'delay mode chosen.*' "$log" | head -n 1 || true)
echo "      ${mode:-no delay mode reported}"

check "PUT /inventory/A" api -sf -o /dev/null -X PUT -d '{"available": 5}' "$base/inventory/A"
api -o "$work/order.json" -w '%{http_code}' -X POST \
    -d '{"items":[{"sku":"A","quantity":2}],"payment_window":"2s"}' "$base/orders" >"$work/code"
expect "POST /orders answers 201" "$(cat "$work/code")" 201
id=$(jq -er .id "$work/order.json") || die "no id in $(cat "$work/order.json")"
expect "stock reserved" "$(api -sf "$base/inventory/A" | jq -c '[.available, .reserved]')" "[3,2]"
for _ in $(seq 1 100); do
    api -sf "$base/orders/$id" >"$work/order.json" || die "GET /orders/$id"
    [[ "$(jq -r .status "$work/order.json")" == cancelled ]] && break
    sleep 0.2
done
expect "order $id cancelled" "$(jq -r .status "$work/order.json")" cancelled
deadline=$(millis "$(jq -r .pay_deadline "$work/order.json")")
cancelled=$(millis "$(jq -r .cancelled_at "$work/order.json")")
late=$((cancelled - deadline))
check "cancelled ${late} ms after its deadline (not early, within 2 s)" test "$late" -ge 0 -a "$late" -le 2000
expect "by its timer, not the sweeper" "$(api -sf "$base/orders/$id?include=audit" \
    | jq -r '[.audit[] | select(.event == "cancelled") | .cause] | join(",")')" timeout
expect "stock back" "$(api -sf "$base/inventory/A" | jq -c '[.available, .reserved]')" "[5,0]"

# systemctl reload: the unit's ExecReload as systemd runs it, $MAINPID the
# service's pid. The settings are read again (nothing changed) and it runs on.
reload=$(unit_value ExecReload)
[[ "$reload" == /bin/kill*'$MAINPID'* ]] || die "ExecReload '$reload' does not signal \$MAINPID"
read -ra reload_cmd <<<"${reload//\$MAINPID/$pid}"
"${reload_cmd[@]}" || die "ExecReload failed: ${reload_cmd[*]}"
reloaded() {
    for _ in $(seq 1 50); do
        api -sf "$base/metrics" | grep -q '^order_timeout_config_reloads_total{outcome="unchanged"} 1$' && return 0
        sleep 0.1
    done
    return 1
}
check "systemctl reload (ExecReload): settings read again, counted" reloaded
check "still running after the reload" kill -0 "$pid"
check "the reload is logged" grep -q 'settings reloaded' "$log"

started=$(date +%s%N)
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
pid=""
took=$((($(date +%s%N) - started) / 1000000))
expect "SIGTERM: exit status 0" "$status" 0
check "stopped in ${took} ms, within TimeoutStopSec=${stop_limit}s" test "$took" -lt $((stop_limit * 1000))
check "log says stopped, nothing abandoned" clean_stop "$log"
check "no process of $user left" absent pgrep -u "$user"

echo "dist-test: remove, then purge"
dpkg_retry --remove "$package" >/dev/null || die "dpkg --remove"
check "binary removed" test ! -e /usr/bin/order-timeout
check "unit removed" test ! -e "$unit"
if [[ -n "${wants:-}" ]]; then
    check "disabled on remove" test ! -L "$wants"
fi
check "conffiles kept on remove" test -f /etc/order-timeout/order-timeout.toml -a -f /etc/order-timeout/order-timeout.env
check "user kept on remove" quiet getent passwd "$user"
dpkg_retry --purge "$package" >/dev/null || die "dpkg --purge"
check "package gone" test -z "$(installed_state | grep -vx not-installed)"
check "/etc/order-timeout removed on purge" test ! -e /etc/order-timeout
check "/var/lib/order-timeout removed on purge" test ! -e /var/lib/order-timeout
check "user removed on purge" absent getent passwd "$user"
check "group removed on purge" absent getent group "$user"
check "stat override removed on purge" absent dpkg-statoverride --list /etc/order-timeout/order-timeout.env

echo "dist-test: $checks passed, 0 failed"
