/* Threads through the C API: readers beside a writer see no torn value
 * and no value older than a completed update; stable LPM routes are never
 * missed while others churn; a handle closed under readers gives them
 * EBADF, never a crash. */
#include <bpfmaps.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "check.h"

#define KEYS 64
#define ROUNDS 2000
#define READERS 2

struct value {
    uint64_t version;
    uint64_t check; /* version ^ key * odd: a torn value fails it */
};

static uint64_t check_of(uint32_t key, uint64_t version) {
    return version ^ (key * 0x9E3779B97F4A7C15ull);
}

static int map;
static _Atomic uint64_t completed[KEYS]; /* the last version whose update returned */
static atomic_int writing = 1;
static atomic_int bad;

static void *writer(void *arg) {
    (void)arg;
    for (uint64_t version = 1; version <= ROUNDS; version++) {
        for (uint32_t key = 0; key < KEYS; key++) {
            struct value v = {version, check_of(key, version)};
            if (bpfmaps_map_update_elem(map, &key, &v, 0) != 0)
                atomic_fetch_add(&bad, 1);
            atomic_store_explicit(&completed[key], version, memory_order_release);
        }
    }
    atomic_store(&writing, 0);
    return NULL;
}

static void *reader(void *arg) {
    uint32_t seed = (uint32_t)(uintptr_t)arg;
    while (atomic_load(&writing)) {
        seed = seed * 1103515245 + 12345;
        uint32_t key = (seed >> 8) % KEYS;
        uint64_t floor = atomic_load_explicit(&completed[key], memory_order_acquire);
        struct value v;
        int err = bpfmaps_map_lookup_elem(map, &key, &v);
        if (err == -ENOENT && floor == 0)
            continue;
        if (err != 0 || v.check != check_of(key, v.version) || v.version < floor)
            atomic_fetch_add(&bad, 1);
    }
    return NULL;
}

static void readers_beside_a_writer(void) {
    map = bpfmaps_map_create(BPFMAPS_MAP_TYPE_HASH, "shared", 4, sizeof(struct value), KEYS, NULL);
    CHECK(map >= 0);
    pthread_t w, r[READERS];
    for (uintptr_t i = 0; i < READERS; i++)
        pthread_create(&r[i], NULL, reader, (void *)(i + 1));
    pthread_create(&w, NULL, writer, NULL);
    pthread_join(w, NULL);
    for (int i = 0; i < READERS; i++)
        pthread_join(r[i], NULL);
    EQ(atomic_load(&bad), 0);
    EQ(bpfmaps_map_close(map), 0);
}

struct lpm_v4 {
    uint32_t prefixlen;
    uint8_t addr[4];
};

static void *lpm_churn(void *arg) {
    (void)arg;
    for (int round = 0; round < ROUNDS; round++) {
        for (uint8_t i = 0; i < 32; i++) {
            struct lpm_v4 k = {24, {10, 1, i, 0}};
            uint32_t v = 1000 + i;
            if (bpfmaps_map_update_elem(map, &k, &v, 0) != 0)
                atomic_fetch_add(&bad, 1);
        }
        for (uint8_t i = 0; i < 32; i++) {
            struct lpm_v4 k = {24, {10, 1, i, 0}};
            if (bpfmaps_map_delete_elem(map, &k) != 0)
                atomic_fetch_add(&bad, 1);
        }
    }
    atomic_store(&writing, 0);
    return NULL;
}

static void *lpm_reader(void *arg) {
    uint32_t seed = (uint32_t)(uintptr_t)arg;
    while (atomic_load(&writing)) {
        seed = seed * 1103515245 + 12345;
        uint8_t i = (seed >> 8) % 64;
        /* 10.0.0.0/8 -> 8 and 10.1.0.0/16 -> 16 stay; 10.1.i.0/24 churn. */
        struct lpm_v4 k = {32, {10, 1, i, 7}};
        uint32_t v = 0;
        int err = bpfmaps_map_lookup_elem(map, &k, &v);
        int ok = err == 0 && (v == 16 || (i < 32 && v == 1000u + i));
        if (!ok)
            atomic_fetch_add(&bad, 1);
    }
    return NULL;
}

static void stable_routes_never_missed(void) {
    struct bpfmaps_map_create_opts opts = {.sz = sizeof(opts), .map_flags = 1};
    map = bpfmaps_map_create(BPFMAPS_MAP_TYPE_LPM_TRIE, "routes", 8, 4, 1000, &opts);
    CHECK(map >= 0);
    struct lpm_v4 k = {8, {10, 0, 0, 0}};
    uint32_t v = 8;
    EQ(bpfmaps_map_update_elem(map, &k, &v, 0), 0);
    k = (struct lpm_v4){16, {10, 1, 0, 0}};
    v = 16;
    EQ(bpfmaps_map_update_elem(map, &k, &v, 0), 0);
    atomic_store(&writing, 1);
    atomic_store(&bad, 0);
    pthread_t w, r[READERS];
    for (uintptr_t i = 0; i < READERS; i++)
        pthread_create(&r[i], NULL, lpm_reader, (void *)(i + 7));
    pthread_create(&w, NULL, lpm_churn, NULL);
    pthread_join(w, NULL);
    for (int i = 0; i < READERS; i++)
        pthread_join(r[i], NULL);
    EQ(atomic_load(&bad), 0);
    EQ(bpfmaps_map_close(map), 0);
}

static atomic_int closed_seen;

static void *until_closed(void *arg) {
    (void)arg;
    uint32_t key = 1;
    uint64_t v;
    for (;;) {
        int err = bpfmaps_map_lookup_elem(map, &key, &v);
        if (err == -EBADF) {
            atomic_fetch_add(&closed_seen, 1);
            return NULL;
        }
        if (err != 0 || v != 42)
            atomic_fetch_add(&bad, 1);
    }
}

static void closed_under_readers(void) {
    for (int round = 0; round < 20; round++) {
        map = bpfmaps_map_create(BPFMAPS_MAP_TYPE_HASH, "closing", 4, 8, 16, NULL);
        CHECK(map >= 0);
        uint32_t key = 1;
        uint64_t v = 42;
        EQ(bpfmaps_map_update_elem(map, &key, &v, 0), 0);
        atomic_store(&bad, 0);
        pthread_t r[READERS];
        for (int i = 0; i < READERS; i++)
            pthread_create(&r[i], NULL, until_closed, NULL);
        for (volatile int spin = 0; spin < 10000; spin++)
            ;
        EQ(bpfmaps_map_close(map), 0);
        for (int i = 0; i < READERS; i++)
            pthread_join(r[i], NULL);
        EQ(atomic_load(&bad), 0);
    }
    EQ(atomic_load(&closed_seen), 20 * READERS);
}

int main(void) {
    readers_beside_a_writer();
    stable_routes_never_missed();
    closed_under_readers();
    DONE();
}
