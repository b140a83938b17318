//! The library's module graph: layers that only point down, and no import circle (see
//! the crate docs, "Layout"). The checker is the workspace's (`sluice_testkit::layers`):
//! every `crate::`, `super::` and `self::` path in `src/` (outside comments and
//! `#[cfg(test)]` code) is an edge from the top-level module of its file to the
//! top-level module it names; a path to an item of the crate root (a re-export such as
//! `crate::StreamId`) is an edge to the root, the top layer. An edge to a higher layer
//! fails, and so does a circle, even within one layer. A module that has no layer fails
//! too: a new module must be placed.

use sluice_testkit::layers::{Layers, ROOT, assert_found, assert_library_keeps, fixture, import_violations};

/// The layers, from the bottom; a module may import from its own layer and those below.
const LAYERS: Layers = Layers::new(&[
    (
        "data",
        &[
            "headers",
            "request",
            "clock",
            "logs",
            "metrics",
            "shared_data",
            "callout",
            "counts",
            "rewrite",
            "probe",
            "profile",
            "error",
        ],
    ),
    ("shared services", &["services"]),
    ("VM state", &["state"]),
    ("host functions", &["abi"]),
    ("engine and linker", &["engine"]),
    ("worker", &["worker"]),
    ("facade", &["host"]),
    ("serve", &["serve"]),
    ("crate root", &[ROOT]),
]);

#[test]
fn the_library_imports_only_downwards_and_in_no_circle() {
    assert_library_keeps(&LAYERS, env!("CARGO_MANIFEST_DIR"), 31);
}

#[test]
fn an_upward_import_is_caught_with_its_file_and_line() {
    let files = fixture(&[
        ("state.rs", "//! The VM state.\n\nuse crate::headers::Headers;\nuse crate::worker::Worker;\n"),
        ("worker/mod.rs", "mod stream;\nuse crate::state::Vm;\n"),
        ("worker/stream.rs", "use super::Worker;\n"),
        ("headers.rs", ""),
        ("lib.rs", "mod state;\n"),
    ]);

    assert_found(
        &import_violations(&files, &LAYERS),
        &[
            "src/state.rs:4: `state` (VM state, layer 3) imports `worker` (worker, layer 6)",
            "the modules import each other in a circle: state -> worker -> state",
        ],
    );
}

#[test]
fn grouped_inline_and_macro_paths_count_and_comments_and_tests_do_not() {
    let files = fixture(&[
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

    assert_found(
        &import_violations(&files, &LAYERS),
        &[
            "src/abi/log.rs:1: `abi` (host functions, layer 4) imports `lib`",
            "src/abi/mod.rs:1: `abi` (host functions, layer 4) imports `host`",
            "src/abi/time.rs:1: `abi` (host functions, layer 4) imports `engine`",
            "src/state.rs:7: `state` (VM state, layer 3) imports `engine`",
        ],
    );
}

#[test]
fn a_circle_within_one_layer_is_caught() {
    let files = fixture(&[
        ("headers.rs", "use crate::request::Request;\n"),
        ("request.rs", "use crate::headers::Headers;\n"),
        ("lib.rs", ""),
    ]);

    let problems = import_violations(&files, &LAYERS);

    assert_eq!(problems, vec!["the modules import each other in a circle: headers -> request -> headers".to_owned()]);
}

#[test]
fn a_module_without_a_layer_is_caught() {
    let files = fixture(&[("gadgets.rs", ""), ("lib.rs", "")]);

    assert_eq!(import_violations(&files, &LAYERS).len(), 1);
}
