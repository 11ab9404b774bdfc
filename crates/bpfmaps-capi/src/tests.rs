use super::*;

/// The C header's type list is the registry's.
#[test]
fn map_types_are_the_registrys() {
    let registry: Vec<(u32, &str)> = bpfmaps::registry::FAMILIES
        .iter()
        .map(|f| (f.map_type.0, f.name))
        .collect();
    assert_eq!(MAP_TYPES, &registry[..]);
}

/// `include/bpfmaps.h` is what cbindgen makes of this crate now;
/// `BPFMAPS_BLESS=1 cargo test -p bpfmaps-capi header` rewrites it.
#[test]
#[cfg_attr(
    miri,
    ignore = "cbindgen parses the crate: minutes under Miri, no unsafe code"
)]
fn header_is_current() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).unwrap();
    let mut made = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen reads the crate")
        .write(&mut made);
    let path = dir.join("include/bpfmaps.h");
    if std::env::var_os("BPFMAPS_BLESS").is_some() {
        std::fs::write(&path, &made).unwrap();
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == made,
        "include/bpfmaps.h is stale: BPFMAPS_BLESS=1 cargo test -p bpfmaps-capi header"
    );
}

/// A panic inside a call comes out as `EIO` (and errno), never as an
/// unwind into C.
#[test]
fn a_panic_is_eio() {
    errno::set_errno(errno::Errno(0));
    assert_eq!(call(|| panic!("a bug")), -libc::EIO);
    assert_eq!(errno::errno().0, libc::EIO);
    assert_eq!(call(|| Ok(7)), 7);
}

fn hash_map() -> c_int {
    // SAFETY: no name, no options.
    let fd = unsafe {
        bpfmaps_map_create(
            BPFMAPS_MAP_TYPE_HASH,
            std::ptr::null(),
            4,
            4,
            8,
            std::ptr::null(),
        )
    };
    assert!(fd >= 0);
    fd
}

/// A handle closed with close(2) instead of `bpfmaps_map_close`: the
/// next map that gets its number replaces the stale map, which is freed.
#[test]
#[cfg_attr(miri, ignore = "close(2) of a memfd; Miri's handles are a counter")]
fn a_number_closed_by_close_2_is_taken_over() {
    let fd = hash_map();
    let key = 1u32;
    // SAFETY: a key and a value of the map's sizes.
    let stored =
        unsafe { bpfmaps_map_update_elem(fd, (&raw const key).cast(), (&raw const key).cast(), 0) };
    assert_eq!(stored, 0);
    // SAFETY: the memfd behind the handle; the slot stays stale.
    unsafe { libc::close(fd) };
    let mut again = hash_map();
    let mut spare = Vec::new();
    // Other tests make handles too: keep making until the number is back.
    while again != fd && spare.len() < 64 {
        spare.push(again);
        again = hash_map();
    }
    if again == fd {
        assert_eq!(
            with_map(fd, |m| m.len()),
            Some(0),
            "the new map, not the stale one"
        );
    }
    for h in spare.into_iter().chain([again]) {
        assert_eq!(bpfmaps_map_close(h), 0);
    }
}

#[test]
fn with_map_sees_the_handles_map() {
    let fd = hash_map();
    assert_eq!(with_map(fd, |m| m.info().max_entries), Some(8));
    assert_eq!(bpfmaps_map_close(fd), 0);
    assert_eq!(with_map(fd, |m| m.len()), None);
    assert_eq!(with_map(-3, |m| m.len()), None);
}

/// The calls' raw pointers, from Rust, so that Miri checks every read
/// and write they make of the caller's memory (the C tests cover the
/// same calls from C, where Miri cannot go): fixed keys, keys with their
/// length in front, key-less maps, batches with tokens, info.
mod pointers {
    use std::ffi::c_void;
    use std::ptr::{null, null_mut};

    use super::*;

    fn p<T>(x: &T) -> *const c_void {
        (x as *const T).cast()
    }
    fn m<T>(x: &mut T) -> *mut c_void {
        (x as *mut T).cast()
    }
    /// A lookup batch (`delete`: a lookup-and-delete batch) of up to
    /// `count` entries from the first key: its return and `count`.
    ///
    /// # Safety
    /// `keys` and `values` have room for `count` keys and values.
    unsafe fn first_batch(
        fd: c_int,
        keys: *mut c_void,
        values: *mut c_void,
        mut count: u32,
        delete: bool,
    ) -> (c_int, u32) {
        let call = if delete {
            bpfmaps_map_lookup_and_delete_batch
        } else {
            bpfmaps_map_lookup_batch
        };
        let mut token = 0u32;
        let out = m(&mut token);
        // SAFETY: the caller's promise; the token's 4 bytes are ours.
        let r = unsafe { call(fd, null_mut(), out, keys, values, &mut count, null()) };
        (r, count)
    }

    fn create(map_type: u32, key_size: u32, value_size: u32, max: u32) -> c_int {
        // SAFETY: a NUL-terminated name, no options.
        unsafe { bpfmaps_map_create(map_type, c"t".as_ptr(), key_size, value_size, max, null()) }
    }

    #[test]
    fn fixed_keys_every_call() {
        let fd = create(BPFMAPS_MAP_TYPE_HASH, 4, 8, 16);
        assert!(fd >= 0);
        // SAFETY: (the whole test) every pointer is to a live local of
        // the map's key or value size, or NULL where the call allows it.
        unsafe {
            for k in 0..10u32 {
                let v = u64::from(k) * 3;
                assert_eq!(bpfmaps_map_update_elem(fd, p(&k), p(&v), 0), 0);
            }
            let (k, mut v) = (7u32, 0u64);
            assert_eq!(bpfmaps_map_lookup_elem(fd, p(&k), m(&mut v)), 0);
            assert_eq!(v, 21);
            // One buffer for the key and the value, as the kernel allows.
            let mut both = 7u64;
            assert_eq!(bpfmaps_map_lookup_elem(fd, p(&both), m(&mut both)), 0);
            assert_eq!(both, 21);
            let mut both = 8u64;
            let r = bpfmaps_map_lookup_and_delete_elem(fd, p(&both), m(&mut both));
            assert_eq!((r, both), (0, 24));
            assert_eq!(bpfmaps_map_update_elem(fd, p(&k), p(&v), 1), -libc::EEXIST);
            assert_eq!(
                bpfmaps_map_lookup_elem_flags(fd, p(&k), m(&mut v), 4),
                -libc::EINVAL
            );
            assert_eq!(
                bpfmaps_map_lookup_elem(fd, null(), m(&mut v)),
                -libc::EFAULT
            );
            assert_eq!(
                bpfmaps_map_lookup_elem(fd, p(&k), null_mut()),
                -libc::EFAULT
            );
            assert_eq!(bpfmaps_map_lookup_and_delete_elem(fd, p(&k), m(&mut v)), 0);
            assert_eq!(bpfmaps_map_delete_elem(fd, p(&k)), -libc::ENOENT);
            assert_eq!(bpfmaps_map_delete_elem(fd, p(&1u32)), 0);

            // The walk: get_next_key from NULL to ENOENT, eight keys.
            let (mut key, mut seen) = (0u32, 0);
            let mut at = null();
            while bpfmaps_map_get_next_key(fd, at, m(&mut key)) == 0 {
                seen += 1;
                at = p(&key);
            }
            assert_eq!(seen, 7);

            // Batches of three, resumed from their tokens.
            let (mut keys, mut values) = ([0u32; 3], [0u64; 3]);
            let (mut token, mut got) = (0u32, Vec::new());
            let mut in_batch = null_mut();
            loop {
                let mut count = 3u32;
                let r = bpfmaps_map_lookup_batch(
                    fd,
                    in_batch,
                    m(&mut token),
                    m(&mut keys),
                    m(&mut values),
                    &mut count,
                    null(),
                );
                got.extend((0..count as usize).map(|i| (keys[i], values[i])));
                if r == -libc::ENOENT {
                    break;
                }
                assert_eq!(r, 0);
                in_batch = m(&mut token);
            }
            got.sort();
            let want: Vec<(u32, u64)> = [0, 2, 3, 4, 5, 6, 9]
                .iter()
                .map(|&k| (k, u64::from(k) * 3))
                .collect();
            assert_eq!(got, want);

            let (ks, vs) = ([20u32, 21, 22], [1u64, 2, 3]);
            let mut count = 3;
            let opts = bpfmaps_map_batch_opts {
                sz: size_of::<bpfmaps_map_batch_opts>(),
                ..Default::default()
            };
            assert_eq!(
                bpfmaps_map_update_batch(fd, p(&ks), p(&vs), &mut count, &opts),
                0
            );
            let mut count = 3;
            let gone = [20u32, 99, 21];
            assert_eq!(
                bpfmaps_map_delete_batch(fd, p(&gone), &mut count, null()),
                -libc::ENOENT
            );
            assert_eq!(count, 1);
            let mut both = [0u64; 2];
            let one = m(&mut both);
            let (r, _) = first_batch(fd, one, one, 2, false);
            assert_eq!(r, -libc::EINVAL, "keys and values in one buffer");
            let (mut keys, mut values) = ([0u32; 16], [0u64; 16]);
            let moved = first_batch(fd, m(&mut keys), m(&mut values), 16, true);
            assert_eq!(moved, (-libc::ENOENT, 9));

            let mut info = bpfmaps_map_info::default();
            let mut len = size_of::<bpfmaps_map_info>() as u32;
            assert_eq!(bpfmaps_map_get_info_by_fd(fd, &mut info, &mut len), 0);
            assert_eq!((info.r#type, info.key_size, info.value_size), (1, 4, 8));
            assert_eq!(info.name[0], b't' as c_char);
        }
        assert_eq!(bpfmaps_map_close(fd), 0);
        // SAFETY: as above; the handle is gone.
        unsafe {
            assert_eq!(
                bpfmaps_map_lookup_elem(fd, p(&1u32), m(&mut 0u64)),
                -libc::EBADF
            )
        };
    }

    /// Keys of the qp-trie as the kernel's LPM key: a `u32` length, then
    /// up to `key_size` bytes; the calls read only `4 + length` bytes.
    #[test]
    fn keys_with_their_length_in_front() {
        let fd = create(BPFMAPS_MAP_TYPE_QP_TRIE, 8, 4, 16);
        assert!(fd >= 0);
        let key = |s: &[u8]| {
            let mut k = (s.len() as u32).to_ne_bytes().to_vec();
            k.extend_from_slice(s);
            k
        };
        // SAFETY: (the whole test) keys are a length and that many bytes,
        // out buffers hold 4 + key_size bytes.
        unsafe {
            for (i, s) in [&b"ab"[..], b"ab\0", b"abcdefgh"].iter().enumerate() {
                let v = i as u32;
                assert_eq!(
                    bpfmaps_map_update_elem(fd, key(s).as_ptr().cast(), p(&v), 0),
                    0
                );
            }
            let mut v = 0u32;
            assert_eq!(
                bpfmaps_map_lookup_elem(fd, key(b"ab\0").as_ptr().cast(), m(&mut v)),
                0
            );
            assert_eq!(v, 1);
            let too_long = key(b"abcdefghi");
            assert_eq!(
                bpfmaps_map_lookup_elem(fd, too_long.as_ptr().cast(), m(&mut v)),
                -libc::EINVAL
            );
            let mut next = [0u8; 12];
            assert_eq!(
                bpfmaps_map_get_next_key(fd, key(b"ab").as_ptr().cast(), m(&mut next)),
                0
            );
            assert_eq!(&next[..7], &key(b"ab\0")[..]);
            assert_eq!(next[7..], [0; 5]);
            let (mut keys, mut values) = ([0u8; 12 * 8], [0u32; 8]);
            let (r, count) = first_batch(fd, m(&mut keys), m(&mut values), 8, false);
            assert_eq!(
                (r, count, values),
                (-libc::ENOENT, 3, [0, 1, 2, 0, 0, 0, 0, 0])
            );
            assert_eq!(&keys[24..36], &key(b"abcdefgh")[..]);
        }
        assert_eq!(bpfmaps_map_close(fd), 0);
    }

    /// The bloom filter: no key (NULL), the value pushed and peeked.
    #[test]
    fn a_map_without_keys() {
        let fd = create(BPFMAPS_MAP_TYPE_BLOOM_FILTER, 0, 8, 64);
        assert!(fd >= 0);
        // SAFETY: NULL keys, 8-byte values.
        unsafe {
            let v = 42u64;
            assert_eq!(bpfmaps_map_update_elem(fd, null(), p(&v), 0), 0);
            let mut probe = 42u64;
            assert_eq!(bpfmaps_map_lookup_elem(fd, null(), m(&mut probe)), 0);
            assert_eq!(
                bpfmaps_map_lookup_elem(fd, p(&1u32), m(&mut probe)),
                -libc::EINVAL
            );
        }
        assert_eq!(bpfmaps_map_close(fd), 0);
    }

    /// A handle closed while another thread calls on it: each call
    /// finishes on the map or gets `EBADF`; the map is freed after.
    #[test]
    fn a_close_racing_lookups() {
        let fd = create(BPFMAPS_MAP_TYPE_HASH, 4, 8, 16);
        // A key no other test stores: once closed, the number may come
        // back as another test's map, which answers ENOENT or EINVAL.
        let k = 0xdead_beef_u32;
        assert_eq!(
            // SAFETY: a key and a value of the map's sizes.
            unsafe { bpfmaps_map_update_elem(fd, p(&k), p(&7u64), 0) },
            0
        );
        let reader = std::thread::spawn(move || {
            let rounds = if cfg!(miri) { 20 } else { 100_000 };
            for _ in 0..rounds {
                let mut v = 0u64;
                // SAFETY: as above.
                match unsafe { bpfmaps_map_lookup_elem(fd, p(&k), m(&mut v)) } {
                    0 => assert_eq!(v, 7),
                    e => return assert!([libc::EBADF, libc::ENOENT, libc::EINVAL].contains(&-e)),
                }
            }
        });
        std::thread::yield_now();
        assert_eq!(bpfmaps_map_close(fd), 0);
        reader.join().unwrap();
    }
}
