//! Byte-slice compare and copy for the short keys and values maps move
//! on every operation: for up to 32 bytes, two overlapping loads (of 16,
//! 8, 4 bytes, or three single bytes) instead of a `memcmp`/`memcpy`
//! call (whose call and size dispatch cost more than the bytes at these
//! sizes).

/// `a == b`.
#[inline(always)]
pub fn equal(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let n = a.len();
    match n {
        // Two overlapping loads cover 8..=16 and 4..=8 bytes.
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        4..=7 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        // First, middle and last byte cover 1..=3.
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        0 => true,
        17..=32 => wide(a, 0) == wide(b, 0) && wide(a, n - 16) == wide(b, n - 16),
        _ => a == b,
    }
}

/// `dst.copy_from_slice(src)` (equal lengths).
#[inline(always)]
pub fn copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy between slices of different lengths"
    );
    let n = src.len();
    match n {
        8..=16 => {
            let (head, tail) = (word(src, 0), word(src, n - 8));
            dst[..8].copy_from_slice(&head.to_ne_bytes());
            dst[n - 8..].copy_from_slice(&tail.to_ne_bytes());
        }
        4..=7 => {
            let (head, tail) = (half(src, 0), half(src, n - 4));
            dst[..4].copy_from_slice(&head.to_ne_bytes());
            dst[n - 4..].copy_from_slice(&tail.to_ne_bytes());
        }
        1..=3 => {
            dst[0] = src[0];
            dst[n / 2] = src[n / 2];
            dst[n - 1] = src[n - 1];
        }
        0 => {}
        17..=32 => {
            let (head, tail) = (wide(src, 0), wide(src, n - 16));
            dst[..16].copy_from_slice(&head.to_ne_bytes());
            dst[n - 16..].copy_from_slice(&tail.to_ne_bytes());
        }
        _ => dst.copy_from_slice(src),
    }
}

#[inline(always)]
fn word(s: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(s[at..at + 8].try_into().expect("8 bytes"))
}

/// `rest` past `prefix`, if it starts with it ([`equal`]: no `memcmp`
/// call for short prefixes).
#[inline(always)]
pub fn strip_prefix<'k>(rest: &'k [u8], prefix: &[u8]) -> Option<&'k [u8]> {
    let (head, after) = rest.split_at_checked(prefix.len())?;
    equal(head, prefix).then_some(after)
}

#[inline(always)]
fn wide(s: &[u8], at: usize) -> u128 {
    u128::from_ne_bytes(s[at..at + 16].try_into().expect("16 bytes"))
}

#[inline(always)]
fn half(s: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(s[at..at + 4].try_into().expect("4 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_sees_every_differing_byte() {
        for n in 0..70usize {
            let a: Vec<u8> = (0..n as u8).collect();
            assert!(equal(&a, &a.clone()));
            for i in 0..n {
                let mut b = a.clone();
                b[i] ^= 0x40;
                assert!(!equal(&a, &b), "n={n} i={i}");
            }
        }
        assert!(!equal(&[1, 2], &[1, 2, 3]));
    }

    #[test]
    fn copy_copies_every_byte() {
        for n in 0..70usize {
            let src: Vec<u8> = (1..=n as u8).collect();
            let mut dst = vec![0u8; n];
            copy(&mut dst, &src);
            assert_eq!(dst, src, "n={n}");
        }
    }
}
