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
    ("the configuration, the ports, the due queue and the usage reader", &["config", "host", "due", "usage"]),
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
            "settle_queue",
            "evidence",
            "secrets",
            "held",
        ],
    ),
    ("the compiled configuration and the worker's bookkeeping", &["setup"]),
    (
        "what the service's answers leave behind (settlements, overrides noted); concurrency slots released and \
         renewed",
        &["settlement", "overridden", "slots"],
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
            "src/host.rs:4: `host` (the configuration, the ports, the due queue and the usage reader, layer 1) \
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
