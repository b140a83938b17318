//! How a Redis URL is shown: [`RedisUrl`], whose printed forms hide its credentials.

/// A Redis URL as configured, whose `Display` and `Debug` forms hide its credentials:
/// `redis://user:***@host:port/db`, `redis://***@host:port/db` when there is only a
/// password, and `***` for the value of a `pass` or `password` query parameter
/// (`redis+unix:///run/redis.sock?pass=...`). Every log line, metric, error message and
/// `Debug` print names a node by this form; only the connection itself reads
/// [`RedisUrl::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(String);

impl RedisUrl {
    /// The URL as given (it is parsed, and refused with a redacted message, when the
    /// store is built).
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The URL with its credentials, to connect with. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with every credential replaced by `***`.
    pub fn redacted(&self) -> String {
        let url = self.0.as_str();
        let (scheme, rest) = match url.find("://") {
            Some(i) => url.split_at(i + 3),
            None => ("", url),
        };
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(authority_end);
        let authority = match authority.rfind('@') {
            Some(at) => {
                let (userinfo, host) = authority.split_at(at);
                match userinfo.split_once(':') {
                    Some((user, _)) if !user.is_empty() => format!("{user}:***{host}"),
                    // Only a password, or a lone word some clients read as one.
                    _ => format!("***{host}"),
                }
            }
            None => authority.to_owned(),
        };
        let (path, fragment) = match path.find('#') {
            Some(i) => path.split_at(i),
            None => (path, ""),
        };
        let path = match path.split_once('?') {
            Some((before, query)) => {
                let params: Vec<String> = query
                    .split('&')
                    .map(|param| match param.split_once('=') {
                        Some((name, _)) if name.to_ascii_lowercase().contains("pass") => format!("{name}=***"),
                        _ => param.to_owned(),
                    })
                    .collect();
                format!("{before}?{}", params.join("&"))
            }
            None => path.to_owned(),
        };
        format!("{scheme}{authority}{path}{fragment}")
    }
}

impl std::fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RedisUrl({:?})", self.redacted())
    }
}

impl From<&str> for RedisUrl {
    fn from(url: &str) -> Self {
        Self::new(url)
    }
}

impl From<String> for RedisUrl {
    fn from(url: String) -> Self {
        Self::new(url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redis_url_is_shown_without_its_credentials() {
        for (given, shown) in [
            ("redis://:hunter2@127.0.0.1:1/0", "redis://***@127.0.0.1:1/0"),
            ("redis://sluice:hunter2@10.0.0.5:6379/2", "redis://sluice:***@10.0.0.5:6379/2"),
            ("rediss://hunter2@cache.internal", "rediss://***@cache.internal"),
            ("redis+unix:///run/redis.sock?db=1&pass=hunter2", "redis+unix:///run/redis.sock?db=1&pass=***"),
            ("redis://u:p@ss:hunter2@h:1?Password=hunter2#x", "redis://u:***@h:1?Password=***#x"),
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
        ] {
            let url = RedisUrl::new(given);

            assert_eq!(url.to_string(), shown, "{given}");
            assert!(!format!("{url:?}").contains("hunter2"), "{url:?}");
            assert_eq!(url.expose(), given);
        }
    }
}
