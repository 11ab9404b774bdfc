//! Bob Jenkins' lookup3 hash exactly as `include/linux/jhash.h`.
//!
//! Words are read in native byte order (`__get_unaligned_cpu32`), so results
//! match the kernel on the same machine.

/// The kernel's `JHASH_INITVAL`.
pub const JHASH_INITVAL: u32 = 0xdead_beef;

#[inline(always)]
fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(4);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(6);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(8);
    *b = b.wrapping_add(*a);
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(16);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(19);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(4);
    *b = b.wrapping_add(*a);
}

#[inline(always)]
fn final_mix(mut a: u32, mut b: u32, mut c: u32) -> u32 {
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(14));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(11));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(25));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(16));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(4));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(14));
    c ^= b;
    c.wrapping_sub(b.rotate_left(24))
}

#[inline(always)]
fn word(bytes: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// `jhash(key, length, initval)`: hashes an arbitrary byte string.
#[inline]
pub fn jhash(key: &[u8], initval: u32) -> u32 {
    let init = JHASH_INITVAL
        .wrapping_add(key.len() as u32)
        .wrapping_add(initval);
    let (mut a, mut b, mut c) = (init, init, init);
    // The kernel mixes while more than 12 bytes remain.
    let full = if key.is_empty() {
        0
    } else {
        (key.len() - 1) / 12
    };
    for block in key.chunks_exact(12).take(full) {
        a = a.wrapping_add(word(block, 0));
        b = b.wrapping_add(word(block, 4));
        c = c.wrapping_add(word(block, 8));
        mix(&mut a, &mut b, &mut c);
    }
    let k = &key[12 * full..];
    if k.is_empty() {
        return c;
    }
    // The kernel's fall-through switch: byte i goes into word i/4 at bits
    // 8*(i%4). (A byte loop: copying the tail into a buffer costs a memcpy
    // call, which dominates for short keys.)
    let mut tail = [0u32; 3];
    for (i, &byte) in k.iter().enumerate() {
        tail[i / 4] |= (byte as u32) << (8 * (i % 4));
    }
    final_mix(
        a.wrapping_add(tail[0]),
        b.wrapping_add(tail[1]),
        c.wrapping_add(tail[2]),
    )
}

/// `jhash2(k, length, initval)`: hashes `length` 32-bit words.
#[inline]
pub fn jhash2(key: &[u32], initval: u32) -> u32 {
    jhash2_words(key.len(), |i| key[i], initval)
}

/// `jhash2` over a byte key whose length is a multiple of 4, read as native
/// words: what the kernel's `htab_map_hash()` does for such keys.
///
/// # Panics
/// If `key.len()` is not a multiple of 4.
#[inline]
pub fn jhash2_bytes(key: &[u8], initval: u32) -> u32 {
    assert!(
        key.len().is_multiple_of(4),
        "jhash2 needs whole 32-bit words"
    );
    let init = JHASH_INITVAL
        .wrapping_add(key.len() as u32)
        .wrapping_add(initval);
    let (mut a, mut b, mut c) = (init, init, init);
    let mut blocks = key.chunks_exact(12);
    // The kernel mixes while more than 3 words remain, so a key of exactly
    // 3k words keeps its last block for the final mix.
    let n_blocks = blocks.len();
    let full = if key.len().is_multiple_of(12) && n_blocks > 0 {
        n_blocks - 1
    } else {
        n_blocks
    };
    for block in blocks.by_ref().take(full) {
        a = a.wrapping_add(word(block, 0));
        b = b.wrapping_add(word(block, 4));
        c = c.wrapping_add(word(block, 8));
        mix(&mut a, &mut b, &mut c);
    }
    let tail = &key[12 * full..];
    match tail.len() {
        12 => final_mix(
            a.wrapping_add(word(tail, 0)),
            b.wrapping_add(word(tail, 4)),
            c.wrapping_add(word(tail, 8)),
        ),
        8 => final_mix(
            a.wrapping_add(word(tail, 0)),
            b.wrapping_add(word(tail, 4)),
            c,
        ),
        4 => final_mix(a.wrapping_add(word(tail, 0)), b, c),
        _ => c,
    }
}

/// `jhash2` over `length` words given by `k`.
#[inline(always)]
fn jhash2_words(length: usize, k: impl Fn(usize) -> u32, initval: u32) -> u32 {
    let init = JHASH_INITVAL
        .wrapping_add((length as u32) << 2)
        .wrapping_add(initval);
    let (mut a, mut b, mut c) = (init, init, init);
    let mut i = 0;
    let mut left = length;
    while left > 3 {
        a = a.wrapping_add(k(i));
        b = b.wrapping_add(k(i + 1));
        c = c.wrapping_add(k(i + 2));
        mix(&mut a, &mut b, &mut c);
        left -= 3;
        i += 3;
    }
    match left {
        3 => final_mix(
            a.wrapping_add(k(i)),
            b.wrapping_add(k(i + 1)),
            c.wrapping_add(k(i + 2)),
        ),
        2 => final_mix(a.wrapping_add(k(i)), b.wrapping_add(k(i + 1)), c),
        1 => final_mix(a.wrapping_add(k(i)), b, c),
        _ => c,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_test_vectors() {
        assert_eq!(jhash(b"", 0), 0xdeadbeef);
        assert_eq!(jhash(b"Four score and seven years ago", 0), 0x17770551);
        assert_eq!(jhash(b"Four score and seven years ago", 1), 0xcd628161);
        assert_eq!(jhash2(&[1], 0), 0x72a82a9b);
        assert_eq!(jhash2(&[1, 2], 0), 0x8b4c7979);
        assert_eq!(jhash2(&[1, 2, 3, 4], 0), 0x66491246);
        let bytes: Vec<u8> = (0u8..16).collect();
        assert_eq!(jhash(&bytes[..1], 0x12345678), 0xed59d193);
        assert_eq!(jhash(&bytes[..4], 0x12345678), 0x16d1d0c0);
        assert_eq!(jhash(&bytes[..13], 0x12345678), 0x7866d225);
    }

    #[test]
    fn jhash_matches_a_literal_port_at_every_length() {
        // The kernel's loop, written out byte by byte.
        fn reference(key: &[u8], initval: u32) -> u32 {
            let init = JHASH_INITVAL
                .wrapping_add(key.len() as u32)
                .wrapping_add(initval);
            let (mut a, mut b, mut c) = (init, init, init);
            let mut k = key;
            while k.len() > 12 {
                a = a.wrapping_add(word(k, 0));
                b = b.wrapping_add(word(k, 4));
                c = c.wrapping_add(word(k, 8));
                mix(&mut a, &mut b, &mut c);
                k = &k[12..];
            }
            if k.is_empty() {
                return c;
            }
            let mut t = [0u32; 3];
            for (i, &byte) in k.iter().enumerate() {
                t[i / 4] = t[i / 4].wrapping_add((byte as u32) << (8 * (i % 4)));
            }
            final_mix(
                a.wrapping_add(t[0]),
                b.wrapping_add(t[1]),
                c.wrapping_add(t[2]),
            )
        }
        let bytes: Vec<u8> = (0..100u32).map(|i| (i * 37 + 11) as u8).collect();
        for n in 0..=bytes.len() {
            assert_eq!(jhash(&bytes[..n], 99), reference(&bytes[..n], 99), "n={n}");
        }
    }

    #[test]
    fn jhash2_bytes_matches_word_slices() {
        let words: Vec<u32> = (0..40u32).map(|i| i.wrapping_mul(2654435761)).collect();
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        for n in 0..=words.len() {
            assert_eq!(
                jhash2_bytes(&bytes[..4 * n], 7),
                jhash2(&words[..n], 7),
                "n={n}"
            );
        }
    }
}
