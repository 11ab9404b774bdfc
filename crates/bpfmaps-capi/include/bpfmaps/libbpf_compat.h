/* bpfmaps/libbpf_compat.h: libbpf's map calls, option structs and
 * LIBBPF_OPTS mapped onto bpfmaps' own (bpfmaps.h), so that a C file
 * written against libbpf's map API builds against bpfmaps by changing
 * one include line, from <bpf/bpf.h> to <bpfmaps/libbpf_compat.h>.
 *
 * What does not carry over (docs/c-api.md):
 * - a handle is closed with bpfmaps_map_close(fd), not close(fd): a
 *   close(2) frees the number but leaves the map until a later create
 *   gets the same number back;
 * - a batch walk's in_batch/out_batch token is 4 bytes for every map
 *   type (the kernel's hash maps use 4; its generic batch code a key).
 *
 * The kernel's constants (BPF_MAP_TYPE_*, BPF_ANY, BPF_F_NO_PREALLOC, ...)
 * come from <linux/bpf.h> when the system has it, as with libbpf, and
 * are defined here otherwise. Hand-written; bpfmaps.h is generated. */
#ifndef BPFMAPS_LIBBPF_COMPAT_H
#define BPFMAPS_LIBBPF_COMPAT_H

#include <bpfmaps.h>
#include <string.h> /* memset, in LIBBPF_OPTS */

#if defined(__has_include)
#if __has_include(<linux/bpf.h>)
#include <linux/bpf.h>
#define BPFMAPS_HAVE_LINUX_BPF_H 1
#endif
#endif

#ifndef BPFMAPS_HAVE_LINUX_BPF_H
typedef uint8_t __u8;
typedef uint16_t __u16;
typedef uint32_t __u32;
typedef int32_t __s32;
typedef unsigned long long __u64;

enum bpf_map_type {
    BPF_MAP_TYPE_HASH = BPFMAPS_MAP_TYPE_HASH,
    BPF_MAP_TYPE_STACK_TRACE = BPFMAPS_MAP_TYPE_STACK_TRACE,
    BPF_MAP_TYPE_LRU_HASH = BPFMAPS_MAP_TYPE_LRU_HASH,
    BPF_MAP_TYPE_LPM_TRIE = BPFMAPS_MAP_TYPE_LPM_TRIE,
    BPF_MAP_TYPE_BLOOM_FILTER = BPFMAPS_MAP_TYPE_BLOOM_FILTER,
};

enum {
    BPF_ANY = 0,
    BPF_NOEXIST = 1,
    BPF_EXIST = 2,
    BPF_F_LOCK = 4,
};

enum {
    BPF_F_NO_PREALLOC = 1U << 0,
    BPF_F_ZERO_SEED = 1U << 6,
};

#define BPF_OBJ_NAME_LEN 16U
#endif

/* The types. The kernel's struct bpf_map_info (linux/bpf.h) has the
 * same layout as bpfmaps_map_info; its name is taken over from here on. */
#define bpf_map_create_opts bpfmaps_map_create_opts
#define bpf_map_batch_opts bpfmaps_map_batch_opts
#define bpf_map_info bpfmaps_map_info

/* The calls. */
#define bpf_map_create bpfmaps_map_create
#define bpf_map_update_elem bpfmaps_map_update_elem
#define bpf_map_lookup_elem bpfmaps_map_lookup_elem
#define bpf_map_lookup_elem_flags bpfmaps_map_lookup_elem_flags
#define bpf_map_lookup_and_delete_elem bpfmaps_map_lookup_and_delete_elem
#define bpf_map_lookup_and_delete_elem_flags bpfmaps_map_lookup_and_delete_elem_flags
#define bpf_map_delete_elem bpfmaps_map_delete_elem
#define bpf_map_delete_elem_flags bpfmaps_map_delete_elem_flags
#define bpf_map_get_next_key bpfmaps_map_get_next_key
#define bpf_map_lookup_batch bpfmaps_map_lookup_batch
#define bpf_map_lookup_and_delete_batch bpfmaps_map_lookup_and_delete_batch
#define bpf_map_update_batch bpfmaps_map_update_batch
#define bpf_map_delete_batch bpfmaps_map_delete_batch
#define bpf_map_get_info_by_fd bpfmaps_map_get_info_by_fd
#define bpf_obj_get_info_by_fd bpfmaps_obj_get_info_by_fd

/* libbpf's way of declaring an options struct: zeroed (padding too),
 * sz set, then the named fields. */
#define LIBBPF_OPTS(TYPE, NAME, ...)                                       \
    struct TYPE NAME = ({                                                  \
        memset(&NAME, 0, sizeof(struct TYPE));                             \
        (struct TYPE){                                                     \
            .sz = sizeof(struct TYPE),                                     \
            __VA_ARGS__                                                    \
        };                                                                 \
    })
#define DECLARE_LIBBPF_OPTS LIBBPF_OPTS

#endif
