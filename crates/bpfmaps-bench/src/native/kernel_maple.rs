//! The Linux kernel's own maple tree (`lib/maple_tree.c`), built in
//! userspace from Debian's `linux-source-6.12` package and run as separate
//! processes: a native peer for the range-map benchmarks.
//!
//! ## What is built, and from where
//! The kernel tests the maple tree in userspace with its radix-tree test
//! harness, `tools/testing/radix-tree`: its `maple` program `#include`s
//! `lib/maple_tree.c` and `lib/test_maple_tree.c` and links them against
//! small userspace stand-ins for the kernel (`tools/testing/shared`,
//! `tools/lib`, and liburcu for RCU). `lib/test_maple_tree.c` holds the
//! maple tree authors' benchmarks, each under `#if defined(BENCH_...)`;
//! when one is defined, `maple_tree_seed()` runs only that benchmark and
//! the program's `main` skips the rest of the test suite. So one binary
//! is built per benchmark ([`Shape`]), each with one `-DBENCH_...`.
//!
//! [`build`] does this at bench time, into a cache directory (by default
//! `target/kernel-maple/`, [`default_cache_dir`]):
//! 1. it extracts the few files the harness needs ([`MEMBERS`]) from
//!    `/usr/src/linux-source-6.12.tar.xz` into `src/` (once; again only
//!    if the tarball or the recipe below changes);
//! 2. it builds the harness's shared objects with its own `Makefile`,
//!    its `CFLAGS` replaced by [`CFLAGS`]: `-O2` instead of `-Og`, and
//!    without `-fsanitize=address,undefined` (nor `-g`);
//! 3. for each shape it compiles a copy of `radix-tree/maple.c` without its
//!    `#define CONFIG_DEBUG_MAPLE_TREE` line, so the tree runs as a
//!    production kernel builds it (no `MT_WARN_ON`/`MAS_WARN_ON` checks on
//!    the hot paths), with the shape's `-DBENCH_...`, and links it with
//!    [`STUBS_C`] into `bin/maple-SHAPE`. Binaries already there are kept.
//!
//! `maple.c` forces `CONFIG_DEBUG_MAPLE_TREE` on in its first lines, and
//! its own test code (compiled, though not run, in every shape) calls a
//! few test helpers that `lib/maple_tree.c` defines only under that option
//! (`mt_set_non_kernel`, `mt_nr_allocated`, `mas_get_slot`, ...).
//! [`STUBS_H`] declares them (force-included, so the compiler sees
//! prototypes) and [`STUBS_C`] defines them as stubs that abort: no
//! benchmark calls them, and a run that did would fail loudly. Those two
//! files are ours and hold no kernel code.
//!
//! ## Why the kernel's code is never in this repository
//! `lib/maple_tree.c` and its harness are GPL-2.0. They are read only from
//! the installed Debian package, extracted and built under the cargo
//! target directory (which is not committed), and run as separate
//! programs: nothing of them is copied into the repository, nor linked
//! into the benchmark binary. This module holds only the recipe, the
//! stubs, and the operation counts.
//!
//! ## What a time includes
//! [`KernelMaple::run`] times the process whole, from spawn to exit, as
//! the maple tree's authors do (`time ./maple`). Besides the benchmark's
//! loop that is: process start and dynamic linking, `maple_tree_init()`
//! (the node cache), building the shape's small tree (at most 500 stores),
//! destroying it, `rcu_barrier()`, and exit. The loops run for seconds, so
//! this is small, but it is in the time: [`Shape::ns_per_op`] divides the
//! whole time by the loop's operations ([`Shape::ops`]) and so slightly
//! overstates the cost of one.
//!
//! ## Installing it
//! ```sh
//! apt-get install -y linux-source-6.12 liburcu-dev
//! ```
//! Without them [`build`] returns an error saying so, and the test skips.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, UNIX_EPOCH};

/// The Debian package whose tarball is built.
pub const PACKAGE: &str = "linux-source-6.12";

/// What [`build`] says when the packages are not installed.
pub const NOT_INSTALLED: &str =
    "linux-source-6.12 not installed (apt-get install linux-source-6.12 liburcu-dev)";

/// Where Debian's package puts the kernel source.
const TARBALL: &str = "/usr/src/linux-source-6.12.tar.xz";

/// The tarball's top directory.
const TOP: &str = "linux-source-6.12";

/// The harness, under [`TOP`].
const HARNESS: &str = "tools/testing/radix-tree";

/// What is extracted from the tarball (under its `linux-source-6.12/`):
/// the harness and its userspace kernel stand-ins, and from the kernel
/// proper the maple tree, its test module, the XArray and radix tree
/// (linked by the harness), and the headers they include. Found with `-MD`
/// from a full build.
pub const MEMBERS: &[&str] = &[
    "tools/testing/radix-tree",
    "tools/testing/shared",
    "tools/include",
    "tools/arch",
    "tools/lib/slab.c",
    "tools/lib/find_bit.c",
    "tools/lib/bitmap.c",
    "tools/lib/hweight.c",
    "tools/lib/vsprintf.c",
    "lib/maple_tree.c",
    "lib/test_maple_tree.c",
    "lib/xarray.c",
    "lib/test_xarray.c",
    "lib/radix-tree.c",
    "lib/radix-tree.h",
    "lib/idr.c",
    "include/linux/maple_tree.h",
    "include/linux/xarray.h",
    "include/linux/radix-tree.h",
    "include/linux/idr.h",
    "include/linux/gfp_types.h",
    "include/linux/kconfig.h",
];

/// The harness's `CFLAGS` (`tools/testing/shared/shared.mk`: `-I../shared
/// -I. -I../../include -I../../../lib -g -Og -Wall -D_LGPL_SOURCE
/// -fsanitize=address -fsanitize=undefined`) with `-O2` for `-Og`, and
/// neither `-g` nor the sanitizers. Paths are relative to the harness.
pub const CFLAGS: &[&str] = &[
    "-I../shared",
    "-I.",
    "-I../../include",
    "-I../../../lib",
    "-O2",
    "-Wall",
    "-D_LGPL_SOURCE",
];

/// The harness's `LDLIBS`. (Its `LDFLAGS` are only the sanitizers.)
const LDLIBS: &[&str] = &["-lpthread", "-lurcu"];

/// The line of `radix-tree/maple.c` that [`build`]'s copy leaves out.
const DEBUG_DEFINE: &str = "#define CONFIG_DEBUG_MAPLE_TREE";

/// The copy of `maple.c` without [`DEBUG_DEFINE`], written beside it in
/// the cache (its `#include`s are relative).
const BENCH_SOURCE: &str = "bpfmaps-maple-bench.c";

/// Bump when the recipe changes in a way the stamp would not see.
const RECIPE: u32 = 1;

/// Prototypes of the test helpers that `lib/maple_tree.c` defines only
/// under `CONFIG_DEBUG_MAPLE_TREE`, as `radix-tree/maple.c` and
/// `lib/test_maple_tree.c` call them; force-included (`-include`) into the
/// copy of `maple.c` so that no call is an implicit declaration.
pub const STUBS_H: &str = r#"/* bpfmaps: prototypes of the maple tree's debug-only test helpers. */
#ifndef BPFMAPS_MAPLE_STUBS_H
#define BPFMAPS_MAPLE_STUBS_H
struct ma_state;
struct maple_enode;
void mt_set_non_kernel(unsigned int val);
void mt_set_callback(void (*callback)(void *));
void mt_set_private(void *private);
unsigned long mt_get_alloc_size(void);
void mt_zero_nr_tallocated(void);
unsigned int mt_nr_tallocated(void);
unsigned int mt_nr_allocated(void);
struct maple_enode *mas_get_slot(struct ma_state *mas, unsigned char offset);
#endif
"#;

/// Stubs for [`STUBS_H`]: only the test suite, which no benchmark build
/// runs, calls them; each aborts if called, so the run fails.
pub const STUBS_C: &str = r#"/* bpfmaps: stubs for the maple tree's debug-only test helpers. */
#include <stdio.h>
#include <stdlib.h>
#include "bpfmaps-stubs.h"

static void stub(const char *name)
{
	fprintf(stderr, "bpfmaps kernel-maple: test helper %s called in a benchmark build\n", name);
	abort();
}

void mt_set_non_kernel(unsigned int val) { (void)val; stub(__func__); }
void mt_set_callback(void (*callback)(void *)) { (void)callback; stub(__func__); }
void mt_set_private(void *private) { (void)private; stub(__func__); }
unsigned long mt_get_alloc_size(void) { stub(__func__); return 0; }
void mt_zero_nr_tallocated(void) { stub(__func__); }
unsigned int mt_nr_tallocated(void) { stub(__func__); return 0; }
unsigned int mt_nr_allocated(void) { stub(__func__); return 0; }
struct maple_enode *mas_get_slot(struct ma_state *mas, unsigned char offset)
{
	(void)mas;
	(void)offset;
	stub(__func__);
	return NULL;
}
"#;

/// One of the benchmarks in `lib/test_maple_tree.c` (`BENCH_...`): one
/// binary each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shape {
    /// `bench_slot_store`: two stores per iteration that rewrite slots of
    /// one leaf (a range is cut out and put back).
    SlotStore,
    /// `bench_node_store`: one store per iteration over a 16-wide range
    /// that spans several entries, so the leaf is rewritten.
    NodeStore,
    /// `bench_awalk`: `mas_empty_area_rev` (a gap search).
    Awalk,
    /// `bench_walk`: `mas_walk` to one index.
    Walk,
    /// `bench_load`: `mtree_load` of one index.
    Load,
    /// `bench_mt_for_each`: a full `mt_for_each` pass over 500 entries.
    MtForEach,
    /// `bench_mas_for_each`: a full `mas_for_each` pass over 500 entries
    /// (with gaps), under one RCU read lock.
    MasForEach,
    /// `bench_mas_prev`: a full `mas_prev` pass backwards over the same
    /// 500 entries.
    MasPrev,
    /// `bench_forking`: `__mt_dup` of a 135-entry tree, a store of every
    /// entry into the copy, and its destruction.
    Fork,
}

impl Shape {
    /// Every shape, in the source's order.
    pub const ALL: [Shape; 9] = [
        Shape::SlotStore,
        Shape::NodeStore,
        Shape::Awalk,
        Shape::Walk,
        Shape::Load,
        Shape::MtForEach,
        Shape::MasForEach,
        Shape::MasPrev,
        Shape::Fork,
    ];

    /// A short name (`slot-store`), also the binary's suffix.
    pub fn name(self) -> &'static str {
        match self {
            Shape::SlotStore => "slot-store",
            Shape::NodeStore => "node-store",
            Shape::Awalk => "awalk",
            Shape::Walk => "walk",
            Shape::Load => "load",
            Shape::MtForEach => "mt-for-each",
            Shape::MasForEach => "mas-for-each",
            Shape::MasPrev => "mas-prev",
            Shape::Fork => "fork",
        }
    }

    /// The macro that selects it in `lib/test_maple_tree.c`.
    pub fn define(self) -> &'static str {
        match self {
            Shape::SlotStore => "BENCH_SLOT_STORE",
            Shape::NodeStore => "BENCH_NODE_STORE",
            Shape::Awalk => "BENCH_AWALK",
            Shape::Walk => "BENCH_WALK",
            Shape::Load => "BENCH_LOAD",
            Shape::MtForEach => "BENCH_MT_FOR_EACH",
            Shape::MasForEach => "BENCH_MAS_FOR_EACH",
            Shape::MasPrev => "BENCH_MAS_PREV",
            Shape::Fork => "BENCH_FORK",
        }
    }

    /// What one operation is, for a report.
    pub fn op(self) -> &'static str {
        match self {
            Shape::SlotStore | Shape::NodeStore => "mtree_store_range",
            Shape::Awalk => "mas_empty_area_rev",
            Shape::Walk => "mas_walk",
            Shape::Load => "mtree_load",
            Shape::MtForEach => "entry visited by mt_for_each",
            Shape::MasForEach => "entry visited by mas_for_each",
            Shape::MasPrev => "entry visited by mas_prev",
            Shape::Fork => "fork (__mt_dup + store every entry + destroy)",
        }
    }

    /// The operations the kernel's benchmark function performs in its
    /// timed loop (not counting the stores that build its tree first).
    pub fn ops(self) -> u64 {
        match self {
            Shape::SlotStore => OPS_SLOT_STORE,
            Shape::NodeStore => OPS_NODE_STORE,
            Shape::Awalk => OPS_AWALK,
            Shape::Walk => OPS_WALK,
            Shape::Load => OPS_LOAD,
            Shape::MtForEach => OPS_MT_FOR_EACH,
            Shape::MasForEach => OPS_MAS_FOR_EACH,
            Shape::MasPrev => OPS_MAS_PREV,
            Shape::Fork => OPS_FORK,
        }
    }

    /// The whole process time divided by [`Shape::ops`]: the cost of one
    /// operation, overstated slightly by what else the time includes (see
    /// the module docs).
    pub fn ns_per_op(self, time: Duration) -> f64 {
        time.as_nanos() as f64 / self.ops() as f64
    }

    /// How many `MT_BUG_ON` checks the benchmark makes: with
    /// `CONFIG_DEBUG_MAPLE_TREE` off, `lib/test_maple_tree.c` counts each
    /// in `maple_tree_tests_run` and the program prints the count at exit,
    /// which [`KernelMaple::run`] checks. The iteration benchmarks check
    /// every entry they visit; the others check nothing.
    fn checks(self) -> u64 {
        match self {
            Shape::MtForEach | Shape::MasForEach | Shape::MasPrev => self.ops(),
            _ => 0,
        }
    }
}

// The operation counts, from linux-source-6.12's lib/test_maple_tree.c.

/// `bench_slot_store`: `count = 20000000`, two stores per iteration:
/// ```c
/// for (i = 0; i < count; i++) {
///         mtree_store_range(mt, brk, brk, NULL, GFP_KERNEL);
///         mtree_store_range(mt, brk_start, brk, xa_mk_value(brk), GFP_KERNEL);
/// }
/// ```
const OPS_SLOT_STORE: u64 = 2 * 20_000_000;

/// `bench_node_store`: `count = 20000000`, one store per iteration:
/// ```c
/// for (i = 0; i < count; i++) {
///         mtree_store_range(mt, overwrite,  overwrite + 15, xa_mk_value(overwrite), GFP_KERNEL);
///         overwrite += 5;
///         if (overwrite >= 135)
///                 overwrite = 76;
/// }
/// ```
const OPS_NODE_STORE: u64 = 20_000_000;

/// `bench_awalk`: `count = 50000000`, one gap search per iteration:
/// ```c
/// for (i = 0; i < count; i++) {
///         mas_empty_area_rev(&mas, 0, 2000, 10);
///         mas_reset(&mas);
/// }
/// ```
const OPS_AWALK: u64 = 50_000_000;

/// `bench_walk`: `count = 550000000`, one walk per iteration:
/// ```c
/// for (i = 0; i < count; i++) {
///         mas_walk(&mas);
///         mas_reset(&mas);
/// }
/// ```
const OPS_WALK: u64 = 550_000_000;

/// `bench_load`: `count = 550000000`, one load per iteration:
/// ```c
/// for (i = 0; i < count; i++)
///         mtree_load(mt, 1470);
/// ```
const OPS_LOAD: u64 = 550_000_000;

/// `bench_mt_for_each`: `count = 1000000` passes over the entries stored
/// by `for (i = 0; i < max; i += 5) mtree_store_range(mt, i, i + 4, ...)`
/// with `max = 2500`, so 500 a pass:
/// ```c
/// for (i = 0; i < count; i++) {
///         unsigned long j = 0;
///         mt_for_each(mt, entry, index, max) {
///                 MT_BUG_ON(mt, entry != xa_mk_value(j));
///                 j += 5;
///         }
///         index = 0;
/// }
/// ```
const OPS_MT_FOR_EACH: u64 = 1_000_000 * 500;

/// `bench_mas_for_each`: `count = 1000000` passes over 500 entries (one
/// every 5 below `max = 2500`; every sixth is one shorter, leaving a gap):
/// ```c
/// for (i = 0; i < count; i++) {
///         unsigned long j = 0;
///         mas_for_each(&mas, entry, max) {
///                 MT_BUG_ON(mt, entry != xa_mk_value(j));
///                 j += 5;
///         }
///         mas_set(&mas, 0);
/// }
/// ```
const OPS_MAS_FOR_EACH: u64 = 1_000_000 * 500;

/// `bench_mas_prev`: `count = 1000000` passes backwards over the same 500
/// entries:
/// ```c
/// for (i = 0; i < count; i++) {
///         unsigned long j = 2495;
///         mas_set(&mas, ULONG_MAX);
///         while ((entry = mas_prev(&mas, 0)) != NULL) {
///                 MT_BUG_ON(mt, entry != xa_mk_value(j));
///                 j -= 5;
///         }
/// }
/// ```
const OPS_MAS_PREV: u64 = 1_000_000 * 500;

/// `bench_forking`: `nr_fork = 80000` forks of a tree of `nr_entries + 1 =
/// 135` ranges (`mt_validate` is a no-op without the debug option):
/// ```c
/// for (i = 0; i < nr_fork; i++) {
///         ...
///         ret = __mt_dup(&mt, &newmt, GFP_KERNEL);
///         ...
///         mas_set(&newmas, 0);
///         mas_for_each(&newmas, val, ULONG_MAX)
///                 mas_store(&newmas, val);
///         mas_destroy(&newmas);
///         mt_validate(&newmt);
///         __mt_destroy(&newmt);
///         up_write(&newmt_lock);
/// }
/// ```
const OPS_FORK: u64 = 80_000;

/// The built binaries, one per shape.
#[derive(Debug, Clone)]
pub struct KernelMaple {
    bin_dir: PathBuf,
}

impl KernelMaple {
    /// The binary for `shape` (which may not have been built, see
    /// [`build_shapes`]).
    pub fn binary(&self, shape: Shape) -> PathBuf {
        self.bin_dir.join(format!("maple-{}", shape.name()))
    }

    /// Runs `shape`'s binary once as a separate process and returns its
    /// whole wall-clock time, from spawn to exit (see the module docs for
    /// what that includes). Fails if the binary is missing, exits with an
    /// error, or reports a failed check.
    pub fn run(&self, shape: Shape) -> Result<Duration, String> {
        let bin = self.binary(shape);
        if !bin.is_file() {
            return Err(format!("{}: not built", bin.display()));
        }
        let mut cmd = Command::new(&bin);
        cmd.current_dir(&self.bin_dir).stdin(Stdio::null());
        let start = Instant::now();
        let out = cmd
            .output()
            .map_err(|e| format!("{}: {e}", bin.display()))?;
        let time = start.elapsed();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            return Err(format!(
                "{} {}\n{}{}",
                bin.display(),
                out.status,
                tail(&stdout),
                tail(&stderr)
            ));
        }
        // With the debug option off `maple_tree_seed()` still prints its
        // tally of `MT_BUG_ON` checks, and a failed one prints "BUG at".
        let want = format!("maple_tree: {0} of {0} tests passed", shape.checks());
        if stdout.contains("BUG at") || !stdout.lines().any(|l| l.trim() == want) {
            return Err(format!(
                "{}: wanted {want:?} in its output:\n{}{}",
                bin.display(),
                tail(&stdout),
                tail(&stderr)
            ));
        }
        Ok(time)
    }
}

/// `target/kernel-maple/`: the cargo target directory holding the running
/// executable (the ancestor with cargo's `CACHEDIR.TAG`), or else the
/// system's temporary directory.
pub fn default_cache_dir() -> PathBuf {
    let target = std::env::current_exe().ok().and_then(|exe| {
        exe.ancestors()
            .skip(1)
            .find(|d| d.join("CACHEDIR.TAG").is_file())
            .map(Path::to_path_buf)
    });
    target
        .unwrap_or_else(std::env::temp_dir)
        .join("kernel-maple")
}

/// Extracts the kernel source into `cache_dir` if needed and builds every
/// shape's binary there (those not built already).
pub fn build(cache_dir: &Path) -> Result<KernelMaple, String> {
    build_shapes(cache_dir, &Shape::ALL)
}

/// [`build`] for some shapes only.
pub fn build_shapes(cache_dir: &Path, shapes: &[Shape]) -> Result<KernelMaple, String> {
    let tarball = Path::new(TARBALL);
    if !tarball.is_file() || !have_urcu() {
        return Err(NOT_INSTALLED.into());
    }
    let stamp = stamp(tarball)?;
    let src = extract(tarball, cache_dir, &stamp)?;
    let bin_dir = cache_dir.join("bin");
    if read(&bin_dir.join(STAMP)).as_deref() != Some(stamp.as_str()) {
        remove(&bin_dir)?;
        mkdir(&bin_dir)?;
        write(&bin_dir.join(STAMP), &stamp)?;
    }
    let maple = KernelMaple { bin_dir };
    let missing: Vec<Shape> = shapes
        .iter()
        .copied()
        .filter(|&s| !maple.binary(s).is_file())
        .collect();
    if missing.is_empty() {
        return Ok(maple);
    }

    let harness = src.join(HARNESS);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let objects = shared_objects(&harness, &cc)?;

    // Our stubs, and the copy of maple.c without the debug option.
    let stubs_h = maple.bin_dir.join("bpfmaps-stubs.h");
    let stubs_c = maple.bin_dir.join("bpfmaps-stubs.c");
    let stubs_o = maple.bin_dir.join("bpfmaps-stubs.o");
    write(&stubs_h, STUBS_H)?;
    write(&stubs_c, STUBS_C)?;
    run_cmd(
        Command::new(&cc)
            .args(["-O2", "-Wall", "-c"])
            .arg(&stubs_c)
            .arg("-o")
            .arg(&stubs_o),
        "compiling the stubs",
    )?;
    let maple_c = read(&harness.join("maple.c")).ok_or("radix-tree/maple.c missing")?;
    let kept: Vec<&str> = maple_c
        .lines()
        .filter(|l| l.trim_end() != DEBUG_DEFINE)
        .collect();
    if kept.len() + 1 != maple_c.lines().count() {
        return Err(format!(
            "radix-tree/maple.c: wanted one {DEBUG_DEFINE:?} line to leave out"
        ));
    }
    write(&harness.join(BENCH_SOURCE), &(kept.join("\n") + "\n"))?;

    // Two at a time: each compiles all of maple.c (some seconds).
    let queue = Mutex::new(missing);
    let errors = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                loop {
                    let Some(shape) = queue.lock().unwrap().pop() else {
                        return;
                    };
                    let built =
                        build_shape(&maple, shape, &harness, &cc, &objects, &stubs_h, &stubs_o);
                    if let Err(e) = built {
                        errors.lock().unwrap().push(e);
                    }
                }
            });
        }
    });
    let errors = errors.into_inner().unwrap();
    if errors.is_empty() {
        Ok(maple)
    } else {
        Err(errors.join("\n"))
    }
}

/// Compiles and links one shape's binary (to a temporary name, then
/// renamed, so a binary that is there is whole).
fn build_shape(
    maple: &KernelMaple,
    shape: Shape,
    harness: &Path,
    cc: &str,
    objects: &[String],
    stubs_h: &Path,
    stubs_o: &Path,
) -> Result<(), String> {
    let bin = maple.binary(shape);
    let obj = bin.with_extension("o");
    let partial = bin.with_extension("partial");
    run_cmd(
        Command::new(cc)
            .current_dir(harness)
            .args(CFLAGS)
            .arg(format!("-D{}", shape.define()))
            .arg("-include")
            .arg(stubs_h)
            .args(["-c", BENCH_SOURCE, "-o"])
            .arg(&obj),
        &format!("compiling maple.c for {}", shape.define()),
    )?;
    run_cmd(
        Command::new(cc)
            .current_dir(harness)
            .arg(&obj)
            .arg(stubs_o)
            .args(objects)
            .args(LDLIBS)
            .arg("-o")
            .arg(&partial),
        &format!("linking maple for {}", shape.define()),
    )?;
    std::fs::rename(&partial, &bin).map_err(|e| format!("{}: {e}", bin.display()))?;
    let _ = std::fs::remove_file(&obj);
    Ok(())
}

/// Builds the harness's objects other than `maple.o` with its own
/// Makefile and our [`CFLAGS`] (make rebuilds none that are there), and
/// returns their names. The list is the Makefile's `CORE_OFILES`.
fn shared_objects(harness: &Path, cc: &str) -> Result<Vec<String>, String> {
    let out = Command::new("make")
        .current_dir(harness)
        .args(["-s", "--no-print-directory", "--eval"])
        .arg("bpfmaps-core-ofiles: ; @echo $(CORE_OFILES)")
        .arg("bpfmaps-core-ofiles")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("make: {e} (is make installed?)"))?;
    if !out.status.success() {
        return Err(format!(
            "make (listing CORE_OFILES) {}\n{}",
            out.status,
            tail(&String::from_utf8_lossy(&out.stderr))
        ));
    }
    let objects: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|o| *o != "maple.o")
        .map(String::from)
        .collect();
    if objects.is_empty() {
        return Err("radix-tree/Makefile: empty CORE_OFILES".into());
    }
    run_cmd(
        Command::new("make")
            .current_dir(harness)
            .args(["-j2", "--no-print-directory"])
            .arg(format!("CC={cc}"))
            .arg(format!("CFLAGS={}", CFLAGS.join(" ")))
            .arg("LDFLAGS=")
            .args([
                "generated/map-shift.h",
                "generated/bit-length.h",
                "generated/autoconf.h",
            ])
            .args(&objects),
        "building the harness's shared objects",
    )?;
    Ok(objects)
}

/// The file in `src/` and `bin/` that says what they were made from.
const STAMP: &str = ".bpfmaps-stamp";

/// What the cache depends on: the tarball (path, size, time) and the
/// recipe (flags, stubs, version).
fn stamp(tarball: &Path) -> Result<String, String> {
    let meta = std::fs::metadata(tarball).map_err(|e| format!("{}: {e}", tarball.display()))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let mut recipe = format!("{RECIPE}|{}|{}|", CFLAGS.join(" "), LDLIBS.join(" "));
    recipe.push_str(STUBS_H);
    recipe.push_str(STUBS_C);
    for m in MEMBERS {
        recipe.push_str(m);
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} {} {mtime} recipe {RECIPE} {:016x}",
        tarball.display(),
        meta.len(),
        fnv1a(recipe.as_bytes())
    );
    Ok(s)
}

/// Extracts [`MEMBERS`] into `cache_dir/src` unless its stamp matches
/// (into a temporary directory first, renamed when whole), and returns
/// the source tree's top directory.
fn extract(tarball: &Path, cache_dir: &Path, stamp: &str) -> Result<PathBuf, String> {
    let src = cache_dir.join("src");
    if read(&src.join(STAMP)).as_deref() == Some(stamp) {
        return Ok(src.join(TOP));
    }
    let partial = cache_dir.join("src.partial");
    remove(&src)?;
    remove(&partial)?;
    mkdir(&partial)?;
    run_cmd(
        Command::new("tar")
            .arg("-xf")
            .arg(tarball)
            .arg("--no-same-owner")
            .arg("-C")
            .arg(&partial)
            .args(MEMBERS.iter().map(|m| format!("{TOP}/{m}"))),
        &format!("extracting {}", tarball.display()),
    )?;
    write(&partial.join(STAMP), stamp)?;
    std::fs::rename(&partial, &src).map_err(|e| format!("{}: {e}", src.display()))?;
    Ok(src.join(TOP))
}

/// Whether liburcu's header is installed (`liburcu-dev`: `urcu.h` in
/// `/usr/include` or its multiarch directory).
fn have_urcu() -> bool {
    let inc = Path::new("/usr/include");
    inc.join("urcu.h").is_file()
        || std::fs::read_dir(inc)
            .is_ok_and(|dir| dir.flatten().any(|e| e.path().join("urcu.h").is_file()))
}

/// Runs a build step, and on failure returns its output's last lines.
fn run_cmd(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{what}: {}\n{}{}",
        out.status,
        tail(&String::from_utf8_lossy(&out.stdout)),
        tail(&String::from_utf8_lossy(&out.stderr))
    ))
}

/// The last 30 lines of `s`.
fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    let mut t = lines[lines.len().saturating_sub(30)..].join("\n");
    if !t.is_empty() {
        t.push('\n');
    }
    t
}

/// 64-bit FNV-1a, for the recipe in the stamp.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

fn mkdir(path: &Path) -> Result<(), String> {
    std::fs::create_dir_all(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn remove(path: &Path) -> Result<(), String> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("{}: {e}", path.display()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_distinct_and_counted() {
        let mut names: Vec<_> = Shape::ALL.iter().map(|s| s.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Shape::ALL.len());
        for s in Shape::ALL {
            assert!(s.define().starts_with("BENCH_"));
            assert!(s.ops() > 0);
        }
        assert_eq!(
            Shape::Load.ns_per_op(Duration::from_secs(11)),
            20.0,
            "11 s over 550M loads"
        );
    }

    /// Builds the quickest shape (the fork benchmark) and runs it once;
    /// skipped where the packages are not installed.
    #[test]
    fn kernel_maple_builds_and_runs() {
        if !Path::new(TARBALL).is_file() || !have_urcu() {
            eprintln!("skipped: {NOT_INSTALLED}");
            return;
        }
        let shape = Shape::Fork;
        let maple = build_shapes(&default_cache_dir(), &[shape]).expect("build");
        let time = maple.run(shape).expect("run");
        eprintln!(
            "kernel maple {}: {:.2} s, {:.1} ns/op",
            shape.name(),
            time.as_secs_f64(),
            shape.ns_per_op(time)
        );
        assert!(time > Duration::ZERO);
    }

    /// Builds every shape and runs each three times, printing the times:
    /// `cargo test --release -p bpfmaps-bench kernel_maple_all -- --ignored
    /// --nocapture`. Minutes long, so not run by default.
    #[test]
    #[ignore]
    fn kernel_maple_all_shapes() {
        let start = Instant::now();
        let maple = build(&default_cache_dir()).expect("build");
        eprintln!("built in {:.1} s", start.elapsed().as_secs_f64());
        for shape in Shape::ALL {
            let times: Vec<Duration> = (0..3).map(|_| maple.run(shape).expect("run")).collect();
            let secs: Vec<String> = times
                .iter()
                .map(|t| {
                    format!(
                        "{:.2} s ({:.2} ns/op)",
                        t.as_secs_f64(),
                        shape.ns_per_op(*t)
                    )
                })
                .collect();
            eprintln!(
                "{:<13} {:>11} ops  {}",
                shape.name(),
                shape.ops(),
                secs.join("  ")
            );
        }
    }
}
