//! Whether a crate's modules import only downwards, in no circle: the checker each
//! crate's layer test runs over its `src/` with its own table.
//!
//! Every `crate::`, `super::` and `self::` path in `src/` (outside comments, string
//! literals and `#[cfg(test)]` items, a test module's own file included) is resolved to
//! the module it names and checked at each level a [`Layers`] spec describes: its `top`
//! table for the crate's top-level modules, its `inner` rules for the submodules of a
//! module. A path to an item of a module's own file (a re-export such as `crate::Config`,
//! `super::Config`) is an edge to that file, the top of its module (for the crate, the
//! root `lib`). An edge to a higher layer fails, and so does a circle, even within one
//! layer; a module with no layer fails too (a new module must be placed), and so does a
//! table entry that names no module.
//!
//! ```
//! use sluice_testkit::layers::{Layers, ROOT, fixture, violations};
//!
//! const LAYERS: Layers = Layers::new(&[("data", &["config"]), ("engine", &["engine"]), ("crate root", &[ROOT])]);
//! let files = fixture(&[("config.rs", "use crate::engine::Engine;\n"), ("engine.rs", ""), ("lib.rs", "")]);
//!
//! assert_eq!(
//!     violations(&files, &LAYERS),
//!     ["src/config.rs:1: `config` (data, layer 1) imports `engine` (engine, layer 2), which is above it: \
//!       crate::engine::Engine;"]
//! );
//! ```

mod check;
mod lex;
mod references;
mod spec;
#[cfg(test)]
mod tests;

use std::path::Path;

use references::{Reference, module_path, references};
pub use spec::{Inner, Layer, Layers, MOD, ROOT};

/// A module path written `a::b`, as its parts.
fn parts(path: &str) -> Vec<String> {
    path.split("::").map(str::to_owned).collect()
}

/// What the checks read from a crate's files: every reference outside test-only code,
/// and every module path that has a file.
struct Graph {
    refs: Vec<Reference>,
    paths: Vec<Vec<String>>,
}

impl Graph {
    fn read(files: &[(String, String)]) -> Self {
        let mut refs = Vec::new();
        let mut test_only: Vec<Vec<String>> = Vec::new();
        for (file, text) in files {
            let (file_refs, test_modules) = references(file, text);
            refs.extend(file_refs);
            test_only.extend(test_modules.into_iter().map(|m| module_path(file).into_iter().chain([m]).collect()));
        }
        let is_test_only = |path: &[String]| test_only.iter().any(|t| path.get(..t.len()) == Some(t.as_slice()));
        let paths = files.iter().map(|(file, _)| module_path(file)).filter(|p| !is_test_only(p)).collect();
        refs.retain(|r| !is_test_only(&r.from));
        Self { refs, paths }
    }

    fn has(&self, module: &[String]) -> bool {
        self.paths.iter().any(|p| p.starts_with(module))
    }
}

/// What is wrong with the module graph of `files` (paths relative to `src/`, with their
/// text): [`import_violations`], then the table entries that name no module.
pub fn violations(files: &[(String, String)], spec: &Layers) -> Vec<String> {
    let graph = Graph::read(files);
    let mut problems = imports(&graph, spec);
    problems.extend(check::stale(&graph.paths, &[], spec.top));
    for (parent, rules) in spec.inner {
        let parent = parts(parent);
        if !graph.has(&parent) {
            problems.push(format!("INNER names `{}`, which is not a module", parent.join("::")));
        } else if let Some(layers) = rules.layers {
            problems.extend(check::stale(&graph.paths, &parent, layers));
        }
    }
    problems
}

/// What breaks the layers of `files`: a module with no layer, an upward or forbidden
/// import (with its file and line), a circle. Table entries that name no module are not
/// counted, so a fixture may hold only some of a crate's modules.
pub fn import_violations(files: &[(String, String)], spec: &Layers) -> Vec<String> {
    imports(&Graph::read(files), spec)
}

fn imports(graph: &Graph, spec: &Layers) -> Vec<String> {
    let mut problems = check::imports(&graph.refs, &graph.paths, &[], spec.top);
    for (parent, rules) in spec.inner {
        let parent = parts(parent);
        if !graph.has(&parent) {
            continue;
        }
        if let Some(layers) = rules.layers {
            problems.extend(check::imports(&graph.refs, &graph.paths, &parent, layers));
        }
        for reference in graph.refs.iter().filter(|r| r.from.starts_with(&parent)) {
            for forbidden in rules.forbidden.iter().map(|f| parts(f)) {
                if reference.to.starts_with(&forbidden) {
                    problems.push(format!(
                        "src/{}:{}: `{}` imports `{}`, which no module of `{}` may: {}",
                        reference.file,
                        reference.line,
                        reference.from.join("::"),
                        forbidden.join("::"),
                        parent.join("::"),
                        reference.text
                    ));
                }
            }
        }
    }
    problems
}

/// Every `.rs` file of the library under `src` (a crate's `src/`), as its path relative
/// to `src` and its text; the binary's `main.rs` is not part of the library.
///
/// # Panics
/// When `src` or a file in it cannot be read.
pub fn library_files(src: &Path) -> Vec<(String, String)> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{} is readable: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(root).expect("under src/").to_string_lossy().replace('\\', "/");
                if relative != "main.rs" {
                    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{relative}: {e}"));
                    out.push((relative, text));
                }
            }
        }
    }
    let mut files = Vec::new();
    walk(src, src, &mut files);
    files
}

/// Asserts that the library of the crate at `manifest_dir` (its `env!("CARGO_MANIFEST_DIR")`)
/// keeps `spec`: no [`violations`] among the files under its `src/`, of which there are
/// at least `at_least` (so that a wrong directory cannot pass).
///
/// # Panics
/// When it does not, listing every problem.
#[track_caller]
pub fn assert_library_keeps(spec: &Layers, manifest_dir: &str, at_least: usize) {
    let files = library_files(&Path::new(manifest_dir).join("src"));
    assert!(files.len() >= at_least, "found only {} files under {manifest_dir}/src/", files.len());

    let problems = violations(&files, spec);

    assert!(problems.is_empty(), "the module graph breaks its layers:\n{}", problems.join("\n"));
}

/// Asserts that the checker found exactly `expected` problems, each starting with its
/// text, in order (the tests that show it catches a violation, with file and line).
///
/// # Panics
/// When it did not, listing what it found.
#[track_caller]
pub fn assert_found(problems: &[String], expected: &[&str]) {
    assert_eq!(problems.len(), expected.len(), "{problems:#?}");
    for (problem, start) in problems.iter().zip(expected) {
        assert!(problem.starts_with(start), "expected one starting {start:?}: {problems:#?}");
    }
}

/// Files for a test of the checker: `(path under src/, text)` pairs.
pub fn fixture(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(f, t)| ((*f).to_owned(), (*t).to_owned())).collect()
}
