//! The library's module graph: layers that only point down, and no import circle (see
//! the crate docs, "Layout"). Every `crate::` and `super::` path in `src/` (outside
//! comments and `#[cfg(test)]` modules) is an edge from the top-level module of its
//! file to the top-level module it names; a path to an item of the crate root (a
//! re-export such as `crate::StreamId`) is an edge to the root, the top layer. An edge
//! to a higher layer fails, and so does a circle, even within one layer. A module that
//! has no layer below fails too: a new module must be placed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, from the bottom; a module may import from its own layer and those below.
const LAYERS: &[(&str, &[&str])] = &[
    ("data", &["headers", "request", "clock", "logs", "metrics", "shared_data", "callout", "counts", "probe", "error"]),
    ("shared services", &["services"]),
    ("VM state", &["state"]),
    ("host functions", &["abi"]),
    ("engine and linker", &["engine"]),
    ("worker", &["worker"]),
    ("facade", &["host"]),
    ("serve", &["serve"]),
    ("crate root", &[ROOT]),
];

/// The crate root (`lib.rs`): what it re-exports sits above everything.
const ROOT: &str = "lib";

fn layer_of(module: &str) -> Option<(usize, &'static str)> {
    LAYERS.iter().enumerate().find(|(_, (_, modules))| modules.contains(&module)).map(|(i, (name, _))| (i, *name))
}

/// A reference from one file to a top-level module.
#[derive(Debug)]
struct Edge {
    file: String,
    line: usize,
    from: String,
    to: String,
    path: String,
}

/// The module path of a file under `src/`: `worker/stream.rs` is `[worker, stream]`,
/// `abi/mod.rs` is `[abi]`, `lib.rs` is `[]`.
fn module_path(file: &str) -> Vec<String> {
    let trimmed = file.strip_suffix(".rs").unwrap_or(file);
    let mut parts: Vec<String> = trimmed.split('/').map(str::to_owned).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == ROOT) {
        parts.pop();
    }
    parts
}

/// The file's text with comment lines and `#[cfg(test)] mod ... { ... }` blanked (line
/// numbers kept).
fn code(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::with_capacity(lines.len());
    // Brace depth inside a test module being skipped, once its `{` was seen.
    let mut skipping: Option<(bool, usize)> = None;
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let next = lines.get(i + 1).map_or("", |l| l.trim_start());
        if skipping.is_none() && trimmed.starts_with("#[cfg(test)]") && next.starts_with("mod ") {
            skipping = Some((false, 0));
        }
        if let Some((opened, depth)) = &mut skipping {
            for c in line.chars() {
                match c {
                    '{' => {
                        *opened = true;
                        *depth += 1;
                    }
                    '}' => *depth = depth.saturating_sub(1),
                    _ => {}
                }
            }
            if *opened && *depth == 0 {
                skipping = None;
            }
            out.push("");
            continue;
        }
        out.push(if trimmed.starts_with("//") { "" } else { line });
    }
    out.join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The first path segments named by what follows `crate::` or `super::` at `rest`: one
/// identifier, or each item of a `{...}` group.
fn first_segments(rest: &str) -> Vec<String> {
    if let Some(group) = rest.strip_prefix('{') {
        let mut depth = 0usize;
        let mut items = Vec::new();
        let mut current = String::new();
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => items.push(std::mem::take(&mut current)),
                _ if depth == 0 => current.push(c),
                _ => {}
            }
        }
        items.push(current);
        return items
            .iter()
            .map(|item| item.trim().chars().take_while(|c| is_ident(*c)).collect::<String>())
            .filter(|s| !s.is_empty())
            .collect();
    }
    let ident: String = rest.chars().take_while(|c| is_ident(*c)).collect();
    if ident.is_empty() { Vec::new() } else { vec![ident] }
}

/// Every edge of every file.
fn edges(files: &[(String, String)], modules: &BTreeSet<String>) -> Vec<Edge> {
    let mut edges = Vec::new();
    for (file, text) in files {
        let path = module_path(file);
        let from = path.first().cloned().unwrap_or_else(|| ROOT.to_owned());
        let code = code(text);
        for (line_index, line) in code.lines().enumerate() {
            for keyword in ["crate::", "super::"] {
                let mut search = 0;
                while let Some(found) = line.get(search..).and_then(|l| l.find(keyword)) {
                    let at = search + found;
                    search = at + keyword.len();
                    let before = line.get(..at).and_then(|b| b.chars().last());
                    if before.is_some_and(|c| is_ident(c) || c == ':') {
                        continue;
                    }
                    let rest = line.get(at + keyword.len()..).unwrap_or("");
                    // A group may run over several lines: read on from here.
                    let offset = code.lines().take(line_index).map(|l| l.len() + 1).sum::<usize>() + at;
                    let rest =
                        if rest.starts_with('{') { code.get(offset + keyword.len()..).unwrap_or("") } else { rest };
                    let targets: Vec<String> = if keyword == "crate::" {
                        first_segments(rest)
                            .into_iter()
                            .map(|segment| if modules.contains(&segment) { segment } else { ROOT.to_owned() })
                            .collect()
                    } else {
                        // `super` of `a::b` is `a`; of a top-level module, the root.
                        let parent = &path[..path.len().saturating_sub(1)];
                        vec![parent.first().cloned().unwrap_or_else(|| ROOT.to_owned())]
                    };
                    for to in targets {
                        if to != from {
                            edges.push(Edge {
                                file: file.clone(),
                                line: line_index + 1,
                                from: from.clone(),
                                to,
                                path: format!("{keyword}{}", rest.chars().take(40).collect::<String>()),
                            });
                        }
                    }
                }
            }
        }
    }
    edges
}

/// What is wrong with the module graph of `files` (paths relative to `src/`).
fn violations(files: &[(String, String)]) -> Vec<String> {
    let modules: BTreeSet<String> = files.iter().filter_map(|(file, _)| module_path(file).first().cloned()).collect();
    let mut problems = Vec::new();
    for module in modules.iter().map(String::as_str).chain([ROOT]) {
        if layer_of(module).is_none() {
            problems.push(format!("module `{module}` has no layer: add it to LAYERS (and to the crate docs)"));
        }
    }
    let edges = edges(files, &modules);
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for edge in &edges {
        graph.entry(&edge.from).or_default().insert(&edge.to);
        if let (Some((from, from_name)), Some((to, to_name))) = (layer_of(&edge.from), layer_of(&edge.to))
            && to > from
        {
            problems.push(format!(
                "src/{}:{}: `{}` ({from_name}, layer {}) imports `{}` ({to_name}, layer {}), which is above it: {}",
                edge.file,
                edge.line,
                edge.from,
                from + 1,
                edge.to,
                to + 1,
                edge.path.trim()
            ));
        }
    }
    problems.sort();
    if let Some(circle) = find_circle(&graph) {
        problems.push(format!("the modules import each other in a circle: {}", circle.join(" -> ")));
    }
    problems
}

/// A circle in `graph`, as the modules along it (the first repeated at the end).
fn find_circle<'a>(graph: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Option<Vec<&'a str>> {
    fn visit<'a>(
        node: &'a str,
        graph: &BTreeMap<&'a str, BTreeSet<&'a str>>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<&'a str>> {
        if let Some(at) = stack.iter().position(|n| *n == node) {
            let mut circle = stack[at..].to_vec();
            circle.push(node);
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node);
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, stack, done) {
                return Some(circle);
            }
        }
        stack.pop();
        done.insert(node);
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// Every `.rs` file of the library (the binary's `main.rs` is not part of it).
fn library_files() -> Vec<(String, String)> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<_> =
            std::fs::read_dir(dir).expect("src/ is readable").map(|e| e.unwrap().path()).collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
                if relative != "main.rs" {
                    out.push((relative, std::fs::read_to_string(&path).unwrap()));
                }
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&root, &root, &mut files);
    files
}

fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(f, t)| ((*f).to_owned(), (*t).to_owned())).collect()
}

#[test]
fn the_library_imports_only_downwards_and_in_no_circle() {
    let files = library_files();
    assert!(files.len() > 30, "found only {} files under src/", files.len());

    let problems = violations(&files);

    assert!(problems.is_empty(), "the module graph breaks its layers:\n{}", problems.join("\n"));
}

#[test]
fn an_upward_import_is_caught_with_its_file_and_line() {
    let files = files(&[
        ("state.rs", "//! The VM state.\n\nuse crate::headers::Headers;\nuse crate::worker::Worker;\n"),
        ("worker/mod.rs", "mod stream;\nuse crate::state::Vm;\n"),
        ("worker/stream.rs", "use super::Worker;\n"),
        ("headers.rs", ""),
        ("lib.rs", "mod state;\n"),
    ]);

    let problems = violations(&files);

    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(problems[0].starts_with("src/state.rs:4: `state` (VM state, layer 3) imports `worker` (worker, layer 6)"));
    assert!(problems[1].contains("circle: state -> worker -> state"), "{problems:#?}");
}

#[test]
fn grouped_inline_and_macro_paths_count_and_comments_and_tests_do_not() {
    let files = files(&[
        ("abi/mod.rs", "use crate::{\n    headers,\n    host::Host,\n};\n"),
        ("abi/time.rs", "fn f() { let _ = $crate::engine::EPOCH_TICK; }\n"),
        ("abi/log.rs", "fn g() -> crate::StreamId { todo!() }\n"),
        (
            "state.rs",
            "/// See [`crate::worker::Worker`].\n// crate::serve\n#[cfg(test)]\nmod tests {\n    use crate::host::Host;\n}\nuse crate::engine::X;\n",
        ),
        ("headers.rs", ""),
        ("host/mod.rs", ""),
        ("engine.rs", ""),
        ("lib.rs", ""),
    ]);

    let problems = violations(&files);

    assert_eq!(problems.len(), 4, "{problems:#?}");
    assert!(problems[3].starts_with("src/state.rs:7: `state` (VM state, layer 3) imports `engine`"), "{problems:#?}");
    assert!(
        problems[0].starts_with("src/abi/log.rs:1: `abi` (host functions, layer 4) imports `lib`"),
        "{problems:#?}"
    );
    assert!(
        problems[1].starts_with("src/abi/mod.rs:1: `abi` (host functions, layer 4) imports `host`"),
        "{problems:#?}"
    );
    assert!(
        problems[2].starts_with("src/abi/time.rs:1: `abi` (host functions, layer 4) imports `engine`"),
        "{problems:#?}"
    );
}

#[test]
fn a_circle_within_one_layer_is_caught() {
    let files = files(&[
        ("headers.rs", "use crate::request::Request;\n"),
        ("request.rs", "use crate::headers::Headers;\n"),
        ("lib.rs", ""),
    ]);

    let problems = violations(&files);

    assert_eq!(problems, vec!["the modules import each other in a circle: headers -> request -> headers".to_owned()]);
}

#[test]
fn a_module_without_a_layer_is_caught() {
    let files = files(&[("gadgets.rs", ""), ("lib.rs", "")]);

    assert_eq!(violations(&files).len(), 1);
}
