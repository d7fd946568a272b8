//! The commit `sigma --version` and `sigma_build_info` name: `SIGMA_COMMIT` for the crate.
//!
//! `$SIGMA_BUILD_COMMIT` if set (a build without `.git`, e.g. the container's, given
//! it as a build argument), else `git rev-parse` of the checkout, else `unknown` (a
//! source tarball, no git). Cargo runs this again only when HEAD moves (a checkout, a
//! commit on the branch) or the variable changes, not on every edit.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=SIGMA_BUILD_COMMIT");
    let given = std::env::var("SIGMA_BUILD_COMMIT").ok().filter(|c| !c.trim().is_empty());
    let commit = given.or_else(|| {
        // HEAD, the ref it points to, packed-refs (where a ref lives after `git gc`)
        // and HEAD's reflog (written on every commit and checkout, also when the ref
        // was packed): --git-path resolves each for a worktree too. A path that does
        // not exist is not watched (cargo would rerun this on every build).
        let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned(), "logs/HEAD".to_owned()];
        if let Some(head_ref) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watched.push(head_ref);
        }
        for name in &watched {
            if let Some(path) = git(&["rev-parse", "--git-path", name]) {
                // Relative to the package directory, where cargo runs this script.
                let path = PathBuf::from(path);
                if path.exists() {
                    println!("cargo:rerun-if-changed={}", path.display());
                }
            }
        }
        git(&["rev-parse", "--short=12", "HEAD"])
    });
    // No `.git` at all: nothing to watch but this script.
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-env=SIGMA_COMMIT={}", commit.as_deref().unwrap_or("unknown"));
}
