//! Whether the checker reads paths as the compiler resolves them (grouped, nested, from
//! submodules and inline modules, in macros) and ignores what is no import (comments,
//! strings, test-only code); and whether this crate's own modules keep their layers.

use super::*;

#[test]
fn the_testkit_imports_only_downwards_and_in_no_circle() {
    assert_library_keeps(&TESTKIT, env!("CARGO_MANIFEST_DIR"), 10);
}

/// This crate's layers (see its docs, "Layout").
const TESTKIT: Layers = Layers::new(&[
    ("std only", &["bucket", "rng", "wait"]),
    ("the layer checker", &["layers"]),
    ("loopback peers", &["peers"]),
    ("Redis", &["redis"]),
    ("crate root", &[ROOT]),
])
.with_inner(&[
    (
        "layers",
        Inner::layered(&[
            ("the lexer and the spec", &["lex", "spec"]),
            ("paths", &["references"]),
            ("levels", &["check"]),
            ("the checker", &[MOD]),
        ]),
    ),
    (
        "peers",
        Inner::layered(&[
            ("HTTP and ports", &["http", "accept"]),
            ("the scripted peer", &["scripted"]),
            ("the module", &[MOD]),
        ]),
    ),
]);

const TOP: Layers =
    Layers::new(&[("data", &["host", "config"]), ("engine", &["engine"]), ("glue", &["wasm"]), ("root", &[ROOT])]);

#[test]
fn grouped_nested_and_macro_paths_count_and_comments_strings_and_tests_do_not() {
    let files = fixture(&[
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

    assert_found(
        &violations(&files, &TOP),
        &[
            "src/config.rs:1: `config` (data, layer 1) imports `engine`",
            "src/host.rs:1: `host` (data, layer 1) imports `wasm`",
        ],
    );
}

#[test]
fn submodules_keep_their_own_layers_and_the_parent_file_is_their_top() {
    const PARTS: &[Layer] = &[("forms", &["model", "raw"]), ("steps", &["parse", "validate"]), ("module", &[MOD])];
    const SPEC: Layers =
        Layers::new(&[("config", &["config"]), ("root", &[ROOT])]).with_inner(&[("config", Inner::layered(PARTS))]);
    let files = fixture(&[
        ("config/mod.rs", "mod model;\npub use model::Config;\n"),
        ("config/model.rs", "use super::raw::Raw;\n"),
        ("config/raw.rs", ""),
        ("config/parse.rs", "use super::{raw::Raw, Config};\n"),
        ("config/validate/mod.rs", "mod key;\n"),
        ("config/validate/key.rs", "use super::super::model::Key;\nuse crate::config::parse::parse;\n"),
        ("lib.rs", ""),
    ]);

    assert_found(
        &violations(&files, &SPEC),
        &["src/config/parse.rs:1: `config::parse` (steps, layer 2) imports `config` (module, layer 3)"],
    );
}

#[test]
fn an_inline_module_resolves_super_from_itself() {
    let files = fixture(&[
        ("engine/mod.rs", ""),
        ("engine/wire.rs", "mod inner {\n    use super::Frame;\n}\nuse super::lease::Lease;\n"),
        ("engine/lease.rs", ""),
        ("lib.rs", ""),
    ]);
    const PARTS: &[Layer] = &[("low", &["wire"]), ("high", &["lease"]), ("module", &[MOD])];
    const SPEC: Layers =
        Layers::new(&[("engine", &["engine"]), ("root", &[ROOT])]).with_inner(&[("engine", Inner::layered(PARTS))]);

    assert_found(
        &violations(&files, &SPEC),
        &["src/engine/wire.rs:4: `engine::wire` (low, layer 1) imports `engine::lease`"],
    );
}

#[test]
fn a_forbidden_module_is_caught_below_a_module_without_layers() {
    let spec = Layers::new(&[("engine and glue", &["engine", "wasm"]), ("root", &[ROOT])])
        .with_inner(&[("engine", Inner { layers: None, forbidden: &["wasm"] })]);
    let files = fixture(&[
        ("engine/mod.rs", "mod a;\n"),
        ("engine/a.rs", "use super::b::B;\nfn f() { crate::wasm::log(); }\n"),
        ("engine/b.rs", "use super::a::A;\n"),
        ("wasm.rs", ""),
        ("lib.rs", ""),
    ]);

    assert_found(
        &violations(&files, &spec),
        &["src/engine/a.rs:2: `engine::a` imports `wasm`, which no module of `engine` may"],
    );
}

#[test]
fn a_fixture_with_some_of_the_modules_is_judged_on_its_imports_alone() {
    let files =
        fixture(&[("host.rs", "use crate::engine::Engine;\n"), ("engine.rs", ""), ("gadgets.rs", ""), ("lib.rs", "")]);

    assert_found(
        &import_violations(&files, &TOP),
        &["module `gadgets` has no layer: add it to LAYERS", "src/host.rs:1: `host` (data, layer 1) imports `engine`"],
    );
    assert!(violations(&files, &TOP).iter().any(|p| p == "LAYERS names `config`, which is not a module"));
}
