//! The secrets a configuration names (the operator's hash key, the service token), read
//! inline or from the VM's environment and checked, with an error that names the field
//! and never shows the secret.

use crate::config::{Issue, SecretSource};

/// Reads a secret from the configuration or from the VM's environment.
pub(crate) fn secret(
    source: &SecretSource,
    field: &str,
    env: &impl Fn(&str) -> Option<String>,
    min_bytes: usize,
) -> Result<String, Issue> {
    let value = match source {
        SecretSource::Inline(secret) => secret.expose().to_owned(),
        SecretSource::Env(name) => match env(name) {
            Some(value) if !value.is_empty() => value,
            _ => {
                return Err(Issue {
                    path: format!("counter_service.{field}_env"),
                    message: format!(
                        "the VM has no environment variable {name:?} (set it in vm_config.environment_variables)"
                    ),
                });
            }
        },
    };
    if value.len() < min_bytes {
        let source = match source {
            SecretSource::Inline(_) => field.to_owned(),
            SecretSource::Env(name) => format!("{field}_env ({name})"),
        };
        return Err(Issue {
            path: format!("counter_service.{source}"),
            message: format!("must be at least {min_bytes} bytes"),
        });
    }
    if !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Issue {
            path: format!("counter_service.{field}"),
            message: "expected visible ASCII characters without spaces".to_owned(),
        });
    }
    Ok(value)
}
