//! The workspace's two front documents stay documents: ARCHITECTURE.md is the map of the
//! code as it is today (under 500 lines, every path of its layout present), and
//! docs/benchmarks.md says how to run each benchmark with one current table each (under
//! 300 lines). Design arguments go to docs/design/, investigations and before/after
//! figures to dated notes under docs/notes/ or to commit messages.

use std::path::{Path, PathBuf};

const ARCHITECTURE_MAX_LINES: usize = 500;
const BENCHMARKS_MAX_LINES: usize = 300;

/// The workspace root (this crate lives one level below it).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the crate is in the workspace").to_path_buf()
}

fn read(rel: &str) -> String {
    let path = root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

#[test]
fn architecture_stays_under_its_line_limit() {
    let lines = read("ARCHITECTURE.md").lines().count();
    assert!(
        lines < ARCHITECTURE_MAX_LINES,
        "ARCHITECTURE.md has {lines} lines, the limit is {ARCHITECTURE_MAX_LINES}. It is the map of the \
         code as it is today: keep one line per decision there and move the argument to a note in \
         docs/design/<topic>.md; put the history of a change (before/after figures, what was tried) \
         in the commit message or a dated note docs/notes/YYYY-MM-DD-<topic>.md"
    );
}

#[test]
fn benchmarks_stay_under_their_line_limit() {
    let lines = read("docs/benchmarks.md").lines().count();
    assert!(
        lines < BENCHMARKS_MAX_LINES,
        "docs/benchmarks.md has {lines} lines, the limit is {BENCHMARKS_MAX_LINES}. Per benchmark it \
         says how to run and read it and holds ONE current table stamped with date, commit and \
         machine: replace the table instead of adding runs, and put the before/after of a change \
         in the commit message or a dated note docs/notes/YYYY-MM-DD-<topic>.md"
    );
}

/// The paths of the first fenced block after "## Layout": a line whose text starts
/// before column 20 names a path in its first word; a path ending in `/` is a directory,
/// and a line indented deeper than a directory's line is inside it. Lines starting at
/// column 20 or later continue the description of the line above.
fn layout_paths(architecture: &str) -> Vec<String> {
    let after = architecture.split_once("\n## Layout").expect("ARCHITECTURE.md has a \"## Layout\" section").1;
    let block = after.split("```").nth(1).expect("the layout is a fenced block (```) right after \"## Layout\"");
    let mut dirs: Vec<(usize, String)> = Vec::new();
    let mut paths = Vec::new();
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let indent = line.len() - line.trim_start().len();
        if indent >= 20 {
            continue;
        }
        let word = line.split_whitespace().next().expect("a non-blank line has a word");
        while dirs.last().is_some_and(|(i, _)| *i >= indent) {
            dirs.pop();
        }
        let path = dirs.last().map_or(String::new(), |(_, d)| d.clone()) + word;
        if word.ends_with('/') {
            dirs.push((indent, path.clone()));
        }
        paths.push(path);
    }
    paths
}

#[test]
fn every_path_of_the_architecture_layout_exists() {
    let paths = layout_paths(&read("ARCHITECTURE.md"));
    assert!(paths.len() > 50, "the layout names only {} paths: did its format change?", paths.len());
    let missing: Vec<_> = paths.iter().filter(|p| !root().join(p).exists()).collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's layout names paths that do not exist: {missing:?}. Keep the map of the code \
         current: rename, move or remove the entries along with the files"
    );
}

#[test]
fn layout_paths_nest_by_indentation() {
    let doc = "x\n## Layout\n\n```\nbehaviour/            crate\n  src/proto/          core\n    mod.rs            \
               doc\n                      more about mod.rs\n  src/wire.rs         wire\nnode/                 \
               crate\n```\n";
    assert_eq!(
        layout_paths(doc),
        ["behaviour/", "behaviour/src/proto/", "behaviour/src/proto/mod.rs", "behaviour/src/wire.rs", "node/"]
    );
}
