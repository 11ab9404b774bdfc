//! What a string map is created for, checked once for every string map:
//! its longest key, its value size and its capacity.

use super::qptrie::MAX_KEY_SIZE;
use crate::core::error::{Error, Result};

/// A string map's creation sizes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Longest key, 1 to [`MAX_KEY_SIZE`] bytes.
    pub max_key_size: usize,
    /// Bytes of every value, 1 to 65535.
    pub value_size: usize,
    /// Most keys held.
    pub max_entries: u32,
}

impl Limits {
    /// `EINVAL` for sizes no string map takes.
    pub fn new(max_key_size: usize, value_size: usize, max_entries: u32) -> Result<Self> {
        if !(1..=MAX_KEY_SIZE).contains(&max_key_size) {
            return Err(Error::invalid(format!(
                "key_size {max_key_size}: a string map's keys are 1 to {MAX_KEY_SIZE} bytes"
            )));
        }
        if value_size == 0 || value_size > u16::MAX as usize {
            return Err(Error::invalid(format!(
                "value_size {value_size}: 1 to 65535 bytes"
            )));
        }
        if max_entries == 0 {
            return Err(Error::invalid("max_entries 0"));
        }
        Ok(Limits {
            max_key_size,
            value_size,
            max_entries,
        })
    }

    /// `EINVAL` for a key that is empty or longer than the longest.
    pub fn check_key(&self, key: &[u8]) -> Result<()> {
        if key.is_empty() || key.len() > self.max_key_size {
            return Err(Error::invalid(format!(
                "key of {} bytes: this map takes 1 to {} bytes",
                key.len(),
                self.max_key_size
            )));
        }
        Ok(())
    }
}
