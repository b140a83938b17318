//! The library's module graph: layers that only point down, and no import circle (see
//! the crate docs, "Layout", and `config`'s). Every `crate::`, `super::` and `self::`
//! path in `src/` (outside comments, string literals and `#[cfg(test)]` items, a test
//! module's own file included) is resolved to the module it names and checked at each
//! level a table describes: [`LAYERS`] for the crate's top-level modules, [`INNER`] for
//! the submodules of a module. A path to an item of a module's own file (a re-export
//! such as `crate::Config`, `super::Config`) is an edge to that file, the top of its
//! module. An edge to a higher layer fails, and so does a circle, even within one layer;
//! a module with no layer fails too (a new module must be placed), and so does a table
//! entry that names no module.
//!
//! The parser is an adapted copy of `wasm-host/tests/host/layers.rs` (which checks
//! top-level modules only): it also resolves `super::super::`, nested groups and inline
//! modules, and blanks string literals. It is meant to move to a shared dev crate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Layers from the bottom, each a name and its modules; a module may import from its own
/// layer and those below.
type Layers = &'static [(&'static str, &'static [&'static str])];

/// The crate root (`lib.rs`): what it re-exports sits above everything.
const ROOT: &str = "lib";
/// A module's own file (`mod.rs`), the top of its submodules.
const MOD: &str = "mod";

/// The crate's top-level modules.
const LAYERS: Layers = &[
    ("the configuration, the ports and the due queue", &["config", "host", "due"]),
    ("fakes of the ports", &["testing"]),
    ("policy matching", &["policy"]),
    ("engine", &["engine"]),
    ("the worker: held requests behind a port", &["worker"]),
    ("host calls", &["abi"]),
    ("the worker's ports on the host", &["adapters"]),
    ("proxy-wasm glue", &["wasm"]),
    ("crate root", &[ROOT]),
];

/// The rules inside one module.
struct Inner {
    /// Its submodules' layers; `None` until it has some (its submodules are then not
    /// checked against each other).
    layers: Option<Layers>,
    /// Modules (paths from the crate root) that none of its files may import.
    forbidden: &'static [&'static str],
}

/// The rules inside modules, keyed by the module's path: add a module's layers here.
const INNER: &[(&str, Inner)] = &[
    ("config", Inner { layers: Some(CONFIG), forbidden: &[] }),
    ("config::model", Inner { layers: Some(CONFIG_MODEL), forbidden: &[] }),
    ("config::raw", Inner { layers: Some(CONFIG_RAW), forbidden: &[] }),
    ("config::validate", Inner { layers: Some(CONFIG_VALIDATE), forbidden: &[] }),
    // Its own layers are the engine's to add; it never reaches the proxy-wasm glue.
    ("engine", Inner { layers: Some(ENGINE), forbidden: &["wasm", "abi", "adapters", "worker"] }),
    ("engine::request", Inner { layers: Some(ENGINE_REQUEST), forbidden: &[] }),
    ("worker", Inner { layers: Some(WORKER), forbidden: &["wasm", "abi", "adapters"] }),
];

const ENGINE: Layers = &[
    (
        "what the stages pass and read",
        &[
            "decision",
            "resolved",
            "wire",
            "namespace",
            "headers",
            "compiled",
            "breaker",
            "lease_record",
            "cause",
            "calls",
            "evidence",
            "secrets",
        ],
    ),
    ("the compiled configuration and the worker's bookkeeping", &["setup"]),
    ("the request path, and the calls the root sends", &["request", "outgoing"]),
    ("the engine: the one place the glue calls", &[MOD]),
];
const ENGINE_REQUEST: Layers = &[
    ("the states a request goes through", &["state"]),
    ("resolve", &["resolve"]),
    ("admit or reject: the end of every path", &["admit"]),
    ("the failure rule", &["fallback"]),
    ("the stages that decide", &["local", "check", "lease"]),
    ("the pipeline that chains them", &[MOD]),
];
const WORKER: Layers = &[("the port, the setup", &["port", "setup"]), ("the worker", &[MOD])];
const CONFIG: Layers = &[
    ("the two forms and the error", &["model", "raw", "error"]),
    ("the two steps: parse and validate", &["parse", "validate"]),
    ("the module: map, re-exports, entry", &[MOD]),
];
const CONFIG_MODEL: Layers = &[
    ("what a policy reads from a request", &["request"]),
    ("global settings", &["global"]),
    ("a policy, the response", &["policy", "response"]),
    ("the document", &[MOD]),
];
const CONFIG_RAW: Layers = &[("the hand-written forms", &["forms"]), ("the raw document", &[MOD])];
const CONFIG_VALIDATE: Layers = &[
    ("the issues", &["issues"]),
    ("single values", &["fields"]),
    ("a policy's parts, the response", &["key", "matcher", "limit", "cost", "response"]),
    ("global settings", &["global"]),
    ("one policy", &["policy"]),
    ("the document", &[MOD]),
];

/// The module path of a file under `src/`: `config/validate/key.rs` is
/// `[config, validate, key]`, `config/mod.rs` is `[config]`, `lib.rs` is `[]`.
fn module_path(file: &str) -> Vec<String> {
    let trimmed = file.strip_suffix(".rs").unwrap_or(file);
    let mut parts: Vec<String> = trimmed.split('/').map(str::to_owned).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == ROOT) {
        parts.pop();
    }
    parts
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The text with comments and string and character literals blanked, newlines kept.
fn lex(text: &str) -> Vec<char> {
    let s: Vec<char> = text.chars().collect();
    let mut out = s.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for c in out.iter_mut().take(to.min(s.len())).skip(from) {
            if *c != '\n' {
                *c = ' ';
            }
        }
    };
    let at = |i: usize, pattern: &str| pattern.chars().enumerate().all(|(k, p)| s.get(i + k) == Some(&p));
    let mut i = 0;
    while i < s.len() {
        let previous_is_ident = i > 0 && is_ident(s[i - 1]);
        if at(i, "//") {
            let end = (i..s.len()).find(|&j| s[j] == '\n').unwrap_or(s.len());
            blank(&mut out, i, end);
            i = end;
        } else if at(i, "/*") {
            let (mut depth, mut j) = (0usize, i);
            while j < s.len() {
                if at(j, "/*") {
                    depth += 1;
                    j += 2;
                } else if at(j, "*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if s[i] == 'r' && !previous_is_ident && matches!(s.get(i + 1), Some('#' | '"')) {
            let hashes = (i + 1..s.len()).take_while(|&j| s[j] == '#').count();
            if s.get(i + 1 + hashes) != Some(&'"') {
                i += 1;
                continue;
            }
            let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            let start = i + 2 + hashes;
            let end = (start..s.len()).find(|&j| at(j, &close)).map_or(s.len(), |j| j + close.len());
            blank(&mut out, i, end);
            i = end;
        } else if s[i] == '"' {
            let mut j = i + 1;
            while j < s.len() && s[j] != '"' {
                j += if s[j] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if s[i] == '\'' {
            // A character literal, or a lifetime or label (left as it is).
            let end = if s.get(i + 1) == Some(&'\\') {
                (i + 3..s.len()).find(|&j| s[j] == '\'').map(|j| j + 1)
            } else if s.get(i + 2) == Some(&'\'') {
                Some(i + 3)
            } else {
                None
            };
            match end {
                Some(end) => {
                    blank(&mut out, i, end);
                    i = end;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Where the item starting at `start` ends: after its `;`, or after the `}` of its body.
fn item_end(s: &[char], start: usize) -> usize {
    let mut depth = 0usize;
    for (j, c) in s.iter().enumerate().skip(start) {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' => depth = depth.saturating_sub(1),
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return j + 1;
                }
            }
            ';' if depth == 0 => return j + 1,
            _ => {}
        }
    }
    s.len()
}

fn ident_at(s: &[char], i: usize) -> String {
    s.iter().skip(i).take_while(|c| is_ident(**c)).collect()
}

fn skip_space(s: &[char], mut i: usize) -> usize {
    while s.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    i
}

/// The paths a use tree at `i` names: `a::b::C`, `a::{b, c::{D, E}}`, `a::*`, `a as b`.
fn use_tree(s: &[char], mut i: usize) -> Vec<Vec<String>> {
    let mut prefix = Vec::new();
    loop {
        i = skip_space(s, i);
        if s.get(i) == Some(&'{') {
            let mut paths = Vec::new();
            let mut j = i + 1;
            loop {
                j = skip_space(s, j);
                if s.get(j).is_none_or(|c| *c == '}') {
                    break;
                }
                for path in use_tree(s, j) {
                    paths.push(prefix.iter().cloned().chain(path).collect());
                }
                let mut depth = 0usize;
                while let Some(c) = s.get(j) {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => break,
                        _ => {}
                    }
                    j += 1;
                }
                if s.get(j) == Some(&',') {
                    j += 1;
                }
            }
            return paths;
        }
        let ident = ident_at(s, i);
        if ident.is_empty() {
            break;
        }
        i += ident.len();
        if ident != "self" {
            prefix.push(ident);
        }
        if s.get(i) == Some(&':') && s.get(i + 1) == Some(&':') {
            i += 2;
        } else {
            break;
        }
    }
    vec![prefix]
}

/// One path in the code: where it is, the module whose code it is in, what it names.
#[derive(Debug)]
struct Reference {
    file: String,
    line: usize,
    from: Vec<String>,
    to: Vec<String>,
    text: String,
}

/// The references of one file, and the modules it declares `#[cfg(test)] mod name;`.
fn references(file: &str, text: &str) -> (Vec<Reference>, Vec<String>) {
    let module = module_path(file);
    let s = lex(text);
    let at = |i: usize, pattern: &str| pattern.chars().enumerate().all(|(k, p)| s.get(i + k) == Some(&p));
    let line_of = |i: usize| s.iter().take(i).filter(|c| **c == '\n').count() + 1;
    let (mut refs, mut test_modules) = (Vec::new(), Vec::new());
    // Inline modules open here, with the brace depth outside them.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < s.len() {
        let boundary = i == 0 || !(is_ident(s[i - 1]) || s[i - 1] == ':');
        if at(i, "#[cfg(test)]") {
            let start = i + "#[cfg(test)]".len();
            let end = item_end(&s, start);
            let item: String = s.get(start..end).unwrap_or_default().iter().collect();
            let words: Vec<&str> = item.split_whitespace().collect();
            if let Some(k) = words.iter().position(|w| *w == "mod")
                && item.trim_end().ends_with(';')
                && !item.contains('{')
                && let Some(name) = words.get(k + 1)
            {
                test_modules.push(name.trim_end_matches(';').to_owned());
            }
            i = end;
            continue;
        }
        if boundary && at(i, "mod ") {
            let name_at = skip_space(&s, i + 4);
            let name = ident_at(&s, name_at);
            if s.get(skip_space(&s, name_at + name.len())) == Some(&'{') && !name.is_empty() {
                inline.push((name, depth));
            }
        }
        match s[i] {
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            _ => {}
        }
        let here: Vec<String> = module.iter().cloned().chain(inline.iter().map(|(n, _)| n.clone())).collect();
        for keyword in ["crate::", "super::", "self::"] {
            if !(boundary && at(i, keyword)) {
                continue;
            }
            let mut base = match keyword {
                "crate::" => Vec::new(),
                "self::" => here.clone(),
                _ => here.get(..here.len().saturating_sub(1)).unwrap_or_default().to_vec(),
            };
            let mut rest = i + keyword.len();
            while at(rest, "super::") {
                base.pop();
                rest += "super::".len();
            }
            let text: String = s.iter().skip(i).take(keyword.len() + 40).collect();
            let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
            for path in use_tree(&s, rest) {
                let to = base.iter().cloned().chain(path).collect();
                refs.push(Reference {
                    file: file.to_owned(),
                    line: line_of(i),
                    from: here.clone(),
                    to,
                    text: text.clone(),
                });
            }
        }
        i += 1;
    }
    (refs, test_modules)
}

fn layer_of(layers: Layers, module: &str) -> Option<(usize, &'static str)> {
    layers.iter().enumerate().find(|(_, (_, modules))| modules.contains(&module)).map(|(i, (name, _))| (i, *name))
}

/// `name` as a path from the crate root, inside `parent`.
fn qualified(parent: &[String], name: &str) -> String {
    match (parent.is_empty(), name == MOD) {
        (true, _) => name.to_owned(),
        (false, true) => parent.join("::"),
        (false, false) => format!("{}::{name}", parent.join("::")),
    }
}

/// What breaks the layers of `parent`'s submodules.
fn check_level(refs: &[Reference], paths: &[Vec<String>], parent: &[String], layers: Layers) -> Vec<String> {
    let top = if parent.is_empty() { ROOT } else { MOD };
    let inside = |path: &[String]| path.len() >= parent.len() && path.get(..parent.len()) == Some(parent);
    let submodules: BTreeSet<String> =
        paths.iter().filter(|p| inside(p)).filter_map(|p| p.get(parent.len()).cloned()).collect();
    let name_of = |path: &[String]| match path.get(parent.len()) {
        Some(next) if submodules.contains(next) => next.clone(),
        _ => top.to_owned(),
    };
    let table = if parent.is_empty() { "LAYERS".to_owned() } else { format!("INNER[{:?}]", parent.join("::")) };
    let mut problems = Vec::new();
    for module in submodules.iter().map(String::as_str).chain([top]) {
        if layer_of(layers, module).is_none() {
            let module = qualified(parent, module);
            problems.push(format!("module `{module}` has no layer: add it to {table} (and to the docs)"));
        }
    }
    for module in layers.iter().flat_map(|(_, modules)| modules.iter()) {
        if *module != top && !submodules.contains(*module) {
            problems.push(format!("{table} names `{}`, which is not a module", qualified(parent, module)));
        }
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for reference in refs.iter().filter(|r| inside(&r.from) && inside(&r.to)) {
        let (from, to) = (name_of(&reference.from), name_of(&reference.to));
        if from == to {
            continue;
        }
        graph.entry(from.clone()).or_default().insert(to.clone());
        if let (Some((from_layer, from_name)), Some((to_layer, to_name))) =
            (layer_of(layers, &from), layer_of(layers, &to))
            && to_layer > from_layer
        {
            problems.push(format!(
                "src/{}:{}: `{}` ({from_name}, layer {}) imports `{}` ({to_name}, layer {}), which is above it: {}",
                reference.file,
                reference.line,
                qualified(parent, &from),
                from_layer + 1,
                qualified(parent, &to),
                to_layer + 1,
                reference.text
            ));
        }
    }
    problems.sort();
    problems.dedup();
    if let Some(circle) = find_circle(&graph) {
        let circle: Vec<String> = circle.iter().map(|m| qualified(parent, m)).collect();
        problems.push(format!("the modules import each other in a circle: {}", circle.join(" -> ")));
    }
    problems
}

/// A circle in `graph`, as the modules along it (the first repeated at the end).
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut circle = stack[at..].to_vec();
            circle.push(node.to_owned());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, stack, done) {
                return Some(circle);
            }
        }
        stack.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// What is wrong with the module graph of `files` (paths relative to `src/`).
fn violations(files: &[(String, String)], top: Layers, inner: &[(&str, Inner)]) -> Vec<String> {
    let mut refs = Vec::new();
    let mut test_only: Vec<Vec<String>> = Vec::new();
    for (file, text) in files {
        let (file_refs, test_modules) = references(file, text);
        refs.extend(file_refs);
        test_only.extend(test_modules.into_iter().map(|m| module_path(file).into_iter().chain([m]).collect()));
    }
    let is_test_only = |path: &[String]| test_only.iter().any(|t| path.get(..t.len()) == Some(t.as_slice()));
    let paths: Vec<Vec<String>> =
        files.iter().map(|(file, _)| module_path(file)).filter(|p| !is_test_only(p)).collect();
    refs.retain(|r| !is_test_only(&r.from));

    let mut problems = check_level(&refs, &paths, &[], top);
    for (parent, rules) in inner {
        let parent: Vec<String> = parent.split("::").map(str::to_owned).collect();
        if !paths.iter().any(|p| p.starts_with(&parent)) {
            problems.push(format!("INNER names `{}`, which is not a module", parent.join("::")));
            continue;
        }
        if let Some(layers) = rules.layers {
            problems.extend(check_level(&refs, &paths, &parent, layers));
        }
        for reference in refs.iter().filter(|r| r.from.starts_with(&parent)) {
            for forbidden in rules.forbidden {
                let forbidden: Vec<String> = forbidden.split("::").map(str::to_owned).collect();
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

/// Every `.rs` file of the library.
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
                out.push((relative, std::fs::read_to_string(&path).unwrap()));
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

    let problems = violations(&files, LAYERS, INNER);

    assert!(problems.is_empty(), "the module graph breaks its layers:\n{}", problems.join("\n"));
}

const TOP: Layers = &[("data", &["host", "config"]), ("engine", &["engine"]), ("glue", &["wasm"]), ("root", &[ROOT])];

#[test]
fn an_upward_import_is_caught_with_its_file_and_line() {
    let files = files(&[
        ("host.rs", "//! The ports.\n\nuse crate::config::Config;\nuse crate::engine::Engine;\n"),
        ("engine/mod.rs", "mod stage;\nuse crate::host::Call;\n"),
        ("engine/stage.rs", "use super::Engine;\n"),
        ("config.rs", ""),
        ("wasm.rs", ""),
        ("lib.rs", "mod host;\n"),
    ]);

    let problems = violations(&files, TOP, &[]);

    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(problems[0].starts_with("src/host.rs:4: `host` (data, layer 1) imports `engine` (engine, layer 2)"));
    assert!(problems[1].contains("circle: engine -> host -> engine"), "{problems:#?}");
}

#[test]
fn grouped_nested_and_macro_paths_count_and_comments_strings_and_tests_do_not() {
    let files = files(&[
        ("config.rs", "use crate::{\n    host,\n    engine::{self, X},\n};\n"),
        ("host.rs", "fn f() { let _ = $crate::wasm::TICK; }\n"),
        (
            "engine/mod.rs",
            "/// See [`crate::wasm::Root`].\n// crate::wasm\nconst A: &str = \"crate::wasm\";\n\
             const B: char = '{';\n#[cfg(test)]\nmod tests {\n    use crate::wasm::X;\n}\n\
             #[cfg(test)]\nmod unit;\n",
        ),
        ("engine/unit.rs", "use crate::wasm::Y;\n"),
        ("wasm.rs", ""),
        ("lib.rs", ""),
    ]);

    let problems = violations(&files, TOP, &[]);

    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(problems[0].starts_with("src/config.rs:1: `config` (data, layer 1) imports `engine`"), "{problems:#?}");
    assert!(problems[1].starts_with("src/host.rs:1: `host` (data, layer 1) imports `wasm`"), "{problems:#?}");
}

#[test]
fn submodules_keep_their_own_layers_and_the_parent_file_is_their_top() {
    const PARTS: Layers = &[("forms", &["model", "raw"]), ("steps", &["parse", "validate"]), ("module", &[MOD])];
    let inner = [("config", Inner { layers: Some(PARTS), forbidden: &[] })];
    let files = files(&[
        ("config/mod.rs", "mod model;\npub use model::Config;\n"),
        ("config/model.rs", "use super::raw::Raw;\n"),
        ("config/raw.rs", ""),
        ("config/parse.rs", "use super::{raw::Raw, Config};\n"),
        ("config/validate/mod.rs", "mod key;\n"),
        ("config/validate/key.rs", "use super::super::model::Key;\nuse crate::config::parse::parse;\n"),
        ("lib.rs", ""),
    ]);
    let top: Layers = &[("config", &["config"]), ("root", &[ROOT])];

    let problems = violations(&files, top, &inner);

    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(
        problems[0]
            .starts_with("src/config/parse.rs:1: `config::parse` (steps, layer 2) imports `config` (module, layer 3)"),
        "{problems:#?}"
    );
}

#[test]
fn an_inline_module_resolves_super_from_itself() {
    const PARTS: Layers = &[("low", &["wire"]), ("high", &["lease"]), ("module", &[MOD])];
    let inner = [("engine", Inner { layers: Some(PARTS), forbidden: &[] })];
    let files = files(&[
        ("engine/mod.rs", ""),
        ("engine/wire.rs", "mod inner {\n    use super::Frame;\n}\nuse super::lease::Lease;\n"),
        ("engine/lease.rs", ""),
        ("lib.rs", ""),
    ]);
    let top: Layers = &[("engine", &["engine"]), ("root", &[ROOT])];

    let problems = violations(&files, top, &inner);

    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(problems[0].starts_with("src/engine/wire.rs:4: `engine::wire` (low, layer 1) imports `engine::lease`"));
}

#[test]
fn a_forbidden_module_is_caught_below_a_module_without_layers() {
    let inner = [("engine", Inner { layers: None, forbidden: &["wasm"] })];
    let files = files(&[
        ("engine/mod.rs", "mod a;\n"),
        ("engine/a.rs", "use super::b::B;\nfn f() { crate::wasm::log(); }\n"),
        ("engine/b.rs", "use super::a::A;\n"),
        ("wasm.rs", ""),
        ("lib.rs", ""),
    ]);
    let top: Layers = &[("engine and glue", &["engine", "wasm"]), ("root", &[ROOT])];

    let problems = violations(&files, top, &inner);

    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(problems[0].starts_with("src/engine/a.rs:2: `engine::a` imports `wasm`, which no module of `engine` may"));
}

#[test]
fn a_module_without_a_layer_and_a_stale_entry_are_caught() {
    let files = files(&[("gadgets.rs", ""), ("lib.rs", "")]);
    let inner = [("gone", Inner { layers: None, forbidden: &[] })];

    let problems = violations(&files, TOP, &inner);

    assert!(problems.iter().any(|p| p.starts_with("module `gadgets` has no layer")), "{problems:#?}");
    assert!(problems.iter().any(|p| p == "LAYERS names `engine`, which is not a module"), "{problems:#?}");
    assert!(problems.iter().any(|p| p == "INNER names `gone`, which is not a module"), "{problems:#?}");
}
