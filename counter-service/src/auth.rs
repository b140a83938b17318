//! Who may call the service: callers with the bearer token it shares with them.
//!
//! With a token configured, every route except the probes (`/healthz`, `/readyz`,
//! `/metrics`) answers `401 unauthorized` to a request whose single `authorization`
//! header is not `Bearer <token>`. The service can spend anyone's budget, so only the
//! proxies that enforce the limits may call it.
//!
//! * **Constant time.** The presented token is compared with [`subtle`]'s
//!   `ConstantTimeEq`, so the time a refusal takes says nothing about how many leading
//!   bytes were right. (Only the length can show, as with any such comparison; a token
//!   from a random generator has a length that tells nothing.)
//! * **Never shown.** [`Token`]'s `Debug` prints `<redacted>`, no log line, metric or
//!   error message includes it, and a refusal says which rule failed, never what was
//!   sent or expected.
//! * **Kept out of `ps`.** The token comes from a file (`--token-file`) or the
//!   environment (`SLUICE_COUNTER_TOKEN`); `--token` on the command line works too but
//!   shows in the process list.

use std::fmt;
use std::path::Path;

use axum::http::{HeaderMap, header};
use subtle::ConstantTimeEq;

/// A bearer token: visible ASCII without spaces (RFC 6750's `token68` and more), never
/// empty. Its `Debug` form hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// A token from its text; `source` names where it came from (`--token`,
    /// `--token-file /etc/sluice/token`) for the error.
    ///
    /// # Errors
    /// A message naming `source` when the text is empty or holds anything but visible
    /// ASCII (a space or control character would never survive an HTTP header intact).
    pub fn new(text: &str, source: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Err(format!("{source}: the token is empty"));
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!("{source}: the token must be visible ASCII characters, without spaces"));
        }
        Ok(Self(text.to_owned()))
    }

    /// Reads a token file: its whole content, less trailing line breaks.
    ///
    /// # Errors
    /// A message naming `--token-file` and the path when the file cannot be read, is
    /// empty, or holds anything but one token.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let source = format!("--token-file {}", path.display());
        let text = std::fs::read_to_string(path).map_err(|e| format!("{source}: cannot read the token: {e}"))?;
        Self::new(text.trim_end_matches(['\n', '\r']), &source)
    }

    /// Whether `presented` is this token, in time independent of where they differ.
    fn matches(&self, presented: &[u8]) -> bool {
        self.0.as_bytes().ct_eq(presented).into()
    }
}

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No `authorization` header.
    Missing,
    /// More than one `authorization` header: which one counts would be a guess.
    Several,
    /// A scheme other than `Bearer`, or no credentials after it.
    Scheme,
    /// A bearer token that is not the configured one.
    Token,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Missing => "authorization: this service needs `authorization: Bearer <token>`",
            Self::Several => "authorization: send exactly one authorization header",
            Self::Scheme => "authorization: the scheme must be Bearer, followed by the token",
            Self::Token => "authorization: the bearer token is not the one this service is configured with",
        })
    }
}

/// Who may call the service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Auth {
    /// Anyone (no token configured).
    #[default]
    Open,
    /// Callers presenting this bearer token.
    Bearer(Token),
}

impl Auth {
    /// Whether a request with `headers` may proceed.
    ///
    /// # Errors
    /// The [`Refusal`] when it may not.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        self.check_values(headers.get_all(header::AUTHORIZATION).iter().map(|value| value.as_bytes()))
    }

    /// Whether a request whose `authorization` headers hold `values` (in order) may
    /// proceed: [`Auth::check`] without a header map.
    ///
    /// # Errors
    /// The [`Refusal`] when it may not.
    pub fn check_values<'a>(&self, mut values: impl Iterator<Item = &'a [u8]>) -> Result<(), Refusal> {
        let Self::Bearer(token) = self else { return Ok(()) };
        let bytes = values.next().ok_or(Refusal::Missing)?;
        if values.next().is_some() {
            return Err(Refusal::Several);
        }
        // RFC 9110 §11.1: the scheme is case-insensitive, then one or more spaces.
        let space = bytes.iter().position(|b| *b == b' ');
        let (scheme, rest) = space.and_then(|i| bytes.split_at_checked(i)).ok_or(Refusal::Scheme)?;
        if !scheme.eq_ignore_ascii_case(b"bearer") {
            return Err(Refusal::Scheme);
        }
        let presented = rest.trim_ascii();
        if presented.is_empty() {
            return Err(Refusal::Scheme);
        }
        if token.matches(presented) { Ok(()) } else { Err(Refusal::Token) }
    }

    /// Whether a token is configured.
    pub const fn is_required(&self) -> bool {
        matches!(self, Self::Bearer(_))
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn bearer() -> Auth {
        Auth::Bearer(Token::new("s3cr3t-T0ken", "--token").unwrap())
    }

    fn headers(values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        }
        map
    }

    #[test]
    fn the_right_bearer_token_is_admitted_whatever_the_scheme_case() {
        assert_eq!(bearer().check(&headers(&["Bearer s3cr3t-T0ken"])), Ok(()));
        assert_eq!(bearer().check(&headers(&["bearer  s3cr3t-T0ken"])), Ok(()));
    }

    #[test]
    fn a_request_without_the_header_is_refused_as_missing() {
        assert_eq!(bearer().check(&HeaderMap::new()), Err(Refusal::Missing));
    }

    #[test]
    fn another_token_a_prefix_or_a_longer_one_is_refused() {
        for wrong in ["Bearer s3cr3t-T0kem", "Bearer s3cr3t", "Bearer s3cr3t-T0ken2", "Bearer S3CR3T-T0KEN"] {
            assert_eq!(bearer().check(&headers(&[wrong])), Err(Refusal::Token), "{wrong}");
        }
    }

    #[test]
    fn another_scheme_or_a_bare_token_is_refused_as_the_wrong_scheme() {
        for wrong in ["Basic czNjcjN0LVQwa2Vu", "s3cr3t-T0ken", "Bearer", "Bearer ", "Token s3cr3t-T0ken"] {
            assert_eq!(bearer().check(&headers(&[wrong])), Err(Refusal::Scheme), "{wrong}");
        }
    }

    #[test]
    fn two_authorization_headers_are_refused_even_if_one_is_right() {
        let both = headers(&["Bearer s3cr3t-T0ken", "Bearer other"]);

        assert_eq!(bearer().check(&both), Err(Refusal::Several));
    }

    #[test]
    fn without_a_token_everything_is_admitted() {
        assert_eq!(Auth::Open.check(&HeaderMap::new()), Ok(()));
    }

    #[test]
    fn the_debug_form_never_shows_the_token() {
        let shown = format!("{:?} {:?}", bearer(), Token::new("s3cr3t-T0ken", "--token").unwrap());

        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    #[test]
    fn refusals_never_quote_a_token() {
        for refusal in [Refusal::Missing, Refusal::Several, Refusal::Scheme, Refusal::Token] {
            assert!(refusal.to_string().starts_with("authorization: "), "{refusal}");
        }
    }

    #[test]
    fn a_token_file_loses_its_trailing_line_break() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cr3t-T0ken\r\n").unwrap();

        assert_eq!(Token::from_file(&path).unwrap(), Token::new("s3cr3t-T0ken", "--token").unwrap());
    }

    #[test]
    fn an_empty_or_missing_token_file_is_an_error_naming_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();

        let empty_err = Token::from_file(&empty).unwrap_err();
        let missing_err = Token::from_file(&dir.path().join("missing")).unwrap_err();

        assert!(empty_err.starts_with("--token-file ") && empty_err.ends_with("the token is empty"), "{empty_err}");
        assert!(missing_err.starts_with("--token-file ") && missing_err.contains("cannot read"), "{missing_err}");
    }

    #[test]
    fn a_token_with_a_space_inside_is_refused_without_being_quoted() {
        let err = Token::new("two words", "--token").unwrap_err();

        assert!(err.starts_with("--token: ") && !err.contains("words"), "{err}");
    }
}
