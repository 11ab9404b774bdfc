//! Native peers: C libraries benchmarked beside bpfmaps, each from a
//! Debian package, and compiled in only where that package is installed.
//!
//! | peer | library | Debian package | compared in |
//! |---|---|---|---|
//! | `judy` | JudyHS (`native::judy`, built in where `cfg(native_judy)`) | `libjudy-dev` | `hash-sweep` ([`crate::hash_impls`]) |
//! | `judysl` | JudySL (the same library and module) | `libjudy-dev` | `strmap-real` ([`crate::str_tables`]) |
//! | `hat-trie` | libhat-trie (`native::hat_trie`, where `cfg(native_hat_trie)`) | `libhat-trie-dev` | `strmap-real` |
//! | `kernel-maple` | the kernel's maple tree, built at bench time from the source package and run as separate processes ([`kernel_maple`], always compiled) | `linux-source-6.12`, `liburcu-dev` | `maple-kernel` ([`crate::suites`]) |
//! | `rte-acl` | DPDK 22.11's `rte_acl`, through Debian's `dpdk-test-acl` program run as a separate process on the suite's rules and packets ([`dpdk_acl`], always compiled; nothing built) | `dpdk-dev` | `wildcard-classbench` |
//!
//! ## The rule
//! A native library comes only from Debian's packages, which `apt-get`
//! installs on every machine and in CI (`.ci/run` installs the packages
//! named in `build.rs`). Never from fetched source: the repository holds
//! no recipe that downloads or builds a library's code. One exception,
//! asked for by the maple tree's issue: the kernel's own maple tree has
//! no library package, so [`kernel_maple`] builds it at bench time from
//! the kernel source that Debian's `linux-source-6.12` package installs
//! (nothing downloaded, nothing of it copied into the repository, run as
//! separate processes).
//!
//! ## How it works
//! `build.rs` lists the libraries (`NATIVE`, one line each: a name, the
//! Debian package, and how to find it) and probes each at build time:
//! - with pkg-config where the package ships a `.pc` file (DPDK's
//!   `libdpdk`), which also gives the link flags;
//! - otherwise by compiling and linking a tiny C program that includes the
//!   header and calls one function (the `cc` crate's C compiler for the
//!   target, so `CC` and `CFLAGS` apply); nothing is run.
//!
//! A library found is linked (`cargo:rustc-link-lib`) and its peer is
//! compiled in under `cfg(native_NAME)`. One that is missing is skipped
//! with a cargo warning, and the build goes on: the benchmark builds and
//! runs on a machine without any of the packages. Either way the build
//! script tells the binary what it found ([`libraries`]), and the report's
//! machine section has a line saying which native peers were built in and
//! why the others were not ([`summary`]).
//!
//! Cargo probes again when a Debian package is installed or removed
//! (`build.rs` watches `/var/lib/dpkg/status`) and when
//! `BPFMAPS_BENCH_NO_NATIVE` changes. Elsewhere, after installing a library
//! by hand, `cargo clean -p bpfmaps-bench`.
//!
//! ## Installing them
//! ```sh
//! apt-get install -y libjudy-dev       # judy, judysl
//! apt-get install -y libhat-trie-dev   # hat-trie
//! apt-get install -y dpdk-dev          # rte-acl (dpdk-test-acl, found at run time)
//! ```
//! `.ci/run` does this when it runs as root with `apt-get` (or with
//! password-less `sudo`), and prints a note and goes on otherwise.
//!
//! ## Building without them
//! `BPFMAPS_BENCH_NO_NATIVE=1` (or `all`) builds as if none were installed;
//! a comma-separated list of names (`BPFMAPS_BENCH_NO_NATIVE=judy`) leaves
//! out those. The report then says "disabled" for them.
//!
//! ## Adding a native peer
//! 1. One entry in `build.rs`'s `NATIVE`: its name, its Debian package,
//!    `Probe::PkgConfig("module")` if the package ships a `.pc` file, else
//!    `Probe::Compile { header, libs, code }` (the header to include, the
//!    libraries to link, a statement that calls one of its functions), and
//!    `exports` (usually none; see the caveat on memory). `.ci/run`
//!    installs every package named there (it reads the `package:` lines).
//! 2. `src/native/NAME.rs`, declared below as `#[cfg(native_NAME)] pub mod
//!    NAME;`: the `extern "C"` declarations the peer calls, written by hand
//!    from the header (no bindgen), with each `unsafe` block's `// SAFETY:`
//!    comment, and a safe wrapper type that owns the C structure and frees
//!    it in `Drop`. Give it a unit test.
//! 3. One entry in the family's list (`hash_impls` for a hash map,
//!    `str_tables` for a string map, the LPM list for DPDK's `rte_lpm`)
//!    and the trait impl there, both under `#[cfg(native_NAME)]`; tests
//!    that count the list add `cfg!(native_NAME)`.
//!
//! The next one planned: DPDK's `rte_lpm` (`libdpdk-dev`, pkg-config
//! `libdpdk`). (`rte_acl` is in, as a separate process: [`dpdk_acl`].)
//!
//! ## Caveats
//! - Memory: a C library that calls `malloc` itself is not seen by the
//!   counting allocator ([`crate::alloc`]), so its peer's `mem.bytes_held`
//!   would count only the Rust wrapper. libJudy lets a program supply its
//!   allocator (`JudyMalloc`/`JudyFree`): `native::judy` defines them over Rust's
//!   global allocator and `build.rs` exports them from the binary
//!   (`exports`), so Judy's memory is counted like a Rust map's, and a test
//!   checks it. A library with no such hook needs another measure (or its
//!   memory rows left out) before its memory is compared: libhat-trie has
//!   none, so `strmap-real` reports its own account (`hattrie_sizeof`,
//!   the bytes it asked `malloc` for) as `mem_reported_per_key`.
//! - A native peer takes no Rust `BuildHasher`: it hashes (or not) its own
//!   way, so a ratio against it compares the hash too.

pub mod dpdk_acl;
#[cfg(native_hat_trie)]
pub mod hat_trie;
#[cfg(native_judy)]
pub mod judy;
pub mod kernel_maple;

/// Whether a native library was compiled in, and if not, why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Found and linked; its peer is in the lists.
    Built,
    /// Not found: its Debian package is not installed (or has no C
    /// compiler to probe with).
    Missing,
    /// Left out by `BPFMAPS_BENCH_NO_NATIVE`.
    Disabled,
}

/// A native library as the build script found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Library {
    /// The peer's name (`judy`).
    pub name: &'static str,
    /// The Debian package that ships it (`libjudy-dev`).
    pub package: &'static str,
    /// Whether it was built in.
    pub state: State,
}

/// Every native library `build.rs` knows, as this binary was built.
pub fn libraries() -> Vec<Library> {
    parse(env!("BPFMAPS_BENCH_NATIVE"))
}

/// One line for the report's machine section: each library with what
/// became of it, then the peers run as separate programs that are found
/// at run time ([`dpdk_acl::summary`]: whether `dpdk-test-acl` is there).
pub fn summary() -> String {
    format!("{}; {}", describe(&libraries()), dpdk_acl::summary())
}

/// `judy (libjudy-dev): built in; ...`, or `none` for an empty list.
fn describe(libs: &[Library]) -> String {
    if libs.is_empty() {
        return "none".into();
    }
    libs.iter()
        .map(|l| {
            let what = match l.state {
                State::Built => "built in".to_string(),
                State::Missing => format!("not installed, skipped (apt-get install {})", l.package),
                State::Disabled => "disabled by BPFMAPS_BENCH_NO_NATIVE, skipped".to_string(),
            };
            format!("{} ({}): {what}", l.name, l.package)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Parses the build script's `name,package,state;...`.
fn parse(s: &'static str) -> Vec<Library> {
    s.split(';')
        .filter(|e| !e.is_empty())
        .map(|e| {
            let mut f = e.split(',');
            let (Some(name), Some(package), Some(state), None) =
                (f.next(), f.next(), f.next(), f.next())
            else {
                panic!("BPFMAPS_BENCH_NATIVE entry {e:?}: want name,package,state");
            };
            let state = match state {
                "built" => State::Built,
                "missing" => State::Missing,
                "disabled" => State::Disabled,
                other => panic!("BPFMAPS_BENCH_NATIVE: unknown state {other:?}"),
            };
            Library {
                name,
                package,
                state,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_describes_what_the_build_found() {
        let libs =
            parse("judy,libjudy-dev,built;hat,libhat-trie-dev,missing;dpdk,dpdk-dev,disabled");
        assert_eq!(
            libs.iter().map(|l| (l.name, l.state)).collect::<Vec<_>>(),
            [
                ("judy", State::Built),
                ("hat", State::Missing),
                ("dpdk", State::Disabled)
            ]
        );
        assert_eq!(
            describe(&libs),
            "judy (libjudy-dev): built in; \
             hat (libhat-trie-dev): not installed, skipped (apt-get install libhat-trie-dev); \
             dpdk (dpdk-dev): disabled by BPFMAPS_BENCH_NO_NATIVE, skipped"
        );
        assert_eq!(describe(&parse("")), "none");
    }

    /// The list the report prints agrees with what was compiled in.
    #[test]
    fn the_list_matches_the_cfgs() {
        let libs = libraries();
        let judy = libs.iter().find(|l| l.name == "judy").expect("judy listed");
        assert_eq!(judy.state == State::Built, cfg!(native_judy));
        assert_eq!(judy.package, "libjudy-dev");
        let hat = libs.iter().find(|l| l.name == "hat_trie").expect("listed");
        assert_eq!(hat.state == State::Built, cfg!(native_hat_trie));
        assert_eq!(hat.package, "libhat-trie-dev");
    }
}
