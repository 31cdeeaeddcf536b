#!/usr/bin/env bash
# Builds an earlier release's `order-timeout` binary, for the rolling-upgrade
# test (`make test-upgrade`): the old and the new version side by side on one
# database and one vhost.
#
#   scripts/previous-release.sh REV      # REV: a tag (v0.1.0-rc.1) or any revision
#
# REV is what git resolves it to when it can; else, for a clone without tags,
# the commit packaging/releases records for it (the script says which). The
# revision is checked out in a git worktree under target/upgrade/ (removed
# afterwards) and built there into this tree's target/ directory, so the
# dependencies already built are reused, not rebuilt. The binary is copied to
# target/upgrade/order-timeout-REV (its path is the last line printed).
#
# Cargo names a workspace member's artefacts after its path relative to the
# workspace root, so the two trees' `order-timeout` and `migrations` share
# their files in target/release: the old build replaces the current one's
# (the uplifted target/release/order-timeout included). So `make test` runs
# this first, before this tree's release build, and nothing of this tree is
# built twice. A binary already at target/upgrade/order-timeout-REV that
# names REV's commit is kept: nothing is built. When this tree's binary was
# there before the old build, it is built again afterwards (those two crates
# only) and checked with --version to be this tree's HEAD.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cargo=${CARGO:-cargo}

die() { echo "previous-release: $*" >&2; exit 1; }

rev=${1:-}
[[ -n $rev ]] || die "usage: scripts/previous-release.sh REV (a tag such as v0.1.0-rc.1, or a commit)"

if commit=$(git rev-parse --verify --quiet "$rev^{commit}"); then
    echo "previous-release: $rev is commit $commit (from git)"
else
    commit=$(awk -v rev="$rev" '$1 == rev { print $2 }' packaging/releases)
    [[ -n $commit ]] || die "$rev is neither a revision of this clone nor a release listed in packaging/releases"
    git cat-file -e "$commit^{commit}" 2>/dev/null \
        || die "$rev: packaging/releases says commit $commit, which this clone does not have (git fetch origin $commit)"
    echo "previous-release: $rev is not a tag here; packaging/releases says commit $commit"
fi

safe=${rev//[^A-Za-z0-9._-]/_}
out=target/upgrade/order-timeout-$safe
tree=target/upgrade/src-${commit:0:12}
mkdir -p target/upgrade

if [[ -x $out ]] && [[ $("$out" --version 2>/dev/null) == *"(${commit:0:12})" ]]; then
    echo "previous-release: $out is $rev already: $("$out" --version)"
    echo "$root/$out"
    exit 0
fi
# Whether this tree's release binary is there, to be restored afterwards.
current_built=false
[[ -e target/release/order-timeout ]] && current_built=true

# A worktree a killed run left behind goes first.
remove_tree() {
    git worktree remove --force "$tree" 2>/dev/null || rm -rf "$tree"
    git worktree prune
}
remove_tree
git worktree add --quiet --detach "$tree" "$commit"
trap remove_tree EXIT

# The same workspace-wide feature set as `make test`'s release build (so the
# shared dependencies match theirs), but only the binary is built.
started=$SECONDS
(cd "$tree" && CARGO_TARGET_DIR="$root/target" $cargo build --release --locked --workspace --bin order-timeout)
echo "previous-release: built $rev in $((SECONDS - started)) s"
cp target/release/order-timeout "$out"

if $current_built; then
    # target/release/order-timeout is the old one now: the current tree's again.
    started=$SECONDS
    $cargo build --release --locked --workspace --bin order-timeout
    echo "previous-release: current binary restored in $((SECONDS - started)) s"
    head=$(git rev-parse --short=12 HEAD)
    current=$(target/release/order-timeout --version)
    [[ $current == *"($head)" ]] \
        || die "target/release/order-timeout says '$current', not this tree's HEAD ($head)"
    echo "previous-release: target/release/order-timeout: $current"
else
    # Nothing of this tree was built: its first release build comes next.
    rm -f target/release/order-timeout
fi
echo "previous-release: $out: $("$out" --version)"
echo "$root/$out"
