/* bpfmaps' calls have libbpf's signatures and its option and info
 * structs libbpf's and the kernel's layouts: checked at compile time
 * against the system's <bpf/bpf.h> (libbpf-dev) and <linux/bpf.h>. */
#include <bpf/bpf.h>
#include <bpfmaps.h>
#include <linux/bpf.h>
#include <stddef.h>

#define SAME_TYPE(a, b)                                                    \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&a), __typeof__(&b)), \
                   #b " has the signature of " #a)

SAME_TYPE(bpf_map_update_elem, bpfmaps_map_update_elem);
SAME_TYPE(bpf_map_lookup_elem, bpfmaps_map_lookup_elem);
SAME_TYPE(bpf_map_lookup_elem_flags, bpfmaps_map_lookup_elem_flags);
SAME_TYPE(bpf_map_lookup_and_delete_elem, bpfmaps_map_lookup_and_delete_elem);
SAME_TYPE(bpf_map_lookup_and_delete_elem_flags, bpfmaps_map_lookup_and_delete_elem_flags);
SAME_TYPE(bpf_map_delete_elem, bpfmaps_map_delete_elem);
SAME_TYPE(bpf_map_delete_elem_flags, bpfmaps_map_delete_elem_flags);
SAME_TYPE(bpf_map_get_next_key, bpfmaps_map_get_next_key);
SAME_TYPE(bpf_obj_get_info_by_fd, bpfmaps_obj_get_info_by_fd);

/* The calls with option structs: the same but for the struct's name. */
#define SAME_FIELD(a, b, f)                                                \
    _Static_assert(offsetof(struct a, f) == offsetof(struct b, f) &&      \
                       sizeof(((struct a *)0)->f) == sizeof(((struct b *)0)->f), \
                   #b "." #f " is where " #a " has it")

SAME_FIELD(bpf_map_create_opts, bpfmaps_map_create_opts, sz);
SAME_FIELD(bpf_map_create_opts, bpfmaps_map_create_opts, btf_fd);
SAME_FIELD(bpf_map_create_opts, bpfmaps_map_create_opts, btf_key_type_id);
SAME_FIELD(bpf_map_create_opts, bpfmaps_map_create_opts, btf_value_type_id);
SAME_FIELD(bpf_map_create_opts, bpfmaps_map_create_opts, btf_vmlinux_value_type_id);
SAME_FIELD(bpf_map_create_opts, bpfmaps_map_create_opts, inner_map_fd);
SAME_FIELD(bpf_map_create_opts, bpfmaps_map_create_opts, map_flags);
SAME_FIELD(bpf_map_create_opts, bpfmaps_map_create_opts, map_extra);
SAME_FIELD(bpf_map_create_opts, bpfmaps_map_create_opts, numa_node);
SAME_FIELD(bpf_map_create_opts, bpfmaps_map_create_opts, map_ifindex);
_Static_assert(sizeof(struct bpfmaps_map_create_opts) >= sizeof(struct bpf_map_create_opts),
               "bpfmaps' create opts hold libbpf's");
SAME_FIELD(bpf_map_batch_opts, bpfmaps_map_batch_opts, sz);
SAME_FIELD(bpf_map_batch_opts, bpfmaps_map_batch_opts, elem_flags);
SAME_FIELD(bpf_map_batch_opts, bpfmaps_map_batch_opts, flags);
_Static_assert(sizeof(struct bpfmaps_map_batch_opts) == sizeof(struct bpf_map_batch_opts), "batch opts");
SAME_FIELD(bpf_map_info, bpfmaps_map_info, type);
SAME_FIELD(bpf_map_info, bpfmaps_map_info, id);
SAME_FIELD(bpf_map_info, bpfmaps_map_info, key_size);
SAME_FIELD(bpf_map_info, bpfmaps_map_info, value_size);
SAME_FIELD(bpf_map_info, bpfmaps_map_info, max_entries);
SAME_FIELD(bpf_map_info, bpfmaps_map_info, map_flags);
SAME_FIELD(bpf_map_info, bpfmaps_map_info, name);
SAME_FIELD(bpf_map_info, bpfmaps_map_info, map_extra);
_Static_assert(sizeof(struct bpfmaps_map_info) == sizeof(struct bpf_map_info), "map info");

typedef int create_fn(enum bpf_map_type, const char *, __u32, __u32, __u32,
                      const struct bpf_map_create_opts *);
typedef int lookup_batch_fn(int, void *, void *, void *, void *, __u32 *,
                            const struct bpf_map_batch_opts *);
typedef int update_batch_fn(int, const void *, const void *, __u32 *,
                            const struct bpf_map_batch_opts *);
typedef int delete_batch_fn(int, const void *, __u32 *, const struct bpf_map_batch_opts *);
_Static_assert(__builtin_types_compatible_p(__typeof__(&bpf_map_create), create_fn *), "libbpf's create");
_Static_assert(__builtin_types_compatible_p(__typeof__(&bpf_map_lookup_batch), lookup_batch_fn *), "libbpf's");
_Static_assert(__builtin_types_compatible_p(__typeof__(&bpf_map_update_batch), update_batch_fn *), "libbpf's");
_Static_assert(__builtin_types_compatible_p(__typeof__(&bpf_map_delete_batch), delete_batch_fn *), "libbpf's");

int main(void) {
    /* The same shapes with bpfmaps' structs (and its type number as an
     * unsigned int, which an enum bpf_map_type converts to). */
    int (*create)(uint32_t, const char *, uint32_t, uint32_t, uint32_t,
                  const struct bpfmaps_map_create_opts *) = bpfmaps_map_create;
    int (*lookup_batch)(int, void *, void *, void *, void *, __u32 *,
                        const struct bpfmaps_map_batch_opts *) = bpfmaps_map_lookup_batch;
    int (*update_batch)(int, const void *, const void *, __u32 *,
                        const struct bpfmaps_map_batch_opts *) = bpfmaps_map_update_batch;
    int (*delete_batch)(int, const void *, __u32 *, const struct bpfmaps_map_batch_opts *) =
        bpfmaps_map_delete_batch;
    return !(create && lookup_batch && update_batch && delete_batch);
}
