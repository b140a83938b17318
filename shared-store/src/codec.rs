//! The binary form of a key's state in shared data: compact, versioned, checked.
//!
//! ```text
//! [format: u8 = 1][kind: u8][owner: u64][params: 4 × u64][payload][checksum: u32]
//! ```
//!
//! All integers are little-endian. `owner` identifies which client holds the slot (see
//! `key`); `params` are the limit's numbers when the state was written, so that a
//! reconfigured limit can convert the state (clamp it to a new burst) instead of
//! starting over; the checksum (FNV-1a over everything before it) rejects bytes written
//! by something else. Bytes that do not decode are never guessed at: the caller gets a
//! [`DecodeError`] and replaces them with the limit's most conservative state.

use crate::algorithm::Algorithm;
use crate::limit::{Holding, Limit, LogEntry, MAX_HOLDERS, MAX_LOG_ENTRIES, Rate, State};
use crate::time::Nanos;

/// The format version written by this code.
pub const FORMAT: u8 = 1;

const HEADER: usize = 2 + 8 + 4 * 8;
const CHECKSUM: usize = 4;

/// The longest record that is not a sliding log (a window state).
const INLINE: usize = HEADER + 3 * 8 + CHECKSUM;

/// What a key holds: whose state it is, under which limit, and the state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Fingerprint of the client that holds this slot.
    pub owner: u64,
    /// The limit the state was written under.
    pub limit: Limit,
    /// The algorithm's state.
    pub state: State,
}

/// Why stored bytes were not accepted as a [`Record`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter than any record, or a length that does not match the payload.
    Length,
    /// Written by another format version.
    Format(u8),
    /// The checksum does not match: the bytes were damaged or written by something else.
    Checksum,
    /// An unknown algorithm tag, or numbers no limit could have.
    Params,
    /// A payload that is not a valid state for its algorithm.
    Payload,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Length => f.write_str("state has the wrong length"),
            Self::Format(v) => write!(f, "state has format version {v}, expected {FORMAT}"),
            Self::Checksum => f.write_str("state checksum does not match"),
            Self::Params => f.write_str("state names no valid limit"),
            Self::Payload => f.write_str("state payload is invalid"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// FNV-1a over 64-bit little-endian words (the tail zero-padded), folded to 32 bits:
/// one multiply per 8 bytes, since this runs on every read and write of a bucket.
fn checksum(bytes: &[u8]) -> u32 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64 ^ bytes.len() as u64;
    let (words, tail) = bytes.as_chunks::<8>();
    for word in words {
        hash = (hash ^ u64::from_le_bytes(*word)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    if !tail.is_empty() {
        let mut last = [0u8; 8];
        for (slot, byte) in last.iter_mut().zip(tail) {
            *slot = *byte;
        }
        hash = (hash ^ u64::from_le_bytes(last)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash ^ (hash >> 32)) as u32
}

/// The byte that names an algorithm in a record. Persisted in shared data: a byte never
/// changes meaning, and a new algorithm takes a new one.
const fn kind_byte(algorithm: Algorithm) -> u8 {
    match algorithm {
        Algorithm::TokenBucket => 1,
        Algorithm::FixedWindow => 2,
        Algorithm::SlidingWindow => 3,
        Algorithm::SlidingLog => 4,
        Algorithm::LeakyBucket => 5,
        Algorithm::Concurrency => 6,
    }
}

fn kind_and_params(limit: &Limit) -> (u8, [u64; 4]) {
    let params = match *limit {
        Limit::TokenBucket { rate, burst } => [rate.amount(), rate.per().0, burst, 0],
        Limit::FixedWindow { limit, window }
        | Limit::SlidingWindow { limit, window }
        | Limit::SlidingLog { limit, window } => [limit, window.0, 0, 0],
        Limit::LeakyBucket { rate, max_queue, max_wait } => [rate.amount(), rate.per().0, max_queue, max_wait.0],
        Limit::Concurrency { limit } => [limit, 0, 0, 0],
    };
    (kind_byte(Algorithm::of(limit)), params)
}

fn limit_from(kind: u8, [a, b, c, d]: [u64; 4]) -> Option<Limit> {
    let algorithm = Algorithm::ALL.into_iter().find(|a| kind_byte(*a) == kind)?;
    match algorithm {
        Algorithm::TokenBucket => Limit::token_bucket(Rate::new(a, Nanos(b))?, c).ok(),
        Algorithm::FixedWindow => Limit::fixed_window(a, Nanos(b)).ok(),
        Algorithm::SlidingWindow => Limit::sliding_window(a, Nanos(b)).ok(),
        Algorithm::SlidingLog => Limit::sliding_log(a, Nanos(b)).ok(),
        Algorithm::LeakyBucket => Limit::leaky_bucket(Rate::new(a, Nanos(b))?, c, Nanos(d)).ok(),
        Algorithm::Concurrency if (b, c, d) == (0, 0, 0) => Limit::concurrency(a).ok(),
        Algorithm::Concurrency => None,
    }
}

impl Record {
    /// The bytes to store.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_with(<[u8]>::to_vec)
    }

    /// Encodes the record and hands the bytes to `use_bytes`: every state but a sliding
    /// log is encoded on the stack, so writing a bucket (on every admitted request)
    /// neither allocates nor copies the bytes again.
    pub fn encode_with<R>(&self, use_bytes: impl FnOnce(&[u8]) -> R) -> R {
        let payload = match &self.state {
            State::Gcra { .. } => 16,
            State::Window { .. } => 24,
            State::Log { entries } => 2 + 16 * entries.len().min(usize::from(u16::MAX)),
            State::Holders { entries } => 2 + 24 * entries.len().min(usize::from(u16::MAX)),
        };
        let len = HEADER + payload + CHECKSUM;
        let mut inline = [0u8; INLINE];
        let mut heap = Vec::new();
        let out = match inline.get_mut(..len) {
            Some(out) => out,
            None => {
                heap.resize(len, 0);
                heap.as_mut_slice()
            }
        };
        self.fill(out);
        use_bytes(out)
    }

    /// Writes the record into `out`, which is exactly its encoded length.
    fn fill(&self, out: &mut [u8]) {
        let (kind, params) = kind_and_params(&self.limit);
        let mut writer = Writer { out, at: 0 };
        writer.put(&[FORMAT, kind]);
        writer.put(&self.owner.to_le_bytes());
        for param in params {
            writer.put(&param.to_le_bytes());
        }
        match &self.state {
            State::Gcra { tat } => writer.put(&tat.to_le_bytes()),
            State::Window { index, count, previous } => {
                for value in [index, count, previous] {
                    writer.put(&value.to_le_bytes());
                }
            }
            State::Log { entries } => {
                let len = u16::try_from(entries.len()).unwrap_or(u16::MAX);
                writer.put(&len.to_le_bytes());
                for entry in entries.iter().take(usize::from(len)) {
                    writer.put(&entry.at.to_le_bytes());
                    writer.put(&entry.cost.to_le_bytes());
                }
            }
            State::Holders { entries } => {
                let len = u16::try_from(entries.len()).unwrap_or(u16::MAX);
                writer.put(&len.to_le_bytes());
                for entry in entries.iter().take(usize::from(len)) {
                    for value in [entry.holder, entry.count, entry.renewed_at] {
                        writer.put(&value.to_le_bytes());
                    }
                }
            }
        }
        let Writer { out, at: body } = writer;
        let sum = checksum(out.get(..body).unwrap_or_default());
        Writer { out, at: body }.put(&sum.to_le_bytes());
    }

    /// Parses stored bytes.
    ///
    /// # Errors
    /// A [`DecodeError`] saying why the bytes are not a record this code wrote.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        Self::decode_expecting(bytes, None)
    }

    /// Parses stored bytes that were most likely written under `expected`: when the
    /// stored numbers are exactly `expected`'s, it is used as is instead of being derived
    /// and validated again (the common case, on every request). The result is the same
    /// as [`Record::decode`]'s.
    ///
    /// # Errors
    /// As [`Record::decode`].
    pub fn decode_expecting(bytes: &[u8], expected: Option<&Limit>) -> Result<Self, DecodeError> {
        let mut reader = Reader(bytes);
        let format = reader.u8().ok_or(DecodeError::Length)?;
        if format != FORMAT {
            return Err(DecodeError::Format(format));
        }
        let body_len = bytes.len().checked_sub(CHECKSUM).ok_or(DecodeError::Length)?;
        let (body, sum) = bytes.split_at(body_len);
        if body.len() < HEADER {
            return Err(DecodeError::Length);
        }
        if sum != checksum(body).to_le_bytes() {
            return Err(DecodeError::Checksum);
        }
        let mut reader = Reader(body.get(1..).unwrap_or_default());
        let kind = reader.u8().ok_or(DecodeError::Length)?;
        let owner = reader.u64().ok_or(DecodeError::Length)?;
        let mut params = [0u64; 4];
        for param in &mut params {
            *param = reader.u64().ok_or(DecodeError::Length)?;
        }
        let limit = match expected {
            Some(limit) if kind_and_params(limit) == (kind, params) => *limit,
            _ => limit_from(kind, params).ok_or(DecodeError::Params)?,
        };
        let state = match limit {
            Limit::TokenBucket { .. } | Limit::LeakyBucket { .. } => {
                State::Gcra { tat: reader.u128().ok_or(DecodeError::Length)? }
            }
            Limit::FixedWindow { .. } | Limit::SlidingWindow { .. } => {
                let index = reader.u64().ok_or(DecodeError::Length)?;
                let count = reader.u64().ok_or(DecodeError::Length)?;
                let previous = reader.u64().ok_or(DecodeError::Length)?;
                State::Window { index, count, previous }
            }
            Limit::SlidingLog { .. } => {
                let len = reader.u16().ok_or(DecodeError::Length)?;
                if u64::from(len) > MAX_LOG_ENTRIES {
                    return Err(DecodeError::Payload);
                }
                let mut entries = Vec::with_capacity(usize::from(len));
                for _ in 0..len {
                    let at = reader.u64().ok_or(DecodeError::Length)?;
                    let cost = reader.u64().ok_or(DecodeError::Length)?;
                    if entries.last().is_some_and(|last: &LogEntry| last.at > at) {
                        return Err(DecodeError::Payload);
                    }
                    entries.push(LogEntry { at, cost });
                }
                State::Log { entries }
            }
            Limit::Concurrency { .. } => {
                let len = reader.u16().ok_or(DecodeError::Length)?;
                if usize::from(len) > MAX_HOLDERS {
                    return Err(DecodeError::Payload);
                }
                let mut entries = Vec::with_capacity(usize::from(len));
                for _ in 0..len {
                    let holder = reader.u64().ok_or(DecodeError::Length)?;
                    let count = reader.u64().ok_or(DecodeError::Length)?;
                    let renewed_at = reader.u64().ok_or(DecodeError::Length)?;
                    entries.push(Holding { holder, count, renewed_at });
                }
                State::Holders { entries }
            }
        };
        if !reader.0.is_empty() {
            return Err(DecodeError::Length);
        }
        Ok(Self { owner, limit, state })
    }
}

/// Fills a buffer sized in advance; a write past its end is dropped (the sizes above
/// make that impossible, and the checksum would reject such bytes anyway).
struct Writer<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        let end = self.at.saturating_add(bytes.len());
        if let Some(slot) = self.out.get_mut(self.at..end) {
            slot.copy_from_slice(bytes);
        }
        self.at = end;
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|[b]| b)
    }
    fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
    fn u128(&mut self) -> Option<u128> {
        self.take().map(u128::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_has_a_kind_byte_of_its_own_and_its_records_round_trip() {
        let mut bytes: Vec<u8> = Algorithm::ALL.iter().map(|a| kind_byte(*a)).collect();
        bytes.sort_unstable();
        bytes.dedup();
        assert_eq!(bytes.len(), Algorithm::ALL.len());
        for algorithm in Algorithm::ALL {
            let limit = algorithm.example();
            let record = Record { owner: 7, limit, state: limit.exhausted(Nanos::from_secs(9)) };
            assert_eq!(Record::decode(&record.encode()).as_ref(), Ok(&record), "{algorithm}");
        }
    }

    fn records() -> Vec<Record> {
        let rate = Rate::new(10, Nanos::from_secs(1)).unwrap();
        vec![
            Record {
                owner: 7,
                limit: Limit::token_bucket(rate, 5).unwrap(),
                state: State::Gcra { tat: u128::MAX - 3 },
            },
            Record {
                owner: 0,
                limit: Limit::fixed_window(3, Nanos::from_secs(60)).unwrap(),
                state: State::Window { index: 4, count: 2, previous: 0 },
            },
            Record {
                owner: u64::MAX,
                limit: Limit::sliding_window(3, Nanos(1)).unwrap(),
                state: State::Window { index: u64::MAX, count: 1, previous: 9 },
            },
            Record {
                owner: 1,
                limit: Limit::sliding_log(4, Nanos(100)).unwrap(),
                state: State::Log { entries: vec![LogEntry { at: 1, cost: 1 }, LogEntry { at: 5, cost: 3 }] },
            },
            Record {
                owner: 2,
                limit: Limit::leaky_bucket(rate, 8, Nanos::from_millis(500)).unwrap(),
                state: State::Gcra { tat: 12 },
            },
            Record {
                owner: 3,
                limit: Limit::concurrency(4).unwrap(),
                state: State::Holders {
                    entries: vec![
                        Holding { holder: 9, count: 2, renewed_at: 77 },
                        Holding { holder: u64::MAX, count: 1, renewed_at: 0 },
                    ],
                },
            },
        ]
    }

    #[test]
    fn every_record_survives_a_round_trip() {
        for record in records() {
            assert_eq!(Record::decode(&record.encode()), Ok(record));
        }
    }

    #[test]
    fn decoding_against_the_expected_limit_gives_the_same_record() {
        let other = Limit::fixed_window(1, Nanos(1)).unwrap();
        for record in records() {
            let bytes = record.encode();
            assert_eq!(Record::decode_expecting(&bytes, Some(&record.limit)), Ok(record.clone()));
            assert_eq!(Record::decode_expecting(&bytes, Some(&other)), Ok(record));
        }
    }

    #[test]
    fn every_truncation_of_a_record_is_rejected() {
        for record in records() {
            let bytes = record.encode();
            for len in 0..bytes.len() {
                assert!(Record::decode(&bytes[..len]).is_err(), "{record:?} truncated to {len}");
            }
        }
    }

    #[test]
    fn a_flipped_bit_anywhere_is_rejected() {
        for record in records() {
            let bytes = record.encode();
            for bit in 0..bytes.len() * 8 {
                let mut damaged = bytes.clone();
                damaged[bit / 8] ^= 1 << (bit % 8);
                assert!(Record::decode(&damaged).is_err(), "bit {bit} of {record:?}");
            }
        }
    }

    #[test]
    fn another_format_version_is_named_in_the_error() {
        let mut bytes = records()[0].encode();
        bytes[0] = 0;
        assert_eq!(Record::decode(&bytes), Err(DecodeError::Format(0)));
    }

    #[test]
    fn garbage_and_empty_values_are_rejected() {
        assert!(Record::decode(b"").is_err());
        assert!(Record::decode(b"\x01").is_err());
        assert!(Record::decode(&[0xff; 64]).is_err());
        assert!(Record::decode(&[1; 64]).is_err());
    }
}
