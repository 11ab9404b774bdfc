/*
 * bench.c - driver measuring the reference C poptrie (pixos/poptrie) on the
 * bpfmaps LPM data set (../shared/data/lpm/prefixes_ipv{4,6}.txt.gz, or -f).
 *
 * Usage: bench [-6] [-1 sz1] [-0 sz0] [-f prefixes.txt.gz] [-V]
 *   -6       IPv6 mode (poptrie6_*), default IPv4
 *   -1 sz1   log2 #internal nodes passed to poptrie_init (default 19)
 *   -0 sz0   log2 #leaves passed to poptrie_init (default 22)
 *   -V       verify all 2^20 addresses of each set (default: first 65536)
 *
 * Next hop of prefix i (file order, 0-based) = (i % NH_MOD) + 1, passed to
 * poptrie as (void *)(uintptr_t)nh.  NH_MOD is a compile-time constant
 * (-DNH_MOD=...): the stock library has a 4096-entry FIB table (slot 0 = "no
 * route"), so it allows at most 4095 distinct next hops.
 *
 * Address sets (2^20 each), one splitmix64 stream seeded with 7:
 *   random: N draws, addr = high 32 bits of each draw (IPv6: 2 draws = 128 bits)
 *   inside: N times: p = draw % nprefixes; host = next draw(s); addr =
 *           prefix[p] | (host & ~mask(len[p]))
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "buddy.h"
#include "poptrie.h"

#ifndef NH_MOD
#define NH_MOD 4095
#endif

#define NADDR (1u << 20)
#define REPS 5

typedef __uint128_t u128;

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* splitmix64 */
static uint64_t sm_state;
static uint64_t sm_next(void)
{
    uint64_t z = (sm_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static long rss_kb(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &res) != 2)
            res = 0;
        fclose(f);
    }
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}

/* ------------------------------------------------------------------ */
/* Reference: hash table (masked prefix, len) -> next hop             */
/* ------------------------------------------------------------------ */
struct rent {
    u128 key;      /* masked prefix */
    int32_t len;   /* -1 = empty */
    uint32_t nh;
};
static struct rent *rtab;
static uint64_t rmask;
static int present[129];   /* lengths present, longest first */
static int npresent;
static int last_ref_len;   /* length of the prefix matched by the last ref_lookup (-1: none) */

static uint64_t rhash(u128 key, int len)
{
    return mix64((uint64_t)key ^ mix64((uint64_t)(key >> 64) + (uint64_t)len * 0x9e3779b97f4a7c15ULL));
}

static void ref_init(size_t n)
{
    size_t cap = 1;
    while (cap < 2 * n)
        cap <<= 1;
    rtab = malloc(cap * sizeof(*rtab));
    for (size_t i = 0; i < cap; i++)
        rtab[i].len = -1;
    rmask = cap - 1;
}

static void ref_insert(u128 key, int len, uint32_t nh)
{
    uint64_t h = rhash(key, len) & rmask;
    while (rtab[h].len >= 0) {
        if (rtab[h].len == len && rtab[h].key == key) {
            rtab[h].nh = nh;
            return;
        }
        h = (h + 1) & rmask;
    }
    rtab[h].key = key;
    rtab[h].len = len;
    rtab[h].nh = nh;
}

static u128 mask_of(int len, int bits)
{
    if (len == 0)
        return 0;
    u128 all = ~(u128)0;
    if (bits == 32)
        all = (u128)0xffffffffu;
    return (all << (bits - len)) & all;
}

static uint32_t ref_lookup(u128 addr, int bits)
{
    for (int j = 0; j < npresent; j++) {
        int len = present[j];
        u128 key = addr & mask_of(len, bits);
        uint64_t h = rhash(key, len) & rmask;
        while (rtab[h].len >= 0) {
            if (rtab[h].len == len && rtab[h].key == key) {
                last_ref_len = len;
                return rtab[h].nh;
            }
            h = (h + 1) & rmask;
        }
    }
    last_ref_len = -1;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Loading                                                            */
/* ------------------------------------------------------------------ */
static size_t load(const char *path, int v6, u128 **pfx_out, uint8_t **len_out)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "gzip -dc '%s'", path);
    FILE *f = popen(cmd, "r");
    if (!f) {
        perror("popen");
        exit(1);
    }
    size_t cap = 1 << 20, n = 0;
    u128 *pfx = malloc(cap * sizeof(*pfx));
    uint8_t *len = malloc(cap);
    char line[256];
    while (fgets(line, sizeof(line), f)) {
        char *nl = strpbrk(line, "\r\n");
        if (nl)
            *nl = 0;
        if (!line[0])
            continue;
        char *slash = strchr(line, '/');
        if (!slash) {
            fprintf(stderr, "bad line: %s\n", line);
            exit(1);
        }
        *slash = 0;
        int l = atoi(slash + 1);
        u128 a = 0;
        if (v6) {
            unsigned char b[16];
            if (inet_pton(AF_INET6, line, b) != 1) {
                fprintf(stderr, "bad v6: %s\n", line);
                exit(1);
            }
            for (int k = 0; k < 16; k++)
                a = (a << 8) | b[k];
        } else {
            struct in_addr in;
            if (inet_pton(AF_INET, line, &in) != 1) {
                fprintf(stderr, "bad v4: %s\n", line);
                exit(1);
            }
            a = ntohl(in.s_addr);
        }
        if (n == cap) {
            cap *= 2;
            pfx = realloc(pfx, cap * sizeof(*pfx));
            len = realloc(len, cap);
        }
        pfx[n] = a;
        len[n] = (uint8_t)l;
        n++;
    }
    pclose(f);
    *pfx_out = pfx;
    *len_out = len;
    return n;
}

/* ------------------------------------------------------------------ */
/* Memory accounting                                                  */
/* ------------------------------------------------------------------ */
static uint64_t buddy_free_units(struct buddy *bs)
{
    uint64_t f = 0;
    for (int lv = 0; lv < bs->level; lv++) {
        u32 a = bs->buddy[lv];
        while (a != 0xffffffffu) {
            f += 1ULL << lv;
            a = *(u32 *)((char *)bs->blocks + (size_t)bs->bsz * a);
        }
    }
    return f;
}

static void walk_node(struct poptrie *pt, u32 inode, uint64_t *nn, uint64_t *nl)
{
    poptrie_node_t *n = &pt->nodes[inode];
    (*nn)++;
    *nl += (uint64_t)__builtin_popcountll(n->leafvec);
    int c = __builtin_popcountll(n->vector);
    for (int k = 0; k < c; k++)
        walk_node(pt, n->base1 + k, nn, nl);
}

static uint64_t count_radix(struct radix_node *r)
{
    if (!r)
        return 0;
    return 1 + count_radix(r->left) + count_radix(r->right);
}

static void mem_report(struct poptrie *pt, int sz1, int sz0, size_t nprefix)
{
    uint64_t dirb = sizeof(u32) << POPTRIE_S;
    uint64_t nodes_cfg = (uint64_t)sizeof(poptrie_node_t) << sz1;
    uint64_t leaves_cfg = (uint64_t)sizeof(poptrie_leaf_t) << sz0;
    uint64_t fibb = (uint64_t)sizeof(struct poptrie_fib_entry) * pt->fib.sz;
    uint64_t buddy_meta = 0;
    int szs[2] = {sz1, sz0};
    for (int k = 0; k < 2; k++)
        buddy_meta += (4ULL << szs[k]) + (((1ULL << szs[k]) + 7) / 8) + 4ULL * szs[k];
    uint64_t cfg = nodes_cfg + leaves_cfg + 2 * dirb + fibb + buddy_meta;

    uint64_t nodes_used = (1ULL << sz1) - buddy_free_units(pt->cnodes);
    uint64_t leaves_used = (1ULL << sz0) - buddy_free_units(pt->cleaves);

    uint64_t live_nodes = 0, live_leaves = 0, dir_ptr = 0, dir_leaf = 0;
    for (u32 i = 0; i < (1u << POPTRIE_S); i++) {
        if (pt->dir[i] & (1u << 31)) {
            dir_leaf++;
        } else {
            dir_ptr++;
            walk_node(pt, pt->dir[i], &live_nodes, &live_leaves);
        }
    }
    uint64_t fib_used = 0;
    for (int i = 0; i < pt->fib.sz; i++)
        if (pt->fib.entries[i].refs > 0)
            fib_used++;

    uint64_t used_buddy = dirb + nodes_used * sizeof(poptrie_node_t)
                          + leaves_used * sizeof(poptrie_leaf_t);
    uint64_t used_live = dirb + live_nodes * sizeof(poptrie_node_t)
                         + live_leaves * sizeof(poptrie_leaf_t);
    uint64_t radix = count_radix(pt->radix);

    printf("mem.config_sz1_sz0             %d %d\n", sz1, sz0);
    printf("mem.configured_total_bytes     %llu  (nodes %llu + leaves %llu + dir %llu + altdir %llu + fib %llu + buddy meta %llu)\n",
           (unsigned long long)cfg, (unsigned long long)nodes_cfg,
           (unsigned long long)leaves_cfg, (unsigned long long)dirb,
           (unsigned long long)dirb, (unsigned long long)fibb,
           (unsigned long long)buddy_meta);
    printf("mem.dir_entries leaf/ptr       %llu %llu\n",
           (unsigned long long)dir_leaf, (unsigned long long)dir_ptr);
    printf("mem.buddy_alloc nodes/leaves   %llu %llu  (of %llu %llu)\n",
           (unsigned long long)nodes_used, (unsigned long long)leaves_used,
           1ULL << sz1, 1ULL << sz0);
    printf("mem.live nodes/leaves          %llu %llu\n",
           (unsigned long long)live_nodes, (unsigned long long)live_leaves);
    printf("mem.used_buddy_bytes           %llu  (dir + buddy-allocated nodes*24 + leaves*2)  %.3f B/prefix\n",
           (unsigned long long)used_buddy, (double)used_buddy / nprefix);
    printf("mem.used_live_bytes            %llu  (dir + reachable nodes*24 + leaves*2)  %.3f B/prefix\n",
           (unsigned long long)used_live, (double)used_live / nprefix);
    printf("mem.fib_table_bytes            %llu  (%llu slots in use)\n",
           (unsigned long long)fibb, (unsigned long long)fib_used);
    printf("mem.rib_radix_nodes            %llu  x %zu B = %llu bytes (control-plane RIB, not in lookup path)\n",
           (unsigned long long)radix, sizeof(struct radix_node),
           (unsigned long long)(radix * sizeof(struct radix_node)));
}

/* ------------------------------------------------------------------ */
/* Lookup timing                                                      */
/* ------------------------------------------------------------------ */
static uint64_t checksum;

/* Prints the best and median of the REPS timings t (ns/lookup). */
static void report(const char *name, const double *t)
{
    double s[REPS];
    memcpy(s, t, sizeof(s));
    qsort(s, REPS, sizeof(double), cmp_double);
    printf("lookup.%-7s best %.3f  median %.3f ns/lookup   (reps:", name, s[0], s[REPS / 2]);
    for (int r = 0; r < REPS; r++)
        printf(" %.3f", t[r]);
    printf(")\n");
}

static void time_v4(struct poptrie *pt, const char *name, const u32 *addrs)
{
    double t[REPS];
    for (int r = 0; r < REPS; r++) {
        uint64_t sum = 0;
        double t0 = now_ns();
        for (u32 i = 0; i < NADDR; i++)
            sum += (uintptr_t)poptrie_lookup(pt, addrs[i]);
        double t1 = now_ns();
        t[r] = (t1 - t0) / NADDR;
        checksum += sum;
    }
    report(name, t);
}

static void time_v6(struct poptrie *pt, const char *name, const u128 *addrs)
{
    double t[REPS];
    for (int r = 0; r < REPS; r++) {
        uint64_t sum = 0;
        double t0 = now_ns();
        for (u32 i = 0; i < NADDR; i++)
            sum += (uintptr_t)poptrie6_lookup(pt, addrs[i]);
        double t1 = now_ns();
        t[r] = (t1 - t0) / NADDR;
        checksum += sum;
    }
    report(name, t);
}

int main(int argc, char **argv)
{
    int v6 = 0, sz1 = 19, sz0 = 22, verify_all = 0, opt;
    const char *path = NULL;
    while ((opt = getopt(argc, argv, "61:0:f:V")) != -1) {
        switch (opt) {
        case '6': v6 = 1; break;
        case '1': sz1 = atoi(optarg); break;
        case '0': sz0 = atoi(optarg); break;
        case 'f': path = optarg; break;
        case 'V': verify_all = 1; break;
        default:
            fprintf(stderr, "usage: %s [-6] [-1 sz1] [-0 sz0] [-f file] [-V]\n", argv[0]);
            return 2;
        }
    }
    if (!path)
        path = v6 ? "../shared/data/lpm/prefixes_ipv6.txt.gz"
                  : "../shared/data/lpm/prefixes_ipv4.txt.gz";
    int bits = v6 ? 128 : 32;

    u128 *pfx;
    uint8_t *plen;
    size_t n = load(path, v6, &pfx, &plen);
    printf("file %s\nprefixes %zu  family %s  NH_MOD %d  (next hop of prefix i = (i %% %d) + 1)\n",
           path, n, v6 ? "ipv6" : "ipv4", NH_MOD, NH_MOD);

    /* reference */
    ref_init(n);
    int seen[129] = {0};
    for (size_t i = 0; i < n; i++) {
        ref_insert(pfx[i] & mask_of(plen[i], bits), plen[i], (uint32_t)(i % NH_MOD) + 1);
        seen[plen[i]] = 1;
    }
    for (int l = bits; l >= 0; l--)
        if (seen[l])
            present[npresent++] = l;

    /* build */
    long rss0 = rss_kb();
    struct poptrie *pt = poptrie_init(NULL, sz1, sz0);
    if (!pt) {
        fprintf(stderr, "poptrie_init failed\n");
        return 1;
    }
    long rss1 = rss_kb();
    size_t fails = 0;
    double t0 = now_ns();
    if (v6) {
        for (size_t i = 0; i < n; i++) {
            uintptr_t nh = (i % NH_MOD) + 1;
            if (poptrie6_route_add(pt, pfx[i], plen[i], (void *)nh) != 0)
                fails++;
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            uintptr_t nh = (i % NH_MOD) + 1;
            if (poptrie_route_add(pt, (u32)pfx[i], plen[i], (void *)nh) != 0)
                fails++;
        }
    }
    double t1 = now_ns();
    long rss2 = rss_kb();
    printf("build.ms                       %.1f  (%zu x poptrie%s_route_add, file order; %.1f ns/insert)\n",
           (t1 - t0) / 1e6, n, v6 ? "6" : "", (t1 - t0) / n);
    printf("build.route_add_failures       %zu\n", fails);
    printf("rss.kB before_init/after_init/after_build  %ld %ld %ld\n", rss0, rss1, rss2);
    mem_report(pt, sz1, sz0, n);

    /* address sets */
    sm_state = 7;
    size_t asz = v6 ? sizeof(u128) : sizeof(u32);
    void *rnd = malloc(NADDR * asz), *ins = malloc(NADDR * asz);
    for (u32 i = 0; i < NADDR; i++) {
        if (v6) {
            u128 hi = sm_next(), lo = sm_next();
            ((u128 *)rnd)[i] = (hi << 64) | lo;
        } else {
            ((u32 *)rnd)[i] = (u32)(sm_next() >> 32);
        }
    }
    for (u32 i = 0; i < NADDR; i++) {
        size_t p = sm_next() % n;
        u128 host;
        if (v6) {
            u128 hi = sm_next(), lo = sm_next();
            host = (hi << 64) | lo;
        } else {
            host = (u32)(sm_next() >> 32);
        }
        u128 m = mask_of(plen[p], bits);
        u128 a = (pfx[p] & m) | (host & ~m);
        if (v6)
            ((u128 *)ins)[i] = a;
        else
            ((u32 *)ins)[i] = (u32)a;
    }

    /* verification */
    u32 nver = verify_all ? NADDR : 65536;
    for (int set = 0; set < 2; set++) {
        void *A = set ? ins : rnd;
        size_t mism = 0, hits = 0, mism_by_len[130] = {0};
        for (u32 i = 0; i < nver; i++) {
            u128 a = v6 ? ((u128 *)A)[i] : ((u32 *)A)[i];
            uint32_t exp = ref_lookup(a, bits);
            uintptr_t got = v6 ? (uintptr_t)poptrie6_lookup(pt, a)
                               : (uintptr_t)poptrie_lookup(pt, (u32)a);
            if (exp)
                hits++;
            if (got != exp) {
                if (mism < 5) {
                    if (!v6)
                        fprintf(stderr, "MISMATCH %s[%u] %u.%u.%u.%u exp %u got %lu\n",
                                set ? "inside" : "random", i, (u32)(a >> 24) & 255,
                                (u32)(a >> 16) & 255, (u32)(a >> 8) & 255, (u32)a & 255,
                                exp, (unsigned long)got);
                    else
                        fprintf(stderr, "MISMATCH %s[%u] %016llx%016llx exp %u got %lu\n",
                                set ? "inside" : "random", i,
                                (unsigned long long)(a >> 64), (unsigned long long)a,
                                exp, (unsigned long)got);
                }
                mism++;
                mism_by_len[last_ref_len + 1]++;
            }
        }
        printf("verify.%-7s checked %u  mismatches %zu  (reference matched a prefix for %zu)\n",
               set ? "inside" : "random", nver, mism, hits);
        if (mism) {
            printf("verify.%-7s mismatches by expected prefix length:", set ? "inside" : "random");
            for (int l = 0; l < 130; l++)
                if (mism_by_len[l])
                    printf(" /%d:%zu", l - 1, mism_by_len[l]);
            printf("\n");
        }
    }

    /* timing */
    if (v6) {
        time_v6(pt, "random", rnd);
        time_v6(pt, "inside", ins);
    } else {
        time_v4(pt, "random", rnd);
        time_v4(pt, "inside", ins);
    }
    printf("checksum %llu\n", (unsigned long long)checksum);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("maxrss.kB %ld\n", ru.ru_maxrss);
    /* no poptrie_release: process exits */
    return 0;
}
