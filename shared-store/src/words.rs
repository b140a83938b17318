//! A fixed-width record codec: one tag byte, then `N` little-endian `u64` words.
//!
//! For small records kept in shared data beside the buckets (the filter's lease records
//! and its circuit breaker), where [`crate::codec`]'s versioned bucket format would be a
//! second job. The tag is the caller's: a format version, or which variant of a state the
//! words hold. Anything that is not exactly `1 + 8 × N` bytes does not decode, so a record
//! of another width (another format) is never read as this one.

/// The encoded size of a record of `words` words.
pub const fn width(words: usize) -> usize {
    1 + 8 * words
}

/// Encodes `tag` and `words` into `W` bytes, `W` being [`width`]`(N)` (checked when the
/// call is compiled).
pub fn encode<const N: usize, const W: usize>(tag: u8, words: &[u64; N]) -> [u8; W] {
    const { assert!(W == width(N), "W must be width(N)") };
    let mut out = [0u8; W];
    if let Some((first, rest)) = out.split_first_mut() {
        *first = tag;
        for (chunk, word) in rest.chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
    }
    out
}

/// The tag and the words of a record of `N` words; `None` for bytes of another width.
pub fn decode<const N: usize>(bytes: &[u8]) -> Option<(u8, [u64; N])> {
    let (&tag, rest) = bytes.split_first()?;
    if rest.len() != 8 * N {
        return None;
    }
    let mut words = [0u64; N];
    for (word, chunk) in words.iter_mut().zip(rest.chunks_exact(8)) {
        *word = u64::from_le_bytes(<[u8; 8]>::try_from(chunk).ok()?);
    }
    Some((tag, words))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_decodes_to_what_was_encoded() {
        let bytes: [u8; width(3)] = encode(7, &[1, u64::MAX, 0x0102_0304_0506_0708]);

        assert_eq!(decode::<3>(&bytes), Some((7, [1, u64::MAX, 0x0102_0304_0506_0708])));
    }

    #[test]
    fn words_are_little_endian_after_the_tag() {
        let bytes: [u8; width(1)] = encode(2, &[0x0102]);

        assert_eq!(bytes, [2, 0x02, 0x01, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn bytes_of_another_width_do_not_decode() {
        let bytes: [u8; width(2)] = encode(1, &[1, 2]);

        assert_eq!(decode::<3>(&bytes), None);
        assert_eq!(decode::<1>(&bytes), None);
        assert_eq!(decode::<2>(&bytes[..width(2) - 1]), None);
        assert_eq!(decode::<0>(&[]), None);
        assert_eq!(decode::<0>(&[9]), Some((9, [])));
    }
}
