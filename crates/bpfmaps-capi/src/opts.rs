//! The option and info structs of the C API, laid out as libbpf's and
//! the kernel's, and libbpf's rule for reading a caller's option struct
//! (`OPTS_VALID`): `sz` says how much of it the caller's header knew; a
//! shorter struct reads as zeros past its end, a longer one must be zero
//! past ours.

use std::mem::{MaybeUninit, size_of};

use crate::Errno;

/// Options for `bpfmaps_map_create`, laid out as libbpf's
/// `struct bpf_map_create_opts` (libbpf 1.4). bpfmaps maps have no BTF,
/// inner maps, devices or tokens: those fields must be zero (`EINVAL`).
/// `numa_node` is read only with `BPF_F_NUMA_NODE`, which no family takes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct bpfmaps_map_create_opts {
    /// `sizeof(struct bpfmaps_map_create_opts)` as the caller knew it.
    pub sz: usize,
    /// Must be 0.
    pub btf_fd: u32,
    /// Must be 0.
    pub btf_key_type_id: u32,
    /// Must be 0.
    pub btf_value_type_id: u32,
    /// Must be 0.
    pub btf_vmlinux_value_type_id: u32,
    /// Must be 0.
    pub inner_map_fd: u32,
    /// Creation flags (`BPF_F_NO_PREALLOC`, `BPF_F_ZERO_SEED`, ...).
    pub map_flags: u32,
    /// The family's extra (the bloom filter's hash count, the wildcard
    /// map's schema, ...).
    pub map_extra: std::ffi::c_ulonglong,
    /// Ignored without `BPF_F_NUMA_NODE`.
    pub numa_node: u32,
    /// Must be 0.
    pub map_ifindex: u32,
    /// Must be 0.
    pub value_type_btf_obj_fd: i32,
    /// Must be 0.
    pub token_fd: u32,
}

/// Options for the batch calls, laid out as libbpf's
/// `struct bpf_map_batch_opts`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct bpfmaps_map_batch_opts {
    /// `sizeof(struct bpfmaps_map_batch_opts)` as the caller knew it.
    pub sz: usize,
    /// Per element: `BPF_ANY`, `BPF_NOEXIST` or `BPF_EXIST` for updates;
    /// 0 for the others.
    pub elem_flags: std::ffi::c_ulonglong,
    /// Must be 0.
    pub flags: std::ffi::c_ulonglong,
}

/// What `bpfmaps_map_get_info_by_fd` fills in, laid out as the kernel's
/// `struct bpf_map_info` (linux/bpf.h); the fields bpfmaps has no use
/// for stay zero.
///
/// cbindgen:field-names=[type, id, key_size, value_size, max_entries, map_flags, name, ifindex, btf_vmlinux_value_type_id, netns_dev, netns_ino, btf_id, btf_key_type_id, btf_value_type_id, pad, map_extra]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct bpfmaps_map_info {
    /// The map type's number.
    pub r#type: u32,
    /// A number no other map of this process has had.
    pub id: u32,
    /// Key size in bytes (the longest key, for variable-length keys).
    pub key_size: u32,
    /// Value size in bytes.
    pub value_size: u32,
    /// Capacity.
    pub max_entries: u32,
    /// Creation flags.
    pub map_flags: u32,
    /// The name given at creation, NUL-terminated.
    pub name: [std::ffi::c_char; 16],
    /// 0.
    pub ifindex: u32,
    /// 0.
    pub btf_vmlinux_value_type_id: u32,
    /// 0.
    pub netns_dev: u64,
    /// 0.
    pub netns_ino: u64,
    /// 0.
    pub btf_id: u32,
    /// 0.
    pub btf_key_type_id: u32,
    /// 0.
    pub btf_value_type_id: u32,
    /// Padding, as the kernel's.
    pub pad: u32,
    /// The family's extra given at creation.
    pub map_extra: std::ffi::c_ulonglong,
}

/// Reads the caller's options at `ptr` (NULL: all zero) by libbpf's
/// `OPTS_VALID` rule: `sz` at least a `size_t`; bytes past the end of
/// `T` zero.
///
/// # Safety
/// `ptr` is NULL or points to `sz` readable bytes starting with `sz`.
pub(crate) unsafe fn read<T: Copy + Default>(ptr: *const T) -> Result<T, Errno> {
    if ptr.is_null() {
        return Ok(T::default());
    }
    // SAFETY: every option struct starts with its size_t sz.
    let sz = unsafe { ptr.cast::<usize>().read_unaligned() };
    if sz < size_of::<usize>() {
        return Err(libc::EINVAL);
    }
    let ours = size_of::<T>();
    if sz > ours {
        // SAFETY: the caller's struct is `sz` bytes.
        let tail = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>().add(ours), sz - ours) };
        if tail.iter().any(|&b| b != 0) {
            return Err(libc::EINVAL);
        }
    }
    let mut out = MaybeUninit::<T>::zeroed();
    // SAFETY: min(sz, ours) bytes are readable at ptr and writable in out;
    // the option structs are plain integers, valid for any bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), out.as_mut_ptr().cast(), sz.min(ours));
        Ok(out.assume_init())
    }
}
