//! The commit the binary is built from, for `--version`, the start-up log
//! and the `order_timeout_build_info` metric (as `ORDER_TIMEOUT_BUILD_COMMIT`):
//! `git rev-parse --short=12 HEAD` in a git checkout of this repository; else
//! the `ORDER_TIMEOUT_COMMIT` given at build time (a source tarball, an image
//! build without `.git`); else `unknown`.
//!
//! Cheap: a few `git rev-parse` calls, rerun only when this work tree's HEAD
//! moves (or, outside a git checkout, when the variable changes).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The variable a build without `.git` names its commit with.
const COMMIT_VAR: &str = "ORDER_TIMEOUT_COMMIT";

fn main() {
    let here = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let commit = git_commit(&here)
        .or_else(|| {
            // Watched only where it is read: in a git checkout, setting or
            // changing it does not rebuild the crate.
            println!("cargo:rerun-if-env-changed={COMMIT_VAR}");
            std::env::var(COMMIT_VAR)
                .ok()
                .map(|c| c.trim().to_string())
                .filter(|c| {
                    !c.is_empty()
                        && c.chars()
                            .all(|ch| ch.is_ascii_alphanumeric() || "-._".contains(ch))
                })
        })
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=ORDER_TIMEOUT_BUILD_COMMIT={commit}");
}

/// HEAD's short hash when `here` is the top of a git work tree (not a
/// tarball unpacked inside some other repository), with the files to watch.
fn git_commit(here: &Path) -> Option<String> {
    let top = git(here, &["rev-parse", "--show-toplevel"])?;
    if std::fs::canonicalize(&top).ok()? != std::fs::canonicalize(here).ok()? {
        return None;
    }
    // A worktree's `.git` is a file naming its own git dir (HEAD and its
    // reflog), while branches live in the common dir. Watched: HEAD (a
    // checkout), its reflog (every commit, reset or checkout of this work
    // tree) and the current branch's own ref; never all of refs/heads, which
    // moves with every other branch's commits and would rebuild the crate.
    let git_dir = absolute(here, &git(here, &["rev-parse", "--git-dir"])?);
    let common = absolute(here, &git(here, &["rev-parse", "--git-common-dir"])?);
    let mut watched = vec![git_dir.join("HEAD"), git_dir.join("logs").join("HEAD")];
    if let Some(branch) = git(here, &["symbolic-ref", "-q", "HEAD"]) {
        watched.push(common.join(branch));
    }
    watched.push(common.join("packed-refs"));
    for path in watched {
        // A path that does not exist would rerun this script on every build.
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    git(here, &["rev-parse", "--short=12", "HEAD"])
}

/// `path` as git printed it, relative to `here` unless absolute.
fn absolute(here: &Path, path: &str) -> PathBuf {
    let path = Path::new(path);
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        here.join(path)
    }
}

/// One git command's trimmed output, or `None` when git is missing or fails.
fn git(here: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(here)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}
