//! Byte-slice compare and copy for the short keys and values maps move
//! on every operation: for up to 16 bytes, two overlapping word loads
//! instead of a `memcmp`/`memcpy` call (whose call and size dispatch
//! cost more than the bytes at these sizes).

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
        _ => dst.copy_from_slice(src),
    }
}

#[inline(always)]
fn word(s: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(s[at..at + 8].try_into().expect("8 bytes"))
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
        for n in 0..40usize {
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
        for n in 0..40usize {
            let src: Vec<u8> = (1..=n as u8).collect();
            let mut dst = vec![0u8; n];
            copy(&mut dst, &src);
            assert_eq!(dst, src, "n={n}");
        }
    }
}
