#!/usr/bin/env bash
# Builds target/dist/order-timeout_<version>_amd64.deb from the release binary
# (built beforehand: `make dist` does both) and the files in packaging/, with
# plain dpkg-deb: no packaging tool to install on a fresh machine.
#
#   scripts/dist.sh
#
# Environment: BINARY (default target/release/order-timeout), OUT_DIR (default
# target/dist), DEB_MAINTAINER ("Name <address>" for the Maintainer field).
set -euo pipefail
cd "$(dirname "$0")/.."

binary=${BINARY:-target/release/order-timeout}
out=${OUT_DIR:-target/dist}
maintainer=${DEB_MAINTAINER:-order-timeout maintainers <maintainers@order-timeout.invalid>}
config=config/order-timeout.toml

die() { echo "dist: $*" >&2; exit 1; }

[[ -x "$binary" ]] || die "no binary at $binary (cargo build --release first)"
[[ -f "$config" ]] || die "$config is missing: the package installs it as /etc/order-timeout/order-timeout.toml"

# shellcheck source=scripts/cargo-package.sh
source "$(dirname "$0")/cargo-package.sh"
crate_version=$(checked_version "$binary")
# Debian sorts 1.0.0~rc.1 before 1.0.0, as semver sorts 1.0.0-rc.1.
version=${crate_version/-/\~}
license=$(package_key license)
[[ -n "$license" ]] || license=$(workspace_key license)
# The copyright file below carries the texts of these two.
[[ "$license" == "MIT OR Apache-2.0" ]] || die "license '$license': write its text into the copyright file"
homepage=$(package_key homepage)
[[ -n "$homepage" ]] || homepage=$(package_key repository)

export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
umask 022
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/root"
doc="$root/usr/share/doc/order-timeout"

install -D -m 0755 "$binary" "$root/usr/bin/order-timeout"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$root/usr/bin/order-timeout"
install -D -m 0644 "$config" "$root/etc/order-timeout/order-timeout.toml"
# 0640 from the start: root only until postinst gives the group read access.
install -D -m 0640 packaging/order-timeout.env "$root/etc/order-timeout/order-timeout.env"
install -D -m 0644 packaging/order-timeout.service "$root/lib/systemd/system/order-timeout.service"

# The broker side, as in the repository, without what `make test` installs or
# leaves there (node_modules, Python byte code, compiled Java classes).
while IFS= read -r -d '' file; do
    mode=0644
    [[ -x "$file" ]] && mode=0755
    install -D -m "$mode" "$file" "$root/usr/share/order-timeout/$file"
done < <(find rabbitmq -type f \
    -not -path '*/node_modules/*' -not -path '*/__pycache__/*' -not -name '*.pyc' -not -name '*.class' \
    -not -name '.*' -print0 | sort -z)

# The README with the pages it links to (docs/ keeps its place beside it),
# compressed as Debian does.
for page in README.md CHANGELOG.md UPGRADING.md docs/*.md; do
    [[ -f "$page" ]] || continue
    install -d -m 0755 "$(dirname "$doc/$page")"
    gzip -9n <"$page" >"$doc/$page.gz"
    chmod 0644 "$doc/$page.gz"
done
[[ -f "$doc/README.md.gz" ]] || die "README.md is missing"
{
    printf 'order-timeout (%s) unstable; urgency=medium\n\n' "$version"
    printf '  * Release %s: its changes are in CHANGELOG.md.gz beside this file.\n\n' "$crate_version"
    printf ' -- %s  %s\n' "$maintainer" "$(date -u -R -d "@$SOURCE_DATE_EPOCH")"
} | gzip -9n >"$doc/changelog.gz" # the Debian-format one dpkg tools expect
chmod 0644 "$doc/changelog.gz"

# Machine-readable copyright: the project's license, then every crate compiled
# into the binary with its own.
crates=$(cargo tree --locked --offline -p order-timeout -e normal --target x86_64-unknown-linux-gnu \
    --prefix none -f '{p}|{l}' | sed 's/ (\*)$//' | grep -v ' (/' | sort -u)
[[ -n "$crates" ]] || die "cargo tree listed no crates"
{
    cat <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: order-timeout
${homepage:+Source: $homepage
}
Files: *
Copyright: $(date -u -d "@$SOURCE_DATE_EPOCH" +%Y) the order-timeout authors
License: ${license/ OR / or }
Comment: The binary also contains these Rust crates, each under its own license:
EOF
    while IFS='|' read -r crate crate_license; do
        printf ' %s: %s\n' "$crate" "${crate_license:-see the crate}"
    done <<<"$crates"
    cat <<'EOF'

License: MIT
 Permission is hereby granted, free of charge, to any person obtaining a copy
 of this software and associated documentation files (the "Software"), to deal
 in the Software without restriction, including without limitation the rights
 to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
 copies of the Software, and to permit persons to whom the Software is
 furnished to do so, subject to the following conditions:
 .
 The above copyright notice and this permission notice shall be included in
 all copies or substantial portions of the Software.
 .
 THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
 IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
 FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
 AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
 LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
 OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
 SOFTWARE.

License: Apache-2.0
 On Debian systems, the full text of the Apache License, Version 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
EOF
} >"$doc/copyright"
chmod 0644 "$doc/copyright"
install -D -m 0644 packaging/debian/lintian-overrides "$root/usr/share/lintian/overrides/order-timeout"

# Shared libraries the binary links (rustls, not OpenSSL: libc and libgcc_s
# only), as the versions of their packages it needs. dpkg-shlibdeps wants a
# debian/control beside it; without dpkg-dev, the newest glibc symbol version
# the binary uses gives the same lower bound for libc6.
shlib_depends() {
    local exe=$1
    if command -v dpkg-shlibdeps >/dev/null; then
        local tmp
        tmp=$(mktemp -d)
        install -D "$exe" "$tmp/debian/order-timeout/usr/bin/order-timeout"
        mkdir "$tmp/debian/order-timeout/DEBIAN"
        printf 'Source: order-timeout\n\nPackage: order-timeout\nArchitecture: amd64\n' >"$tmp/debian/control"
        (cd "$tmp" && dpkg-shlibdeps -O -edebian/order-timeout/usr/bin/order-timeout) \
            | sed -n 's/^shlibs:Depends=//p'
        rm -rf "$tmp"
    else
        local glibc
        glibc=$(objdump -T "$exe" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n 1)
        local deps="libc6 (>= $glibc)"
        if objdump -p "$exe" | grep -q 'NEEDED *libgcc_s'; then deps+=", libgcc-s1 (>= 4.2)"; fi
        echo "$deps"
    fi
}
shlibs=$(shlib_depends "$(realpath "$root/usr/bin/order-timeout")")
[[ "$shlibs" == *libc6* ]] || die "could not work out the binary's library dependencies (got '$shlibs')"

install -d -m 0755 "$root/DEBIAN"
installed_size=$(du -sk --apparent-size "$root" | cut -f1)
# postinst needs adduser to create the system user; the unit's ExecReload
# (`systemctl reload`) runs /bin/kill, which procps provides.
sed -e "s|@VERSION@|$version|" \
    -e "s|@MAINTAINER@|$maintainer|" \
    -e "s|@INSTALLED_SIZE@|$installed_size|" \
    -e "s|@DEPENDS@|adduser, procps, $shlibs|" \
    -e "s|@HOMEPAGE@|${homepage:+Homepage: $homepage\\n}|" \
    packaging/debian/control.in >"$root/DEBIAN/control"
for script in postinst prerm postrm; do
    install -m 0755 "packaging/debian/$script" "$root/DEBIAN/$script"
done
install -m 0644 packaging/debian/conffiles "$root/DEBIAN/conffiles"
while read -r conffile; do
    [[ -f "$root$conffile" ]] || die "conffile $conffile is not in the package"
done <"$root/DEBIAN/conffiles"
(cd "$root" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -printf '%P\0' \
    | sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/md5sums"

mkdir -p "$out"
# One package in the directory: `make test-dist` installs whatever is there.
rm -f "$out"/order-timeout_*_amd64.deb
deb="$out/order-timeout_${version}_amd64.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
dpkg-deb --info "$deb" | sed -n '/Package:/,$p'
