//! Configuration files: every invalid fixture is rejected with its exact message, every
//! example loads, and the committed JSON Schema matches the parser.
//!
//! `SLUICE_BLESS=1 cargo test -p sluice-filter --test config_files` rewrites the `.err`
//! files and `config.schema.json` from the current code (review the diff).

use sluice::config::{self, Config, ConfigError};
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn bless() -> bool {
    std::env::var_os("SLUICE_BLESS").is_some()
}

fn files(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == extension))
        .collect();
    files.sort();
    files
}

fn schema() -> serde_json::Value {
    serde_json::from_str(&fs::read_to_string(root().join("config.schema.json")).unwrap()).unwrap()
}

fn invalid_fixtures() -> Vec<PathBuf> {
    files(&root().join("tests/fixtures/invalid"), "json")
}

/// The example configurations shipped in `examples/`.
fn examples() -> Vec<PathBuf> {
    files(&root().join("../examples"), "json")
}

#[test]
fn every_invalid_fixture_is_rejected_with_its_expected_message() {
    let fixtures = invalid_fixtures();
    assert!(fixtures.len() >= 30, "expected the fixture set, found {}", fixtures.len());
    for fixture in fixtures {
        let error =
            Config::from_json(&fs::read(&fixture).unwrap()).expect_err(&format!("{} was accepted", fixture.display()));
        let expected_path = fixture.with_extension("err");
        if bless() {
            fs::write(&expected_path, format!("{error}\n")).unwrap();
            continue;
        }
        let expected =
            fs::read_to_string(&expected_path).unwrap_or_else(|_| panic!("{} is missing", expected_path.display()));
        assert_eq!(error.to_string(), expected.trim_end(), "{}", fixture.display());
    }
}

#[test]
fn every_message_names_a_field_path() {
    for fixture in invalid_fixtures() {
        let error = Config::from_json(&fs::read(&fixture).unwrap()).unwrap_err();
        for line in error.to_string().lines() {
            let (path, message) = line.split_once(": ").unwrap_or_else(|| panic!("{line:?} has no path"));
            assert!(!path.is_empty() && !message.is_empty(), "{}: {line:?}", fixture.display());
            assert!(!message.contains("line 1 column") || path == "configuration", "{line:?} leaks a position");
        }
    }
}

#[test]
fn every_example_configuration_loads() {
    let examples = examples();
    assert!(examples.len() >= 6, "expected the example set, found {}", examples.len());
    for example in examples {
        if let Err(error) = Config::from_json(&fs::read(&example).unwrap()) {
            panic!("{} is invalid: {error}", example.display());
        }
    }
}

#[test]
fn the_committed_schema_is_the_one_the_parser_generates() {
    let generated = config::json_schema();
    let path = root().join("config.schema.json");
    if bless() {
        fs::write(&path, serde_json::to_string_pretty(&generated).unwrap() + "\n").unwrap();
        return;
    }
    assert_eq!(schema(), generated, "config.schema.json is stale: run with SLUICE_BLESS=1");
}

#[test]
fn every_example_validates_against_the_schema() {
    let validator = jsonschema::validator_for(&schema()).unwrap();
    for example in examples() {
        let document: serde_json::Value = serde_json::from_slice(&fs::read(&example).unwrap()).unwrap();
        let errors: Vec<String> = validator.iter_errors(&document).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{}: {errors:?}", example.display());
    }
}

#[test]
fn every_fixture_with_a_shape_error_fails_the_schema() {
    let validator = jsonschema::validator_for(&schema()).unwrap();
    let mut shape_errors = 0;
    for fixture in invalid_fixtures() {
        let bytes = fs::read(&fixture).unwrap();
        let Ok(document) = serde_json::from_slice::<serde_json::Value>(&bytes) else { continue };
        if let Err(ConfigError::Syntax { .. }) = Config::from_json(&bytes) {
            shape_errors += 1;
            assert!(!validator.is_valid(&document), "{} passes the schema but not the parser", fixture.display());
        }
    }
    assert!(shape_errors >= 10, "only {shape_errors} shape-error fixtures");
}

/// Every property of the schema, with its path, however deep.
fn properties(value: &serde_json::Value, path: &str, out: &mut Vec<(String, serde_json::Value)>) {
    match value {
        serde_json::Value::Object(map) => {
            if let Some(serde_json::Value::Object(props)) = map.get("properties") {
                for (name, prop) in props {
                    out.push((format!("{path}.{name}"), prop.clone()));
                }
            }
            for (key, inner) in map {
                properties(inner, &format!("{path}/{key}"), out);
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|item| properties(item, path, out)),
        _ => {}
    }
}

#[test]
fn every_default_and_range_a_schema_description_states_is_the_one_the_constants_give_the_schema() {
    let mut all = Vec::new();
    properties(&config::json_schema(), "", &mut all);
    let mut checked = 0;
    for (path, prop) in all {
        let description = prop["description"].as_str().unwrap_or_default();
        let number = |word: &str| word.trim_end_matches(['.', ',', ';', ')']).parse::<u64>().ok();
        let words: Vec<&str> = description.split_whitespace().collect();
        if let Some(i) = words.iter().position(|w| *w == "Default" || *w == "default:") {
            let stated = match &prop["default"] {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Number(n) => Some(n.to_string()),
                serde_json::Value::Bool(b) => Some(b.to_string()),
                _ => None,
            };
            if let (Some(stated), Some(next)) = (stated, words.get(i + 1)) {
                assert_eq!(next.trim_matches(['`', '.']), stated, "{path}: {description:?}");
                checked += 1;
            }
        }
        for pair in words.windows(3).filter(|w| w[1] == "to") {
            if let (Some(low), Some(high)) = (number(pair[0]), number(pair[2])) {
                let bound = |number: &str, length: &str| prop[number].as_u64().or_else(|| prop[length].as_u64());
                assert_eq!(bound("minimum", "minLength"), Some(low), "{path}: {description:?}");
                assert_eq!(bound("maximum", "maxLength"), Some(high), "{path}: {description:?}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 20, "only {checked} stated defaults and ranges");
}
