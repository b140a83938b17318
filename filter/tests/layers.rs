//! The library's module graph: layers that only point down, and no import circle (see
//! the crate docs, "Layout", and `config`'s). The checker is the workspace's
//! (`sluice_testkit::layers`); this file holds the filter's table: [`LAYERS`] for the
//! crate's top-level modules, [`INNER`] for the submodules of a module. A module with no
//! layer fails, and so does a table entry that names no module.

use sluice_testkit::layers::{
    Inner, Layer, Layers, MOD, ROOT, assert_found, assert_library_keeps, fixture, import_violations, violations,
};

/// The crate's top-level modules.
const LAYERS: &[Layer] = &[
    (
        "the configuration, the ports and their metric names, the due queue and the usage reader",
        &["config", "host", "series", "due", "usage"],
    ),
    ("fakes of the ports", &["testing"]),
    ("policy matching", &["policy"]),
    ("engine", &["engine"]),
    ("the worker: held requests behind a port", &["worker"]),
    ("host calls", &["abi"]),
    ("the worker's ports on the host", &["adapters"]),
    ("proxy-wasm glue", &["wasm"]),
    ("crate root", &[ROOT]),
];

/// The rules inside modules, keyed by the module's path: add a module's layers here.
const INNER: &[(&str, Inner)] = &[
    ("config", Inner::layered(CONFIG)),
    ("config::model", Inner::layered(CONFIG_MODEL)),
    ("config::raw", Inner::layered(CONFIG_RAW)),
    ("config::validate", Inner::layered(CONFIG_VALIDATE)),
    // Its own layers are the engine's to add; it never reaches the proxy-wasm glue.
    ("engine", Inner { layers: Some(ENGINE), forbidden: &["wasm", "abi", "adapters", "worker"] }),
    ("engine::request", Inner::layered(ENGINE_REQUEST)),
    ("worker", Inner { layers: Some(WORKER), forbidden: &["wasm", "abi", "adapters"] }),
];

const ENGINE: &[Layer] = &[
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
            "check_group",
            "settle_queue",
            "evidence",
            "secrets",
            "held",
            "spells",
        ],
    ),
    ("the compiled configuration and the worker's bookkeeping", &["setup"]),
    (
        "what the service's answers leave behind (settlements, lease returns, overrides noted); concurrency slots \
         released and renewed",
        &["settlement", "lease_return", "overridden", "slots"],
    ),
    ("the request path, and the calls the root sends", &["request", "outgoing"]),
    ("the engine: the one place the glue calls", &[MOD]),
];
const ENGINE_REQUEST: &[Layer] = &[
    ("the states a request goes through", &["state"]),
    ("resolve; settle a cost after the response", &["resolve", "settle"]),
    ("admit or reject: the end of every path", &["admit"]),
    ("the failure rule", &["fallback"]),
    ("the stages that decide", &["local", "check", "lease"]),
    ("the pipeline that chains them", &[MOD]),
];
const WORKER: &[Layer] = &[
    ("the port, the setup, the batched counts, a stream's costs", &["port", "setup", "batched", "costs"]),
    ("the worker", &[MOD]),
];
const CONFIG: &[Layer] = &[
    ("the two forms and the error", &["model", "raw", "error"]),
    ("the two steps: parse and validate", &["parse", "validate"]),
    ("the module: map, re-exports, entry", &[MOD]),
];
const CONFIG_MODEL: &[Layer] = &[
    ("every bound and default", &["bounds"]),
    ("what a policy reads from a request", &["request"]),
    ("global settings", &["global"]),
    ("a policy, the response", &["policy", "response"]),
    ("the document", &[MOD]),
];
const CONFIG_RAW: &[Layer] = &[("the hand-written forms", &["forms", "cost"]), ("the raw document", &[MOD])];
const CONFIG_VALIDATE: &[Layer] = &[
    ("the issues", &["issues"]),
    ("single values", &["fields"]),
    ("a policy's parts, the response", &["key", "matcher", "limit", "cost", "response"]),
    ("global settings", &["global"]),
    ("one policy", &["policy"]),
    ("the document", &[MOD]),
];

/// The filter's spec: [`LAYERS`], then [`INNER`].
const SPEC: Layers = Layers::new(LAYERS).with_inner(INNER);

#[test]
fn the_library_imports_only_downwards_and_in_no_circle() {
    assert_library_keeps(&SPEC, env!("CARGO_MANIFEST_DIR"), 31);
}

#[test]
fn an_upward_import_is_caught_with_its_file_and_line() {
    let files = fixture(&[
        ("host.rs", "//! The ports.\n\nuse crate::config::Config;\nuse crate::engine::Engine;\n"),
        ("engine/mod.rs", "mod stage;\nuse crate::host::Call;\n"),
        ("engine/stage.rs", "use super::Engine;\n"),
        ("config.rs", ""),
        ("wasm.rs", ""),
        ("lib.rs", "mod host;\n"),
    ]);

    assert_found(
        &import_violations(&files, &Layers::new(LAYERS)),
        &[
            "src/host.rs:4: `host` (the configuration, the ports and their metric names, the due queue and the usage reader, layer 1) \
             imports `engine` (engine, layer 4)",
            "the modules import each other in a circle: engine -> host -> engine",
        ],
    );
}

#[test]
fn a_module_without_a_layer_and_a_stale_entry_are_caught() {
    let files = fixture(&[("gadgets.rs", ""), ("lib.rs", "")]);
    let spec = Layers::new(LAYERS).with_inner(&[("gone", Inner { layers: None, forbidden: &[] })]);

    let problems = violations(&files, &spec);

    assert!(problems.iter().any(|p| p.starts_with("module `gadgets` has no layer")), "{problems:#?}");
    assert!(problems.iter().any(|p| p == "LAYERS names `engine`, which is not a module"), "{problems:#?}");
    assert!(problems.iter().any(|p| p == "INNER names `gone`, which is not a module"), "{problems:#?}");
}

/// The numbered list that follows `heading` in `text` (a module's docs, without their
/// `//! `, or a README): each item's text, continuation lines joined.
fn numbered_list(text: &str, heading: &str) -> Vec<String> {
    let mut items: Vec<String> = Vec::new();
    let mut lines = text.lines().skip_while(|line| line.trim() != heading).skip(1);
    for line in lines.by_ref() {
        let trimmed = line.trim();
        let numbered = trimmed.split_once(". ").filter(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        match numbered {
            Some((_, rest)) => items.push(rest.to_owned()),
            None if trimmed.is_empty() && items.is_empty() => {}
            None if trimmed.is_empty() || trimmed.starts_with('#') => break,
            None => {
                if let Some(last) = items.last_mut() {
                    last.push(' ');
                    last.push_str(trimmed);
                }
            }
        }
    }
    items
}

/// The names in backticks in `text` that are plain identifiers (module names).
fn ticked(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|word| !word.is_empty() && word.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        .map(str::to_owned)
        .collect()
}

/// A source file's module docs, without their `//! `.
fn module_docs(file: &str) -> String {
    let source = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
    source
        .lines()
        .filter_map(|line| line.strip_prefix("//!"))
        .map(|line| line.trim_start())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A table's layers, as the docs list them: each layer's modules, the root or a module's
/// own file (`this root`, `this file`) naming none.
fn listed(layers: &[Layer]) -> Vec<Vec<String>> {
    layers
        .iter()
        .map(|(_, modules)| modules.iter().filter(|m| **m != ROOT && **m != MOD).map(|m| (*m).to_owned()).collect())
        .collect()
}

#[test]
fn the_layer_lists_of_the_module_docs_are_the_tables_this_file_enforces() {
    for (file, heading, layers) in [("src/lib.rs", "# Layout", LAYERS), ("src/engine/mod.rs", "# Layers", ENGINE)] {
        let documented: Vec<Vec<String>> =
            numbered_list(&module_docs(file), heading).iter().map(|item| ticked(item)).collect();

        assert_eq!(documented, listed(layers), "{file}, {heading}");
    }
}

#[test]
fn the_request_path_in_the_readme_and_the_module_docs_is_every_stage_the_table_holds() {
    let first = |item: &String| ticked(&item.replace(".rs`", "`")).into_iter().next().unwrap_or_default();
    let readme = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let in_readme: Vec<String> = numbered_list(&readme, "### A request, file by file").iter().map(first).collect();
    let in_docs: Vec<String> =
        numbered_list(&module_docs("src/engine/request/mod.rs"), "").iter().map(first).collect::<Vec<_>>();
    // Every module of the request path is a stage but `state`, what the stages pass.
    let mut stages: Vec<String> = listed(ENGINE_REQUEST).concat().into_iter().filter(|m| m != "state").collect();

    assert_eq!(in_readme, in_docs, "the README and the module docs list the stages in one order");
    let mut documented = in_docs.clone();
    documented.sort();
    stages.sort();
    assert_eq!(documented, stages, "the stages are the request path's modules");
}
