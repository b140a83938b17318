//! HTTP header maps as Envoy keeps them, and the proxy-wasm serialization of maps.
//!
//! Names are lower-cased on the way in (Envoy's `LowerCaseString`); values are bytes and
//! need not be UTF-8. Pseudo-headers (`:method`, `:path`, `:status`, ...) stay in front
//! of regular headers. A name may occur more than once; `get` returns the first value,
//! as Envoy's `proxy_get_header_map_value` does.

use std::fmt;

/// An ordered multimap of header names to values.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Headers {
    entries: Vec<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|(name, value)| {
                (String::from_utf8_lossy(name).into_owned(), String::from_utf8_lossy(value).into_owned())
            }))
            .finish()
    }
}

impl Headers {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// A map from pairs, in order (names are lower-cased).
    pub fn from_pairs<N: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: impl IntoIterator<Item = (N, V)>) -> Self {
        let mut headers = Self::new();
        for (name, value) in pairs {
            headers.add(name.as_ref(), value.as_ref());
        }
        headers
    }

    /// Number of entries (a repeated name counts once per value).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the map has no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The first value of `name` (case-insensitive).
    pub fn get(&self, name: impl AsRef<[u8]>) -> Option<&[u8]> {
        let name = name.as_ref();
        self.entries.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_slice())
    }

    /// The first value of `name` as text, `None` if absent or not UTF-8.
    pub fn get_str(&self, name: impl AsRef<[u8]>) -> Option<&str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Every value of `name`, in order.
    pub fn get_all(&self, name: impl AsRef<[u8]>) -> Vec<&[u8]> {
        let name = name.as_ref();
        self.entries.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_slice()).collect()
    }

    /// Whether `name` is present.
    pub fn contains(&self, name: impl AsRef<[u8]>) -> bool {
        self.get(name).is_some()
    }

    /// All entries, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + Clone {
        self.entries.iter().map(|(n, v)| (n.as_slice(), v.as_slice()))
    }

    /// Appends an entry (Envoy's `addCopy`); a pseudo-header goes after the other
    /// pseudo-headers but before regular headers.
    pub fn add(&mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        let name = name.as_ref().to_ascii_lowercase();
        let value = value.as_ref().to_vec();
        if name.first() == Some(&b':') {
            let at = self.entries.iter().position(|(n, _)| n.first() != Some(&b':')).unwrap_or(self.entries.len());
            self.entries.insert(at, (name, value));
        } else {
            self.entries.push((name, value));
        }
    }

    /// Replaces the first value of `name`, or adds it (Envoy's `setCopy`: later
    /// duplicates are left in place).
    pub fn replace(&mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        let name = name.as_ref();
        match self.entries.iter_mut().find(|(n, _)| n.eq_ignore_ascii_case(name)) {
            Some(entry) => entry.1 = value.as_ref().to_vec(),
            None => self.add(name, value),
        }
    }

    /// Removes every value of `name`.
    pub fn remove(&mut self, name: impl AsRef<[u8]>) {
        let name = name.as_ref();
        self.entries.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
    }

    /// Total size of names and values in bytes (Envoy's `byteSize()`, which
    /// `proxy_get_header_map_size` reports).
    pub fn byte_size(&self) -> usize {
        self.entries.iter().map(|(n, v)| n.len() + v.len()).sum()
    }

    /// Every entry as (name, value) strings, lossily decoded: convenient in assertions.
    pub fn to_string_pairs(&self) -> Vec<(String, String)> {
        self.entries
            .iter()
            .map(|(n, v)| (String::from_utf8_lossy(n).into_owned(), String::from_utf8_lossy(v).into_owned()))
            .collect()
    }
}

impl<N: AsRef<[u8]>, V: AsRef<[u8]>> FromIterator<(N, V)> for Headers {
    fn from_iter<T: IntoIterator<Item = (N, V)>>(iter: T) -> Self {
        Self::from_pairs(iter)
    }
}

/// The largest serialized map the host accepts from a guest (proxy-wasm-cpp-host's
/// `PROXY_WASM_HOST_PAIRS_MAX_BYTES`).
const MAX_PAIRS_BYTES: usize = 1024 * 1024;

/// The most pairs the host accepts from a guest (`PROXY_WASM_HOST_PAIRS_MAX_COUNT`).
const MAX_PAIRS_COUNT: usize = 1024;

/// Serializes pairs as the proxy-wasm ABI does: a u32 count, the (name, value) lengths as
/// u32 pairs, then each name and value followed by a NUL byte, all little-endian. An
/// empty map serializes to no bytes at all.
pub(crate) fn serialize<'a>(pairs: impl Iterator<Item = (&'a [u8], &'a [u8])> + Clone) -> Vec<u8> {
    let count = pairs.clone().count();
    if count == 0 {
        return Vec::new();
    }
    let data: usize = pairs.clone().map(|(n, v)| n.len() + v.len() + 2).sum();
    let mut out = Vec::with_capacity(4 + count * 8 + data);
    out.extend_from_slice(&u32_le(count));
    for (name, value) in pairs.clone() {
        out.extend_from_slice(&u32_le(name.len()));
        out.extend_from_slice(&u32_le(value.len()));
    }
    for (name, value) in pairs {
        out.extend_from_slice(name);
        out.push(0);
        out.extend_from_slice(value);
        out.push(0);
    }
    out
}

fn u32_le(n: usize) -> [u8; 4] {
    u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes()
}

/// Parses a serialized map. Like proxy-wasm-cpp-host's `PairsUtil::toPairs`, anything
/// malformed (truncated, missing NUL terminators, trailing bytes, over the size or count
/// limits) yields an empty map rather than an error.
pub(crate) fn deserialize(bytes: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    parse_pairs(bytes).unwrap_or_default()
}

fn parse_pairs(bytes: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    if bytes.len() > MAX_PAIRS_BYTES {
        return None;
    }
    let mut cursor = Cursor { bytes, at: 0 };
    let count = usize::try_from(cursor.u32()?).ok()?;
    if count > MAX_PAIRS_COUNT {
        return None;
    }
    let mut sizes = Vec::with_capacity(count);
    for _ in 0..count {
        let name = usize::try_from(cursor.u32()?).ok()?;
        let value = usize::try_from(cursor.u32()?).ok()?;
        sizes.push((name, value));
    }
    let mut pairs = Vec::with_capacity(count);
    for (name_len, value_len) in sizes {
        let name = cursor.terminated(name_len)?;
        let value = cursor.terminated(value_len)?;
        pairs.push((name.to_vec(), value.to_vec()));
    }
    (cursor.at == bytes.len()).then_some(pairs)
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let slice = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(slice)
    }

    fn u32(&mut self) -> Option<u32> {
        let raw: [u8; 4] = self.take(4)?.try_into().ok()?;
        Some(u32::from_le_bytes(raw))
    }

    fn terminated(&mut self, n: usize) -> Option<&'a [u8]> {
        let data = self.take(n)?;
        (self.take(1)? == [0]).then_some(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_example_round_trips() {
        let pairs: Vec<(&[u8], &[u8])> = vec![(b"a", b"1"), (b"b", b"22")];

        let bytes = serialize(pairs.iter().copied());

        assert_eq!(
            bytes,
            [2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, b'a', 0, b'1', 0, b'b', 0, b'2', b'2', 0]
        );
        assert_eq!(deserialize(&bytes), vec![(b"a".to_vec(), b"1".to_vec()), (b"b".to_vec(), b"22".to_vec())]);
    }

    #[test]
    fn malformed_maps_read_as_empty() {
        let good = serialize([(b"k".as_slice(), b"v".as_slice())].into_iter());

        for bad in [&good[..good.len() - 1], &[good.as_slice(), &[0]].concat(), &[1, 0, 0, 0][..], &[0xff; 3][..]] {
            assert!(deserialize(bad).is_empty(), "{bad:?}");
        }
        let mut no_nul = good.clone();
        let last = no_nul.len() - 1;
        no_nul[last] = b'x';
        assert!(deserialize(&no_nul).is_empty());
    }

    #[test]
    fn names_are_lower_cased_and_values_kept_as_bytes() {
        let mut headers = Headers::new();

        headers.add("X-Key", [0xff, 0x00, b'a']);

        assert_eq!(headers.get("x-key"), Some(&[0xff, 0x00, b'a'][..]));
        assert_eq!(headers.iter().next().map(|(n, _)| n), Some(&b"x-key"[..]));
    }

    #[test]
    fn pseudo_headers_stay_in_front() {
        let mut headers = Headers::from_pairs([(":method", "GET"), ("a", "1")]);

        headers.add(":path", "/");

        let names: Vec<_> = headers.iter().map(|(n, _)| n.to_vec()).collect();
        assert_eq!(names, vec![b":method".to_vec(), b":path".to_vec(), b"a".to_vec()]);
    }

    #[test]
    fn replace_changes_only_the_first_value() {
        let mut headers = Headers::from_pairs([("a", "1"), ("a", "2")]);

        headers.replace("a", "3");

        assert_eq!(headers.get_all("a"), vec![&b"3"[..], &b"2"[..]]);
    }
}
