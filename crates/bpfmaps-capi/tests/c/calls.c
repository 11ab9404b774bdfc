/* Every call of the C API, every errno it documents, on every kind of
 * key (fixed, LPM, none, variable-length, range). */
#include <bpfmaps.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

#define ANY 0
#define NOEXIST 1
#define EXIST 2
#define NO_PREALLOC 1

static void hash_map_single_calls(void) {
    int fd = bpfmaps_map_create(BPFMAPS_MAP_TYPE_HASH, "flows", 4, 8, 4, NULL);
    CHECK(fd > 2);
    uint32_t k = 1;
    uint64_t v = 100, out = 0;

    EQ(bpfmaps_map_update_elem(fd, &k, &v, NOEXIST), 0);
    ERR(bpfmaps_map_update_elem(fd, &k, &v, NOEXIST), EEXIST);
    v = 101;
    EQ(bpfmaps_map_update_elem(fd, &k, &v, EXIST), 0);
    k = 2;
    ERR(bpfmaps_map_update_elem(fd, &k, &v, EXIST), ENOENT);
    ERR(bpfmaps_map_update_elem(fd, &k, &v, 7), EINVAL);
    ERR(bpfmaps_map_update_elem(fd, NULL, &v, ANY), EFAULT);
    ERR(bpfmaps_map_update_elem(fd, &k, NULL, ANY), EFAULT);

    k = 1;
    EQ(bpfmaps_map_lookup_elem(fd, &k, &out), 0);
    EQ(out, 101);
    EQ(bpfmaps_map_lookup_elem_flags(fd, &k, &out, 0), 0);
    ERR(bpfmaps_map_lookup_elem_flags(fd, &k, &out, 4 /* BPF_F_LOCK */), EINVAL);
    ERR(bpfmaps_map_lookup_elem(fd, NULL, &out), EFAULT);
    ERR(bpfmaps_map_lookup_elem(fd, &k, NULL), EFAULT);
    k = 9;
    ERR(bpfmaps_map_lookup_elem(fd, &k, &out), ENOENT);

    /* Full: a new key is E2BIG, an existing one still updates. */
    for (k = 2; k <= 4; k++)
        EQ(bpfmaps_map_update_elem(fd, &k, &v, ANY), 0);
    k = 5;
    ERR(bpfmaps_map_update_elem(fd, &k, &v, ANY), E2BIG);
    k = 4;
    EQ(bpfmaps_map_update_elem(fd, &k, &v, ANY), 0);

    /* get_next_key: NULL starts; each key once; the last is ENOENT. */
    uint32_t cur, next, seen = 0;
    int n = 0;
    EQ(bpfmaps_map_get_next_key(fd, NULL, &cur), 0);
    do {
        seen |= 1u << cur;
        n++;
    } while (bpfmaps_map_get_next_key(fd, &cur, &next) == 0 && (cur = next, 1));
    EQ(errno, ENOENT);
    EQ(n, 4);
    EQ(seen, 0x1e);
    ERR(bpfmaps_map_get_next_key(fd, NULL, NULL), EFAULT);

    k = 3;
    EQ(bpfmaps_map_lookup_and_delete_elem(fd, &k, &out), 0);
    EQ(out, 101);
    ERR(bpfmaps_map_lookup_and_delete_elem(fd, &k, &out), ENOENT);
    EQ(bpfmaps_map_lookup_and_delete_elem_flags(fd, &(uint32_t){4}, &out, 0), 0);
    ERR(bpfmaps_map_lookup_and_delete_elem_flags(fd, &(uint32_t){2}, &out, 1), EINVAL);
    k = 2;
    EQ(bpfmaps_map_delete_elem(fd, &k), 0);
    ERR(bpfmaps_map_delete_elem(fd, &k), ENOENT);
    ERR(bpfmaps_map_delete_elem_flags(fd, &(uint32_t){1}, 1), EINVAL);
    EQ(bpfmaps_map_delete_elem_flags(fd, &(uint32_t){1}, 0), 0);
    ERR(bpfmaps_map_get_next_key(fd, NULL, &cur), ENOENT);

    EQ(bpfmaps_map_close(fd), 0);
}

static void creation_and_handles(void) {
    ERR(bpfmaps_map_create(12345, NULL, 4, 4, 4, NULL), EINVAL);
    ERR(bpfmaps_map_create(BPFMAPS_MAP_TYPE_HASH, NULL, 0, 4, 4, NULL), EINVAL);
    ERR(bpfmaps_map_create(BPFMAPS_MAP_TYPE_HASH, NULL, 4, 4, 0, NULL), EINVAL);
    ERR(bpfmaps_map_create(BPFMAPS_MAP_TYPE_HASH, "a b", 4, 4, 4, NULL), EINVAL);

    struct bpfmaps_map_create_opts opts = {.sz = sizeof(opts), .map_flags = 1u << 20};
    ERR(bpfmaps_map_create(BPFMAPS_MAP_TYPE_HASH, NULL, 4, 4, 4, &opts), EINVAL);
    opts = (struct bpfmaps_map_create_opts){.sz = sizeof(opts), .btf_fd = 3};
    ERR(bpfmaps_map_create(BPFMAPS_MAP_TYPE_HASH, NULL, 4, 4, 4, &opts), EINVAL);
    opts = (struct bpfmaps_map_create_opts){.sz = 4};
    ERR(bpfmaps_map_create(BPFMAPS_MAP_TYPE_HASH, NULL, 4, 4, 4, &opts), EINVAL);

    /* A newer caller's longer opts: zero past ours is fine, else EINVAL;
     * an older caller's shorter opts read as zeros past their end. */
    struct {
        struct bpfmaps_map_create_opts o;
        uint64_t more;
    } longer = {.o = {.sz = sizeof(longer), .map_flags = NO_PREALLOC}};
    int fd = bpfmaps_map_create(BPFMAPS_MAP_TYPE_HASH, NULL, 4, 4, 4, &longer.o);
    CHECK(fd >= 0);
    EQ(bpfmaps_map_close(fd), 0);
    longer.more = 1;
    ERR(bpfmaps_map_create(BPFMAPS_MAP_TYPE_HASH, NULL, 4, 4, 4, &longer.o), EINVAL);
    opts = (struct bpfmaps_map_create_opts){.sz = 8 + 5 * 4, .map_flags = 1u << 20};
    fd = bpfmaps_map_create(BPFMAPS_MAP_TYPE_HASH, NULL, 4, 4, 4, &opts);
    CHECK(fd >= 0); /* map_flags lies past the caller's sz: not read */
    EQ(bpfmaps_map_close(fd), 0);

    /* Names are cut to 15 bytes, as libbpf cuts them. */
    opts = (struct bpfmaps_map_create_opts){.sz = sizeof(opts), .map_flags = NO_PREALLOC};
    fd = bpfmaps_map_create(BPFMAPS_MAP_TYPE_HASH, "a_very_long_map_name", 8, 16, 100, &opts);
    CHECK(fd >= 0);
    struct bpfmaps_map_info info;
    uint32_t len = sizeof(info);
    memset(&info, 0, sizeof(info));
    EQ(bpfmaps_map_get_info_by_fd(fd, &info, &len), 0);
    EQ(len, sizeof(info));
    EQ(info.type, BPFMAPS_MAP_TYPE_HASH);
    EQ(info.key_size, 8);
    EQ(info.value_size, 16);
    EQ(info.max_entries, 100);
    EQ(info.map_flags, NO_PREALLOC);
    CHECK(strcmp(info.name, "a_very_long_map") == 0);
    CHECK(info.id > 0);

    /* Less room: only that much written. More: zero past ours, or E2BIG. */
    struct {
        struct bpfmaps_map_info i;
        uint64_t more;
    } big;
    memset(&big, 0xAB, sizeof(big));
    len = 8;
    EQ(bpfmaps_obj_get_info_by_fd(fd, &big.i, &len), 0);
    EQ(len, 8);
    EQ(big.i.type, BPFMAPS_MAP_TYPE_HASH);
    EQ(big.i.key_size, 0xABABABAB);
    len = sizeof(big);
    ERR(bpfmaps_map_get_info_by_fd(fd, &big.i, &len), E2BIG);
    memset(&big, 0, sizeof(big));
    EQ(bpfmaps_map_get_info_by_fd(fd, &big.i, &len), 0);
    EQ(len, sizeof(info));
    CHECK(big.i.id == info.id);
    ERR(bpfmaps_map_get_info_by_fd(fd, &info, NULL), EFAULT);

    /* Another map: another id and handle. */
    int fd2 = bpfmaps_map_create(BPFMAPS_MAP_TYPE_HASH, NULL, 4, 4, 4, NULL);
    CHECK(fd2 >= 0 && fd2 != fd);
    len = sizeof(big.i);
    EQ(bpfmaps_map_get_info_by_fd(fd2, &big.i, &len), 0);
    CHECK(big.i.id != info.id);
    EQ(big.i.name[0], 0);

    /* Handles that hold no map: closed, never opened, not ours. */
    EQ(bpfmaps_map_close(fd), 0);
    uint32_t k = 0;
    uint64_t v[2];
    ERR(bpfmaps_map_lookup_elem(fd, &k, v), EBADF);
    ERR(bpfmaps_map_update_elem(fd, &k, v, ANY), EBADF);
    ERR(bpfmaps_map_close(fd), EBADF);
    ERR(bpfmaps_map_lookup_elem(-1, &k, v), EBADF);
    ERR(bpfmaps_map_lookup_elem(0, &k, v), EBADF);
    ERR(bpfmaps_map_lookup_elem(1 << 30, &k, v), EBADF);
    ERR(bpfmaps_map_get_next_key(999999, NULL, &k), EBADF);
    ERR(bpfmaps_map_get_info_by_fd(-5, &info, &len), EBADF);
    EQ(bpfmaps_map_close(fd2), 0);
}

static void batches(void) {
    int fd = bpfmaps_map_create(BPFMAPS_MAP_TYPE_HASH, "batch", 4, 4, 16, NULL);
    CHECK(fd >= 0);
    struct bpfmaps_map_batch_opts opts = {.sz = sizeof(opts), .elem_flags = NOEXIST};
    uint32_t keys[16], values[16], count;

    /* Partial progress: the third key is a duplicate under NOEXIST. */
    uint32_t in_k[4] = {0, 1, 0, 2}, in_v[4] = {10, 11, 12, 13};
    count = 4;
    ERR(bpfmaps_map_update_batch(fd, in_k, in_v, &count, &opts), EEXIST);
    EQ(count, 2);
    for (uint32_t i = 2; i < 10; i++) {
        in_k[0] = i;
        in_v[0] = 10 + i;
        count = 1;
        EQ(bpfmaps_map_update_batch(fd, in_k, in_v, &count, NULL), 0);
        EQ(count, 1);
    }
    count = 0;
    EQ(bpfmaps_map_update_batch(fd, NULL, NULL, &count, NULL), 0);
    ERR(bpfmaps_map_update_batch(fd, in_k, in_v, NULL, NULL), EFAULT);
    opts = (struct bpfmaps_map_batch_opts){.sz = sizeof(opts), .flags = 1};
    count = 1;
    ERR(bpfmaps_map_update_batch(fd, in_k, in_v, &count, &opts), EINVAL);
    opts = (struct bpfmaps_map_batch_opts){.sz = sizeof(opts), .elem_flags = 9};
    ERR(bpfmaps_map_update_batch(fd, in_k, in_v, &count, &opts), EINVAL);

    /* Lookups in chunks of 4 through the tokens: 4, 4, then 2 and ENOENT. */
    uint32_t token = 0, seen = 0;
    int got = 0;
    for (int round = 0; round < 3; round++) {
        count = 4;
        int err = bpfmaps_map_lookup_batch(fd, round ? &token : NULL, &token, keys, values, &count, NULL);
        EQ(err, round < 2 ? 0 : -ENOENT);
        EQ(count, round < 2 ? 4 : 2);
        for (uint32_t i = 0; i < count; i++) {
            EQ(values[i], 10 + keys[i]);
            CHECK(!(seen & (1u << keys[i])));
            seen |= 1u << keys[i];
            got++;
        }
    }
    EQ(got, 10);
    EQ(seen, 0x3ff);
    uint32_t bogus = 0xdead;
    count = 4;
    ERR(bpfmaps_map_lookup_batch(fd, &bogus, &token, keys, values, &count, NULL), EINVAL);
    ERR(bpfmaps_map_lookup_batch(fd, NULL, NULL, keys, values, &count, NULL), EFAULT);
    ERR(bpfmaps_map_lookup_batch(fd, NULL, &token, NULL, values, &count, NULL), EFAULT);
    opts = (struct bpfmaps_map_batch_opts){.sz = sizeof(opts), .elem_flags = 4};
    ERR(bpfmaps_map_lookup_batch(fd, NULL, &token, keys, values, &count, &opts), EINVAL);
    opts = (struct bpfmaps_map_batch_opts){.sz = 2};
    ERR(bpfmaps_map_lookup_batch(fd, NULL, &token, keys, values, &count, &opts), EINVAL);
    count = 0;
    EQ(bpfmaps_map_lookup_batch(fd, NULL, &token, keys, values, &count, NULL), 0);
    /* Everything in one call that has room for more: ENOENT, all of it. */
    count = 16;
    ERR(bpfmaps_map_lookup_batch(fd, NULL, &token, keys, values, &count, NULL), ENOENT);
    EQ(count, 10);

    /* Deletes stop at the first missing key. */
    uint32_t del[3] = {0, 42, 1};
    count = 3;
    ERR(bpfmaps_map_delete_batch(fd, del, &count, NULL), ENOENT);
    EQ(count, 1);
    count = 1;
    EQ(bpfmaps_map_delete_batch(fd, &del[2], &count, NULL), 0);
    EQ(count, 1);

    /* Lookup-and-delete in chunks empties the map. */
    int moved = 0;
    for (int round = 0;; round++) {
        count = 3;
        int err = bpfmaps_map_lookup_and_delete_batch(fd, round ? &token : NULL, &token, keys, values, &count, NULL);
        for (uint32_t i = 0; i < count; i++)
            EQ(values[i], 10 + keys[i]);
        moved += count;
        if (err) {
            EQ(err, -ENOENT);
            break;
        }
    }
    EQ(moved, 8);
    ERR(bpfmaps_map_get_next_key(fd, NULL, keys), ENOENT);
    EQ(bpfmaps_map_close(fd), 0);
}

struct lpm_v4 {
    uint32_t prefixlen;
    uint8_t addr[4];
};

static void lpm_tries(void) {
    uint32_t types[2] = {BPFMAPS_MAP_TYPE_LPM_TRIE, BPFMAPS_MAP_TYPE_KERNEL_LPM_TRIE};
    struct bpfmaps_map_create_opts opts = {.sz = sizeof(opts), .map_flags = NO_PREALLOC};
    for (int t = 0; t < 2; t++) {
        int fd = bpfmaps_map_create(types[t], "routes", sizeof(struct lpm_v4), 4, 100, &opts);
        CHECK(fd >= 0);
        struct lpm_v4 k = {8, {10, 0, 0, 0}};
        uint32_t v = 1, out = 0;
        EQ(bpfmaps_map_update_elem(fd, &k, &v, ANY), 0);
        k = (struct lpm_v4){16, {10, 1, 0, 0}};
        v = 2;
        EQ(bpfmaps_map_update_elem(fd, &k, &v, ANY), 0);
        k = (struct lpm_v4){32, {10, 1, 2, 3}};
        EQ(bpfmaps_map_lookup_elem(fd, &k, &out), 0);
        EQ(out, 2);
        k = (struct lpm_v4){32, {10, 2, 0, 0}};
        EQ(bpfmaps_map_lookup_elem(fd, &k, &out), 0);
        EQ(out, 1);
        k = (struct lpm_v4){32, {11, 0, 0, 0}};
        ERR(bpfmaps_map_lookup_elem(fd, &k, &out), ENOENT);
        k = (struct lpm_v4){33, {10, 0, 0, 0}};
        ERR(bpfmaps_map_update_elem(fd, &k, &v, ANY), EINVAL);
        struct lpm_v4 first, second;
        EQ(bpfmaps_map_get_next_key(fd, NULL, &first), 0);
        EQ(bpfmaps_map_get_next_key(fd, &first, &second), 0);
        CHECK(first.prefixlen + second.prefixlen == 24);
        ERR(bpfmaps_map_get_next_key(fd, &second, &first), ENOENT);
        EQ(bpfmaps_map_close(fd), 0);
    }
}

static void keyless_bloom_filter(void) {
    struct bpfmaps_map_create_opts opts = {.sz = sizeof(opts), .map_extra = 3};
    int fd = bpfmaps_map_create(BPFMAPS_MAP_TYPE_BLOOM_FILTER, "seen", 0, 4, 1000, &opts);
    CHECK(fd >= 0);
    uint32_t v = 77, k = 0;
    EQ(bpfmaps_map_update_elem(fd, NULL, &v, ANY), 0);
    EQ(bpfmaps_map_lookup_elem(fd, NULL, &v), 0);
    int absent = 0;
    for (v = 1000; v < 1100; v++)
        absent += bpfmaps_map_lookup_elem(fd, NULL, &v) == -ENOENT;
    CHECK(absent > 90);
    ERR(bpfmaps_map_lookup_elem(fd, &k, &v), EINVAL);
    ERR(bpfmaps_map_update_elem(fd, &k, &v, ANY), EINVAL);
    ERR(bpfmaps_map_get_next_key(fd, NULL, &k), EOPNOTSUPP);
    EQ(bpfmaps_map_close(fd), 0);
}

/* A variable-length key: its length, then its bytes. */
struct str_key {
    uint32_t len;
    char s[12];
};

static struct str_key str(const char *s, uint32_t len) {
    struct str_key k = {len, {0}};
    memcpy(k.s, s, len);
    return k;
}

static void variable_length_keys(void) {
    int fd = bpfmaps_map_create(BPFMAPS_MAP_TYPE_QP_TRIE, "syms", 12, 4, 100, NULL);
    CHECK(fd >= 0);
    struct str_key k;
    uint32_t v = 1, out;
    k = str("abc", 3);
    EQ(bpfmaps_map_update_elem(fd, &k, &v, ANY), 0);
    k = str("ab\0", 3); /* "ab" and "ab\0" are different keys */
    v = 2;
    EQ(bpfmaps_map_update_elem(fd, &k, &v, ANY), 0);
    k = str("ab", 2);
    v = 3;
    EQ(bpfmaps_map_update_elem(fd, &k, &v, ANY), 0);
    EQ(bpfmaps_map_lookup_elem(fd, &k, &out), 0);
    EQ(out, 3);
    k = str("ab\0", 3);
    EQ(bpfmaps_map_lookup_elem(fd, &k, &out), 0);
    EQ(out, 2);
    k = str("", 0);
    ERR(bpfmaps_map_lookup_elem(fd, &k, &out), EINVAL);
    k.len = 13;
    ERR(bpfmaps_map_lookup_elem(fd, &k, &out), EINVAL);

    /* Byte order: "ab" < "ab\0" < "abc"; the tail past a key is zeroed. */
    struct str_key a, b;
    memset(&a, 0xff, sizeof(a));
    EQ(bpfmaps_map_get_next_key(fd, NULL, &a), 0);
    EQ(a.len, 2);
    CHECK(memcmp(a.s, "ab\0\0\0", 5) == 0);
    EQ(bpfmaps_map_get_next_key(fd, &a, &b), 0);
    EQ(b.len, 3);
    CHECK(memcmp(b.s, "ab\0", 3) == 0);
    EQ(bpfmaps_map_get_next_key(fd, &b, &a), 0);
    CHECK(a.len == 3 && memcmp(a.s, "abc", 3) == 0);
    ERR(bpfmaps_map_get_next_key(fd, &a, &b), ENOENT);

    /* Batches hold keys in the same layout, 4 + key_size bytes each. */
    struct str_key keys[4] = {str("x", 1), str("yy", 2), str("zzz", 3), str("ab", 2)};
    uint32_t values[4] = {7, 8, 9, 10}, count = 4;
    struct bpfmaps_map_batch_opts opts = {.sz = sizeof(opts), .elem_flags = NOEXIST};
    ERR(bpfmaps_map_update_batch(fd, keys, values, &count, &opts), EEXIST);
    EQ(count, 3);
    uint32_t token;
    count = 4;
    memset(keys, 0, sizeof(keys));
    EQ(bpfmaps_map_lookup_batch(fd, NULL, &token, keys, values, &count, NULL), 0);
    EQ(count, 4);
    CHECK(keys[3].len == 1 && keys[3].s[0] == 'x');
    count = 4;
    ERR(bpfmaps_map_lookup_batch(fd, &token, &token, keys, values, &count, NULL), ENOENT);
    EQ(count, 2);
    CHECK(keys[1].len == 3 && memcmp(keys[1].s, "zzz", 3) == 0);
    EQ(values[1], 9);
    EQ(bpfmaps_map_close(fd), 0);
}

struct range {
    uint64_t first, last;
};

static void range_keys(void) {
    struct bpfmaps_map_create_opts opts = {.sz = sizeof(opts), .map_flags = NO_PREALLOC};
    int fd = bpfmaps_map_create(BPFMAPS_MAP_TYPE_MAPLE_TREE, "vmas", sizeof(struct range), 8, 100, &opts);
    CHECK(fd >= 0);
    struct range r = {0x1000, 0x1fff};
    uint64_t v = 5, out;
    EQ(bpfmaps_map_update_elem(fd, &r, &v, NOEXIST), 0);
    struct range at = {0x1800, 0x1800};
    EQ(bpfmaps_map_lookup_elem(fd, &at, &out), 0);
    EQ(out, 5);
    at = (struct range){0x2000, 0x2000};
    ERR(bpfmaps_map_lookup_elem(fd, &at, &out), ENOENT);
    struct range bad = {9, 3};
    ERR(bpfmaps_map_update_elem(fd, &bad, &v, ANY), EINVAL);
    struct range got;
    EQ(bpfmaps_map_get_next_key(fd, NULL, &got), 0);
    CHECK(got.first == r.first && got.last == r.last);
    EQ(bpfmaps_map_delete_elem(fd, &r), 0);
    ERR(bpfmaps_map_get_next_key(fd, NULL, &got), ENOENT);
    EQ(bpfmaps_map_close(fd), 0);
}

static void other_families(void) {
    /* The LRU map evicts instead of answering E2BIG. */
    int fd = bpfmaps_map_create(BPFMAPS_MAP_TYPE_LRU_HASH, "lru", 4, 4, 8, NULL);
    CHECK(fd >= 0);
    for (uint32_t k = 0; k < 100; k++)
        EQ(bpfmaps_map_update_elem(fd, &k, &k, ANY), 0);
    EQ(bpfmaps_map_close(fd), 0);

    /* The stack trace map is filled by get_stackid, never updated. */
    fd = bpfmaps_map_create(BPFMAPS_MAP_TYPE_STACK_TRACE, "stacks", 4, 8 * 4, 64, NULL);
    CHECK(fd >= 0);
    uint32_t id = 0;
    uint64_t ips[4] = {1, 2, 3, 4};
    ERR(bpfmaps_map_update_elem(fd, &id, ips, ANY), EINVAL);
    ERR(bpfmaps_map_lookup_elem(fd, &id, ips), ENOENT);
    EQ(bpfmaps_map_close(fd), 0);

    fd = bpfmaps_map_create(BPFMAPS_MAP_TYPE_TST, "tst", 8, 4, 8, NULL);
    CHECK(fd >= 0);
    EQ(bpfmaps_map_close(fd), 0);
}

int main(void) {
    hash_map_single_calls();
    creation_and_handles();
    batches();
    lpm_tries();
    keyless_bloom_filter();
    variable_length_keys();
    range_keys();
    other_families();
    DONE();
}
