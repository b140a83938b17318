//! How a configuration's JSON is read into its raw form: strictly, stopping at the
//! first malformed value, with a message located by that value's path and written in
//! the words of the configuration rather than of Rust.

use super::error::ConfigError;
use super::raw::RawConfig;

/// Parses the JSON into its raw form.
///
/// # Errors
/// [`ConfigError::Syntax`].
pub fn parse(bytes: &[u8]) -> Result<RawConfig, ConfigError> {
    // serde accepts a JSON array for a struct (as a tuple); a configuration is an object.
    if bytes.trim_ascii_start().first().is_some_and(|b| *b != b'{') {
        return Err(ConfigError::Syntax { path: ".".to_owned(), message: "expected a JSON object".to_owned() });
    }
    let deserializer = &mut serde_json::Deserializer::from_slice(bytes);
    let raw: RawConfig = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let mut path = e.path().to_string();
        let inner = e.into_inner();
        let message = if inner.is_data() {
            // Data errors are located by the path; the position adds nothing.
            let text = inner.to_string();
            let text = match text.rfind(" at line ") {
                Some(cut) => text.get(..cut).unwrap_or(&text).to_owned(),
                None => text,
            };
            plain_types(&text)
        } else {
            if path.contains('?') {
                path = ".".to_owned();
            }
            // Syntax and end-of-input errors: the position is the only location there is.
            format!("invalid JSON: {inner}")
        };
        ConfigError::Syntax { path, message }
    })?;
    Ok(raw)
}

/// Replaces Rust type names in serde's messages with what a person writes.
fn plain_types(message: &str) -> String {
    let mut out = message.to_owned();
    for (rust, plain) in [
        ("expected u64", "expected a non-negative integer"),
        ("expected u32", "expected a non-negative integer below 2^32"),
        ("expected u16", "expected an integer from 0 to 65535"),
        ("expected u8", "expected an integer from 0 to 255"),
        ("expected a boolean", "expected true or false"),
    ] {
        if let Some(stripped) = out.strip_suffix(rust) {
            out = format!("{stripped}{plain}");
        }
    }
    out
}
