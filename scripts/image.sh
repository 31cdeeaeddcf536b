#!/usr/bin/env bash
# Builds the OCI image of order-timeout from the release binary (built
# beforehand: `make image` does both) with buildah, from scratch: no base image
# is pulled, nothing is downloaded. The root filesystem holds the binary, the
# shared libraries it links and their loader (copied from this machine, as
# `ldd` names them), the machine's CA certificates, passwd/group entries for
# the numeric user it runs as, the settings file and a data directory.
#
#   scripts/image.sh
#
# Writes target/image/order-timeout-<version>.oci.tar (an OCI archive, for
# `skopeo copy` or `podman load`) and tags the image order-timeout:<version>
# in the local containers storage. Needs root, buildah and ldd.
#
# Environment: BINARY (default target/release/order-timeout), OUT_DIR (default
# target/image), IMAGE_NAME (default order-timeout), IMAGE_SOURCE (the
# org.opencontainers.image.source label; default: the repository's remote
# `origin`, else Cargo.toml's repository).
set -euo pipefail
cd "$(dirname "$0")/.."

binary=${BINARY:-target/release/order-timeout}
out=${OUT_DIR:-target/image}
name=${IMAGE_NAME:-order-timeout}
config=config/order-timeout.toml

# Where things are in the image; scripts/image-test.sh, the Kubernetes
# manifests and docs/deploying.md name the same paths.
uid=10001
user=order-timeout
bin_path=/usr/local/bin/order-timeout
config_path=/etc/order-timeout/order-timeout.toml
data_dir=/var/lib/order-timeout
ca_file=/etc/ssl/certs/ca-certificates.crt
port=8080

die() { echo "image: $*" >&2; exit 1; }

[[ -x "$binary" ]] || die "no binary at $binary (cargo build --release first)"
[[ -f "$config" ]] || die "$config is missing"
[[ -f "$ca_file" ]] || die "$ca_file is missing: install ca-certificates"
command -v buildah >/dev/null || die "buildah is not installed (make image installs it)"

# shellcheck source=scripts/cargo-package.sh
source "$(dirname "$0")/cargo-package.sh"
version=$(checked_version "$binary")
license=$(package_key license)
[[ -n "$license" ]] || license=$(workspace_key license)
description=$(package_key description)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
# Where the source is published: said when known, never guessed.
source_url=${IMAGE_SOURCE:-$(package_key repository)}
[[ -n "$source_url" ]] || source_url=$(git remote get-url origin 2>/dev/null | grep -E '^https?://' || true)
[[ -n "$source_url" ]] || echo "image: no repository in Cargo.toml, IMAGE_SOURCE or git remote: no source label" >&2
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)

umask 022
stage=$(mktemp -d)
ctr=""
cleanup() {
    [[ -n "$ctr" ]] && buildah rm "$ctr" >/dev/null 2>&1
    rm -rf "$stage"
}
trap cleanup EXIT
root="$stage/root"
mkdir -p "$root"

install -D -m 0755 "$binary" "$root$bin_path"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$root$bin_path"

# The libraries the binary links and the loader, at the paths the binary asks
# for them (rustls, not OpenSSL: libc, libgcc_s, libm and the loader). glibc
# 2.34 and later has its NSS modules for files and DNS built in, so nothing is
# loaded later that ldd does not list.
libs=$(ldd "$root$bin_path" | awk '
    /=> not found/ { print "MISSING " $1; next }
    $2 == "=>" && $3 ~ /^\// { print $3; next }
    $1 ~ /^\// { print $1 }')
[[ "$libs" != *MISSING* ]] || die "ldd cannot resolve: $(grep MISSING <<<"$libs")"
[[ -n "$libs" ]] || die "ldd listed no libraries: a static binary needs none, but this script expects glibc"
while read -r lib; do
    install -D -m 0755 "$(realpath "$lib")" "$root$lib"
done <<<"$libs"

# The trust store rustls-native-certs reads for amqps:// (the machine's own,
# from Debian's ca-certificates).
install -D -m 0644 "$ca_file" "$root$ca_file"

# Names for the numeric user and group; no shell, no password.
install -d -m 0755 "$root/etc"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\n%s:x:%d:%d:order-timeout:%s:/usr/sbin/nologin\n' \
    "$user" "$uid" "$uid" "$data_dir" >"$root/etc/passwd"
printf 'root:x:0:\n%s:x:%d:\n' "$user" "$uid" >"$root/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"
chmod 0644 "$root/etc/passwd" "$root/etc/group" "$root/etc/nsswitch.conf"

# The shipped settings file, listening on every address of the container.
install -D -m 0644 "$config" "$root$config_path"
sed -i "s|^bind = \"127.0.0.1:$port\"$|bind = \"0.0.0.0:$port\"|" "$root$config_path"
grep -qx "bind = \"0.0.0.0:$port\"" "$root$config_path" \
    || die "$config has no 'bind = \"127.0.0.1:$port\"' line to open to the container's network"

# The working directory: the default SQLite file lands here. SQLite also
# writes temporary files to /tmp.
install -d -m 0750 "$root$data_dir"
install -d -m 1777 "$root/tmp"

for f in LICENSE-MIT LICENSE-APACHE README.md; do
    install -D -m 0644 "$f" "$root/usr/share/doc/order-timeout/$f"
done

# Owners as they are in the image, times from the commit: the same commit
# gives the same layer.
chown -R 0:0 "$root"
chown "$uid:$uid" "$root$data_dir"
find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
tar --sort=name --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" -C "$root" -cf "$stage/rootfs.tar" .

tag="$name:$version"
ctr=$(buildah from --name "order-timeout-image-$$" scratch)
buildah add --quiet "$ctr" "$stage/rootfs.tar" / >/dev/null
# OCI images carry no HEALTHCHECK: Kubernetes probes /healthz and /readyz;
# podman's --health-cmd can run `order-timeout ctl status` (docs/deploying.md).
buildah config \
    --os linux --arch amd64 \
    --user "$uid:$uid" \
    --workingdir "$data_dir" \
    --env PATH=/usr/local/bin:/usr/bin:/bin \
    --env ORDER_TIMEOUT_CONFIG="$config_path" \
    --env SSL_CERT_FILE="$ca_file" \
    --entrypoint "[\"$bin_path\"]" \
    --cmd '["serve"]' \
    --port "$port/tcp" \
    --volume "$data_dir" \
    --stop-signal SIGTERM \
    --label org.opencontainers.image.title=order-timeout \
    --label org.opencontainers.image.description="$description" \
    --label org.opencontainers.image.version="$version" \
    --label org.opencontainers.image.revision="$revision" \
    --label org.opencontainers.image.licenses="$license" \
    ${source_url:+--label org.opencontainers.image.source="$source_url"} \
    --label org.opencontainers.image.created="$created" \
    "$ctr"
buildah commit --quiet --format oci --timestamp "$SOURCE_DATE_EPOCH" --rm "$ctr" "containers-storage:localhost/$tag" >/dev/null
ctr=""
# The image this tag named before, if another commit built it, is left untagged: removed.
podman image prune -f --filter label=org.opencontainers.image.title=order-timeout >/dev/null 2>&1 || true

mkdir -p "$out"
archive="$out/$name-$version.oci.tar"
# One archive in the directory: `make test-image` tests whatever is there.
rm -f "$out/$name"-*.oci.tar
buildah push --quiet "localhost/$tag" "oci-archive:$archive:$tag" >/dev/null
echo "$archive"
echo "localhost/$tag: $(du -h --apparent-size "$archive" | cut -f1) (archive), binary $(du -h --apparent-size "$root$bin_path" | cut -f1), libraries $(du -ch --apparent-size $(sed "s|^|$root|" <<<"$libs") | tail -n 1 | cut -f1)"
