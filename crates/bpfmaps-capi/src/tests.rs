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
