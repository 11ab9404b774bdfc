//! A brute-force LPM oracle for tests: a list of prefixes, longest match by
//! scanning every one.

use super::key::{mask_host_bits, prefix_contains};

/// Prefixes and values; the answer to every query by exhaustive scan.
#[derive(Debug, Default, Clone)]
pub struct BruteForce {
    /// (masked data, prefixlen, value)
    pub entries: Vec<(Vec<u8>, u32, Vec<u8>)>,
}

impl BruteForce {
    /// Inserts or replaces `data/prefixlen`; returns whether it was new.
    pub fn insert(&mut self, data: &[u8], prefixlen: u32, value: &[u8]) -> bool {
        let mut d = data.to_vec();
        mask_host_bits(&mut d, prefixlen);
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.0 == d && e.1 == prefixlen)
        {
            e.2 = value.to_vec();
            return false;
        }
        self.entries.push((d, prefixlen, value.to_vec()));
        true
    }

    /// Removes `data/prefixlen`; returns whether it was present.
    pub fn remove(&mut self, data: &[u8], prefixlen: u32) -> bool {
        let mut d = data.to_vec();
        mask_host_bits(&mut d, prefixlen);
        let before = self.entries.len();
        self.entries.retain(|e| !(e.0 == d && e.1 == prefixlen));
        before != self.entries.len()
    }

    /// The longest stored prefix of length at most `limit` containing `addr`.
    pub fn longest_match(&self, addr: &[u8], limit: u32) -> Option<&(Vec<u8>, u32, Vec<u8>)> {
        self.entries
            .iter()
            .filter(|e| e.1 <= limit && prefix_contains(&e.0, e.1, addr))
            .max_by_key(|e| e.1)
    }

    /// The exact prefix, if stored.
    pub fn exact(&self, data: &[u8], prefixlen: u32) -> Option<&[u8]> {
        let mut d = data.to_vec();
        mask_host_bits(&mut d, prefixlen);
        self.entries
            .iter()
            .find(|e| e.0 == d && e.1 == prefixlen)
            .map(|e| &e.2[..])
    }
}
