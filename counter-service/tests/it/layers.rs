//! Whether the library's modules import only downwards, in no circle (see the crate
//! docs, "Layout").
//!
//! The checker is the workspace's (`sluice_testkit::layers`): every `crate::`, `super::`
//! and `self::` path in `src/` (outside comments and `#[cfg(test)]` code) is an edge from
//! the top-level module of its file to the top-level module it names; a path to an item
//! of the crate root (a re-export such as `crate::App`) is an edge to the root, the top
//! layer. An edge to a higher layer fails, and so does a circle, even within one layer.
//! A module that has no layer fails too: a new module must be placed.

use sluice_testkit::layers::{Layers, ROOT, assert_found, assert_library_keeps, fixture, import_violations};

/// The layers, from the bottom; a module may import from its own layer and those below.
const LAYERS: Layers = Layers::new(&[
    ("limits", &["spec"]),
    ("requests and plans", &["api", "overrides"]),
    ("stores", &["store"]),
    ("calls, and the policies they name", &["call", "policies"]),
    ("overrides applied", &["enforce"]),
    ("settings, callers and metrics", &["auth", "config", "metrics"]),
    ("what a request is served with", &["app"]),
    ("decisions, alone and in batches", &["handle", "admin", "batch"]),
    ("HTTP", &["routes", "conn"]),
    ("serving", &["server"]),
    ("Envoy's rate limit service protocol (RLS v3), served as the JSON API is", &["rls"]),
    ("the admin CLI", &["cli"]),
    ("crate root", &[ROOT]),
]);

#[test]
fn the_library_imports_only_downwards_and_in_no_circle() {
    assert_library_keeps(&LAYERS, env!("CARGO_MANIFEST_DIR"), 19);
}

#[test]
fn an_upward_import_a_circle_and_an_unplaced_module_are_caught() {
    let files = fixture(&[
        ("store.rs", "mod memory;\nuse crate::api::CheckPlan;\n"),
        ("store/memory.rs", "use super::CounterStoreError;\nuse crate::{\n    metrics::Metrics,\n};\n"),
        ("api.rs", "/// See [`crate::app::App`].\n#[cfg(test)]\nmod tests {\n    use crate::server::serve;\n}\n"),
        ("metrics.rs", "use crate::store::CounterStore;\n"),
        ("gadgets.rs", ""),
        ("lib.rs", ""),
    ]);

    assert_found(
        &import_violations(&files, &LAYERS),
        &[
            "module `gadgets` has no layer",
            "src/store/memory.rs:2: `store` (stores, layer 3) imports `metrics`",
            "the modules import each other in a circle: metrics -> store -> metrics",
        ],
    );
}
