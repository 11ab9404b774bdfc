//! LPM keys: the kernel's `struct bpf_lpm_trie_key_u8` (a native-endian
//! `u32 prefixlen` followed by `data_size` bytes, most significant bit
//! first) and the bit helpers both tries share.

use crate::core::contract::{MapInfo, MapType};
use crate::core::error::{Error, Result, check_len};
use crate::core::family::SizeRule;

/// Bytes before the data in a byte-contract key (`prefixlen`).
pub const KEY_HEADER: usize = 4;
/// Smallest data size (the kernel's `LPM_DATA_SIZE_MIN`).
pub const DATA_SIZE_MIN: usize = 1;
/// Largest data size (the kernel's `LPM_DATA_SIZE_MAX`).
pub const DATA_SIZE_MAX: usize = 256;
/// Largest value size accepted.
pub const VALUE_SIZE_MAX: usize = 1 << 20;
/// Key sizes of both LPM tries: the prefix length and 1 to 256 data bytes.
pub const KEY_SIZE: SizeRule = SizeRule::between(
    (KEY_HEADER + DATA_SIZE_MIN) as u32,
    (KEY_HEADER + DATA_SIZE_MAX) as u32,
);
/// Value sizes of both LPM tries.
pub const VALUE_SIZE: SizeRule = SizeRule::between(1, VALUE_SIZE_MAX as u32);

/// A decoded key: prefix length and data bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRef<'a> {
    /// Number of significant leading bits of `data`.
    pub prefixlen: u32,
    /// Address bytes, most significant first.
    pub data: &'a [u8],
}

impl<'a> KeyRef<'a> {
    /// Decodes a byte-contract key for a trie of `data_size`-byte data,
    /// checking its size and prefix length (`EINVAL` otherwise).
    pub fn parse(key: &'a [u8], data_size: usize) -> Result<Self> {
        check_len("key", key.len(), KEY_HEADER + data_size)?;
        let prefixlen = u32::from_ne_bytes(key[..KEY_HEADER].try_into().expect("4 bytes"));
        if prefixlen as usize > 8 * data_size {
            return Err(Error::invalid(format!(
                "prefixlen {prefixlen} exceeds {} bits of key data",
                8 * data_size
            )));
        }
        Ok(KeyRef {
            prefixlen,
            data: &key[KEY_HEADER..],
        })
    }
}

/// Encodes `prefixlen` and `data` as a byte-contract key.
pub fn encode_key(prefixlen: u32, data: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(KEY_HEADER + data.len());
    key.extend_from_slice(&prefixlen.to_ne_bytes());
    key.extend_from_slice(data);
    key
}

/// Writes `prefixlen` and `data` into a byte-contract key buffer.
pub fn write_key(out: &mut [u8], prefixlen: u32, data: &[u8]) {
    out[..KEY_HEADER].copy_from_slice(&prefixlen.to_ne_bytes());
    out[KEY_HEADER..].copy_from_slice(data);
}

/// Bit `i` of `data`, most significant bit of byte 0 first.
#[inline]
pub fn bit(data: &[u8], i: usize) -> u8 {
    (data[i / 8] >> (7 - i % 8)) & 1
}

/// Clears every bit from `prefixlen` on (the host bits).
pub fn mask_host_bits(data: &mut [u8], prefixlen: u32) {
    let len = prefixlen as usize;
    let full = len / 8;
    if full < data.len() {
        let keep = (len % 8) as u32;
        data[full] &= (0xffu16 << (8 - keep)) as u8;
        data[full + 1..].fill(0);
    }
}

/// Number of leading bits `a` and `b` share, at most `limit`.
pub fn common_prefix_len(a: &[u8], b: &[u8], limit: u32) -> u32 {
    let mut n = 0u32;
    for (&x, &y) in a.iter().zip(b) {
        let diff = x ^ y;
        if diff != 0 {
            n += diff.leading_zeros();
            return n.min(limit);
        }
        n += 8;
        if n >= limit {
            return limit;
        }
    }
    n.min(limit)
}

/// Whether the prefix `data/prefixlen` contains the address `addr`.
pub fn prefix_contains(data: &[u8], prefixlen: u32, addr: &[u8]) -> bool {
    common_prefix_len(data, addr, prefixlen) == prefixlen
}

/// The info of an LPM trie (either implementation) of `data_size`-byte
/// prefixes.
pub(super) fn info(
    map_type: MapType,
    data_size: usize,
    value_size: usize,
    max_entries: u32,
    map_flags: u32,
) -> MapInfo {
    MapInfo {
        map_type,
        key_size: (KEY_HEADER + data_size) as u32,
        value_size: value_size as u32,
        max_entries,
        map_flags,
        map_extra: 0,
    }
}

/// Checks creation sizes as the kernel does: key is `4 + 1..=256` bytes,
/// value `1..=VALUE_SIZE_MAX`, `max_entries > 0`. Returns the data size.
pub fn check_sizes(key_size: usize, value_size: usize, max_entries: u32) -> Result<usize> {
    if !u32::try_from(key_size).is_ok_and(|n| KEY_SIZE.allows(n)) {
        return Err(Error::invalid(format!(
            "LPM key_size {key_size}: must be 4 (prefixlen) + 1..=256 data bytes"
        )));
    }
    if !u32::try_from(value_size).is_ok_and(|n| VALUE_SIZE.allows(n)) {
        return Err(Error::invalid(format!(
            "LPM value_size {value_size} out of range"
        )));
    }
    if max_entries == 0 {
        return Err(Error::invalid("max_entries must be non-zero"));
    }
    Ok(key_size - KEY_HEADER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_checks_size_and_prefixlen() {
        let key = encode_key(24, &[10, 1, 2, 0]);
        assert_eq!(
            KeyRef::parse(&key, 4).unwrap(),
            KeyRef {
                prefixlen: 24,
                data: &[10, 1, 2, 0]
            }
        );
        assert_eq!(KeyRef::parse(&key, 5).unwrap_err().errno(), 22);
        assert_eq!(
            KeyRef::parse(&encode_key(33, &[0; 4]), 4)
                .unwrap_err()
                .errno(),
            22
        );
        assert!(KeyRef::parse(&encode_key(32, &[0; 4]), 4).is_ok());
    }

    #[test]
    fn bit_helpers() {
        let mut d = [0b1010_1111u8, 0xff];
        assert_eq!((bit(&d, 0), bit(&d, 1), bit(&d, 8)), (1, 0, 1));
        mask_host_bits(&mut d, 3);
        assert_eq!(d, [0b1010_0000, 0]);
        let mut e = [0xffu8; 2];
        mask_host_bits(&mut e, 16);
        assert_eq!(e, [0xff, 0xff]);
        mask_host_bits(&mut e, 0);
        assert_eq!(e, [0, 0]);
        assert_eq!(common_prefix_len(&[0xf0, 0], &[0xf8, 0], 32), 4);
        assert_eq!(common_prefix_len(&[1, 2], &[1, 2], 16), 16);
        assert_eq!(common_prefix_len(&[1, 2], &[1, 3], 12), 12);
        assert!(prefix_contains(&[10, 0, 0, 0], 8, &[10, 9, 9, 9]));
        assert!(!prefix_contains(&[10, 0, 0, 0], 8, &[11, 0, 0, 0]));
        assert!(prefix_contains(&[0; 4], 0, &[1, 2, 3, 4]));
    }
}
