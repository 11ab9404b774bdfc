/* A program written against libbpf's map API (the names, LIBBPF_OPTS, the
 * kernel's constants and struct bpf_map_info), built against bpfmaps by
 * its include line alone. Only the close is bpfmaps' own. */
#include <bpfmaps/libbpf_compat.h>

#include <errno.h>
#include <stdio.h>

#include "check.h"

struct ipv4_lpm_key {
    __u32 prefixlen;
    __u32 data;
};

int main(void) {
    LIBBPF_OPTS(bpf_map_create_opts, opts, .map_flags = BPF_F_NO_PREALLOC);
    int routes = bpf_map_create(BPF_MAP_TYPE_LPM_TRIE, "routes", sizeof(struct ipv4_lpm_key),
                                sizeof(__u32), 1024, &opts);
    CHECK(routes >= 0);
    struct ipv4_lpm_key key = {8, __builtin_bswap32(0x0a000000)}; /* 10.0.0.0/8 */
    __u32 next_hop = 1;
    EQ(bpf_map_update_elem(routes, &key, &next_hop, BPF_NOEXIST), 0);
    ERR(bpf_map_update_elem(routes, &key, &next_hop, BPF_NOEXIST), EEXIST);
    key = (struct ipv4_lpm_key){32, __builtin_bswap32(0x0a010203)};
    next_hop = 0;
    EQ(bpf_map_lookup_elem(routes, &key, &next_hop), 0);
    EQ(next_hop, 1);

    struct bpf_map_info info = {0};
    __u32 len = sizeof(info);
    EQ(bpf_obj_get_info_by_fd(routes, &info, &len), 0);
    EQ(info.type, BPF_MAP_TYPE_LPM_TRIE);
    EQ(info.map_flags, BPF_F_NO_PREALLOC);
    EQ(info.key_size, sizeof(struct ipv4_lpm_key));

    int flows = bpf_map_create(BPF_MAP_TYPE_HASH, "flows", sizeof(__u32), sizeof(__u64), 64, NULL);
    CHECK(flows >= 0);
    __u32 keys[16];
    __u64 values[16];
    for (__u32 i = 0; i < 8; i++) {
        keys[i] = i;
        values[i] = 100 * i;
    }
    __u32 count = 8;
    LIBBPF_OPTS(bpf_map_batch_opts, batch, .elem_flags = BPF_NOEXIST);
    EQ(bpf_map_update_batch(flows, keys, values, &count, &batch), 0);
    EQ(count, 8);
    __u32 out_batch;
    count = 16; /* room for more than the map holds: ENOENT, all of it */
    ERR(bpf_map_lookup_and_delete_batch(flows, NULL, &out_batch, keys, values, &count, NULL), ENOENT);
    EQ(count, 8);
    for (__u32 i = 0; i < count; i++)
        EQ(values[i], 100 * keys[i]);
    __u32 first;
    ERR(bpf_map_get_next_key(flows, NULL, &first), ENOENT);

    EQ(bpfmaps_map_close(routes), 0);
    EQ(bpfmaps_map_close(flows), 0);
    DONE();
}
