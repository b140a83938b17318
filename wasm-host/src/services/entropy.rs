//! Randomness for WASI `random_get`: a seeded stream by default, so that a test gets the
//! same bytes on every run, or the operating system's for `serve`.

use std::fs::File;
use std::io::Read;
use std::sync::{Mutex, PoisonError};

/// Randomness for WASI `random_get`.
pub(crate) enum Entropy {
    /// A deterministic SplitMix64 stream: tests get the same bytes on every run.
    Seeded(Mutex<u64>),
    /// The operating system's (`/dev/urandom`), falling back to a seeded stream.
    Os(Mutex<Option<File>>, Mutex<u64>),
}

impl Entropy {
    /// The operating system's randomness, with a seed from the process for the fallback.
    pub(crate) fn os() -> Self {
        let seed = {
            use std::hash::{BuildHasher, Hasher};
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u64(std::process::id().into());
            hasher.finish()
        };
        Self::Os(Mutex::new(File::open("/dev/urandom").ok()), Mutex::new(seed))
    }

    /// Fills `buf`; never fails (the fallback stream takes over if `/dev/urandom` does).
    pub(crate) fn fill(&self, buf: &mut [u8]) {
        let state = match self {
            Self::Seeded(state) => state,
            Self::Os(file, state) => {
                let mut file = file.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(f) = file.as_mut()
                    && f.read_exact(buf).is_ok()
                {
                    return;
                }
                *file = None;
                state
            }
        };
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        for chunk in buf.chunks_mut(8) {
            *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = *state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            let bytes = z.to_le_bytes();
            chunk.copy_from_slice(bytes.get(..chunk.len()).unwrap_or_default());
        }
    }
}
