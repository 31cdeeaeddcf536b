# Sourced by scripts/dist.sh and scripts/image.sh: what both read of
# Cargo.toml, and the check that the binary they ship is the one it describes.
# Needs `die` defined by the caller.

# A key of the [package] section (the workspace's are inherited, not repeated).
package_key() {
    awk -v key="$1" '
        /^\[/ { in_package = ($0 == "[package]") }
        in_package && $1 == key && $2 == "=" { sub(/^[^=]*= *"/, ""); sub(/".*$/, ""); print; exit }
    ' Cargo.toml
}

# A key of the [workspace.package] section.
workspace_key() {
    awk -v key="$1" '
        /^\[/ { in_section = ($0 == "[workspace.package]") }
        in_section && $1 == key && $2 == "=" { sub(/^[^=]*= *"/, ""); sub(/".*$/, ""); print; exit }
    ' Cargo.toml
}

# Prints the crate's version after checking that BINARY reports it: a stale
# binary would ship under the wrong version. `--version` is the version, then
# the commit in parentheses.
checked_version() {
    local binary=$1 version reported
    version=$(package_key version)
    [[ -n "$version" ]] || die "no version in Cargo.toml's [package]"
    reported=$("$binary" --version)
    [[ "$reported" == "order-timeout $version" || "$reported" == "order-timeout $version ("* ]] \
        || die "$binary says '$reported', Cargo.toml says $version: rebuild it"
    echo "$version"
}
