//! String key sets of the `strmap-*` suites: the files of
//! `strings/` under the data directory (one key per line, gzip), this
//! machine's kernel symbol names (`/proc/kallsyms`) and BTF strings
//! (`/sys/kernel/btf/vmlinux`), laid out as [`Keys`]; and the lookup sets
//! drawn from them (present keys in random order, and misses: each key
//! with one byte changed); and the generated sets of `strmap-synthetic`
//! ([`Synthetic`]).
//!
//! Keys are byte strings, deduplicated, empty ones dropped. Everything
//! random is drawn from a [`StdRng`] with a fixed seed, so every
//! implementation and every run sees the same orders.

use std::collections::HashSet;
use std::io::{self, BufRead, BufReader};
use std::path::Path;

use flate2::read::GzDecoder;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Byte-string keys laid out back to back, each followed by a NUL (so C
/// peers that take NUL-terminated strings read them in place): a lookup
/// loop reads its keys sequentially and measures the map, not the key
/// fetch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keys {
    bytes: Vec<u8>,
    /// `ends[i]`: the index of key `i`'s NUL; key `i` starts after key
    /// `i - 1`'s.
    ends: Vec<u32>,
}

impl Keys {
    /// Keys in the order given (duplicates kept).
    pub fn new<'a>(keys: impl IntoIterator<Item = &'a [u8]>) -> Keys {
        let mut k = Keys::default();
        for key in keys {
            k.push(key);
        }
        k
    }

    /// Appends `key`.
    pub fn push(&mut self, key: &[u8]) {
        self.bytes.extend_from_slice(key);
        self.ends
            .push(u32::try_from(self.bytes.len()).expect("key bytes fit u32 offsets"));
        self.bytes.push(0);
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    #[inline(always)]
    fn start(&self, i: usize) -> usize {
        if i == 0 {
            0
        } else {
            self.ends[i - 1] as usize + 1
        }
    }

    /// Key `i`.
    #[inline(always)]
    pub fn key(&self, i: usize) -> &[u8] {
        &self.bytes[self.start(i)..self.ends[i] as usize]
    }

    /// Key `i` with its terminating NUL, as a C string (a key holding a
    /// NUL byte reads as shorter: see [`Keys::has_nul`]).
    #[inline(always)]
    pub fn key_with_nul(&self, i: usize) -> &[u8] {
        &self.bytes[self.start(i)..=self.ends[i] as usize]
    }

    /// Every key in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.len()).map(|i| self.key(i))
    }

    /// The longest key's length.
    pub fn max_len(&self) -> usize {
        self.iter().map(<[u8]>::len).max().unwrap_or(0)
    }

    /// Key bytes in all (without the NULs).
    pub fn total_len(&self) -> usize {
        self.bytes.len() - self.len()
    }

    /// Mean key length.
    pub fn mean_len(&self) -> f64 {
        self.total_len() as f64 / self.len().max(1) as f64
    }

    /// Whether some key holds a NUL byte (C-string peers cannot take it,
    /// and zero-padding would merge it with a shorter key).
    pub fn has_nul(&self) -> bool {
        self.iter().any(|k| k.contains(&0))
    }

    /// The keys in the order `order` gives (indices into these keys).
    pub fn permuted(&self, order: &[u32]) -> Keys {
        Keys::new(order.iter().map(|&i| self.key(i as usize)))
    }

    /// How many keys are a proper prefix of another key (adaptive radix
    /// trees such as `blart` take no such key).
    pub fn prefix_keys(&self) -> usize {
        let mut sorted: Vec<&[u8]> = self.iter().collect();
        sorted.sort_unstable();
        sorted.windows(2).filter(|w| w[1].starts_with(w[0])).count()
    }
}

/// Removes empty and repeated keys, keeping first occurrences in order.
pub fn dedup(keys: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let mut seen = HashSet::new();
    keys.into_iter()
        .filter(|k| !k.is_empty() && seen.insert(k.clone()))
        .collect()
}

/// The lines of a gzip file (without `\n` or `\r\n`), in file order.
pub fn read_gz_lines(path: &Path) -> io::Result<Vec<Vec<u8>>> {
    let file = std::fs::File::open(path)?;
    let reader = BufReader::with_capacity(1 << 16, GzDecoder::new(file));
    reader
        .split(b'\n')
        .map(|line| {
            let mut line = line?;
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            Ok(line)
        })
        .collect()
}

/// The symbol names of a `/proc/kallsyms` text: the third column of each
/// line (`address type name [module]`).
pub fn kallsyms_names(text: &[u8]) -> Vec<Vec<u8>> {
    text.split(|&b| b == b'\n')
        .filter_map(|line| {
            line.split(|b| b.is_ascii_whitespace())
                .filter(|f| !f.is_empty())
                .nth(2)
                .map(<[u8]>::to_vec)
        })
        .collect()
}

/// The BTF magic number (`BTF_MAGIC`), in the file's byte order.
const BTF_MAGIC: u16 = 0xeb9f;

/// The strings of a raw BTF blob (`/sys/kernel/btf/vmlinux`): its header
/// (`magic: u16, version: u8, flags: u8, hdr_len: u32`, then `type_off,
/// type_len, str_off, str_len: u32`, offsets from the header's end), then
/// the string section, NUL-separated. Either byte order, as the magic
/// says.
pub fn btf_strings(blob: &[u8]) -> io::Result<Vec<Vec<u8>>> {
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, format!("BTF: {why}"));
    let magic = blob.get(..2).ok_or_else(|| bad("too short"))?;
    let little = match [magic[0], magic[1]] {
        m if m == BTF_MAGIC.to_le_bytes() => true,
        m if m == BTF_MAGIC.to_be_bytes() => false,
        _ => return Err(bad("bad magic")),
    };
    let u32_at = |at: usize| -> io::Result<usize> {
        let b: [u8; 4] = blob
            .get(at..at + 4)
            .ok_or_else(|| bad("short header"))?
            .try_into()
            .expect("4 bytes");
        Ok(if little {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        } as usize)
    };
    let (hdr_len, str_off, str_len) = (u32_at(4)?, u32_at(16)?, u32_at(20)?);
    let start = hdr_len
        .checked_add(str_off)
        .ok_or_else(|| bad("string offset overflows"))?;
    let section = blob
        .get(start..start.saturating_add(str_len))
        .ok_or_else(|| bad("string section past the end"))?;
    Ok(section
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(<[u8]>::to_vec)
        .collect())
}

/// Where a data set comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A gzip file under the data directory, one key per line.
    File(&'static str),
    /// This machine's `/proc/kallsyms` symbol names.
    Kallsyms,
    /// This machine's `/sys/kernel/btf/vmlinux` strings.
    Btf,
}

/// A data set of `strmap-real`: its name in cases and where it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataSet {
    /// Name in cases (`set=kallsyms`).
    pub name: &'static str,
    /// Where its keys come from.
    pub source: Source,
}

/// Every data set, in run order: the shared files first (the issue's
/// figures are on those), then this machine's own, the fallbacks for the
/// first two.
pub const DATA_SETS: &[DataSet] = &[
    DataSet {
        name: "kallsyms",
        source: Source::File("strings/kallsyms.txt.gz"),
    },
    DataSet {
        name: "btf_strings",
        source: Source::File("strings/btf_strings.txt.gz"),
    },
    DataSet {
        name: "linux_paths",
        source: Source::File("strings/linux_paths.txt.gz"),
    },
    DataSet {
        name: "domains_top100k",
        source: Source::File("strings/domains_top100k.txt.gz"),
    },
    DataSet {
        name: "english_words",
        source: Source::File("strings/english_words.txt.gz"),
    },
    DataSet {
        name: "machine-kallsyms",
        source: Source::Kallsyms,
    },
    DataSet {
        name: "machine-btf",
        source: Source::Btf,
    },
];

/// Where this machine's sets are read.
pub const PROC_KALLSYMS: &str = "/proc/kallsyms";
/// See [`PROC_KALLSYMS`].
pub const SYS_BTF: &str = "/sys/kernel/btf/vmlinux";

impl DataSet {
    /// The shared set this one stands in for: this machine's kernel
    /// symbols and BTF strings are the same kind of keys as the shipped
    /// `kallsyms` and `btf_strings` (in R23, key counts within 0.1 % and
    /// equal mean lengths), so by default they run only when that set
    /// cannot be read.
    pub fn stands_in_for(&self) -> Option<&'static str> {
        match self.source {
            Source::File(_) => None,
            Source::Kallsyms => Some("kallsyms"),
            Source::Btf => Some("btf_strings"),
        }
    }

    /// Its keys (deduplicated, in first-seen order), reading files under
    /// `data_dir`; the error says why the set is unavailable.
    pub fn load(&self, data_dir: &Path) -> Result<Vec<Vec<u8>>, String> {
        let keys = match self.source {
            Source::File(rel) => {
                let path = data_dir.join(rel);
                read_gz_lines(&path).map_err(|e| format!("{}: {e}", path.display()))?
            }
            Source::Kallsyms => std::fs::read(PROC_KALLSYMS)
                .map(|text| kallsyms_names(&text))
                .map_err(|e| format!("{PROC_KALLSYMS}: {e}"))?,
            Source::Btf => std::fs::read(SYS_BTF)
                .and_then(|blob| btf_strings(&blob))
                .map_err(|e| format!("{SYS_BTF}: {e}"))?,
        };
        let keys = dedup(keys);
        if keys.is_empty() {
            return Err(format!("{}: no keys", self.name));
        }
        Ok(keys)
    }
}

/// `keys` in a random order of `seed` (the build order: key `i` of the
/// result gets value `i`).
pub fn shuffled(mut keys: Vec<Vec<u8>>, seed: u64) -> Keys {
    keys.shuffle(&mut StdRng::seed_from_u64(seed));
    Keys::new(keys.iter().map(Vec::as_slice))
}

/// Every index of `keys` once, in a random order of `seed`: the hit
/// lookups.
pub fn hit_order(keys: &Keys, seed: u64) -> Vec<u32> {
    let mut order: Vec<u32> = (0..keys.len() as u32).collect();
    order.shuffle(&mut StdRng::seed_from_u64(seed));
    order
}

/// Misses: each key in a random order of `seed` with one byte changed,
/// at a random position, to a byte taken from a random position of a
/// random key (so misses use the set's alphabet); a change that gives a
/// stored key is drawn again, and a key that gives no miss in 32 draws
/// (a one-letter key whose every variant is stored) is left out.
pub fn misses(keys: &Keys, seed: u64) -> Keys {
    let mut rng = StdRng::seed_from_u64(seed);
    let stored: HashSet<&[u8]> = keys.iter().collect();
    let mut out = Keys::default();
    let mut buf = Vec::new();
    for i in hit_order(keys, seed ^ 0x6d69_7373) {
        buf.clear();
        buf.extend_from_slice(keys.key(i as usize));
        for _ in 0..32 {
            let at = rng.random_range(0..buf.len());
            let donor = keys.key(rng.random_range(0..keys.len()));
            let byte = donor[rng.random_range(0..donor.len())];
            let old = std::mem::replace(&mut buf[at], byte);
            if byte != old && !stored.contains(buf.as_slice()) {
                out.push(&buf);
                break;
            }
            buf[at] = old;
        }
    }
    out
}

/// The shape of a synthetic key set (`strmap-synthetic`), after the sets
/// of the 2022 BPF ternary-search-tree and qp-trie benchmarks: path-like
/// keys whose long prefixes are shared by many keys, or flat random ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `dir/dir/dir/dir/name`: a prefix of up to [`PREFIX_MAX`] bytes made
    /// of [`LEVELS`] directory components (each ending in `/`) from a
    /// tree of directories, then a base name of up to [`NAME_MAX`] bytes.
    Hierarchical,
    /// Random printable bytes (`!` to `~`), up to [`SYNTH_MAX`] bytes.
    Flat,
}

/// A synthetic key set: a shape, and whether every key has the longest
/// length ([`SYNTH_MAX`] bytes) or lengths vary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Synthetic {
    /// Path-like or flat.
    pub shape: Shape,
    /// Every key [`SYNTH_MAX`] bytes long (every directory component and
    /// base name at its longest), or each length drawn uniformly.
    pub equal: bool,
}

/// Longest directory prefix of a hierarchical key, slashes included.
pub const PREFIX_MAX: usize = 191;
/// Longest base name of a hierarchical key.
pub const NAME_MAX: usize = 64;
/// Longest synthetic key (every key of an equal-length set).
pub const SYNTH_MAX: usize = PREFIX_MAX + NAME_MAX;
/// Directory levels of a hierarchical key.
pub const LEVELS: usize = 4;
/// Longest component per level, without its `/`: they add up to
/// [`PREFIX_MAX`] with the slashes.
const COMPONENT_MAX: [usize; LEVELS] = [47, 47, 47, 46];
/// Mean keys per directory of the last level: the tree has the smallest
/// branching factor that gives at least `n / KEYS_PER_DIR` of them.
const KEYS_PER_DIR: usize = 32;
/// The bytes of directory components and base names.
const PATH_BYTES: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789_-.";

impl Synthetic {
    /// The four sets, in run order.
    pub const ALL: [Synthetic; 4] = [
        Synthetic {
            shape: Shape::Hierarchical,
            equal: false,
        },
        Synthetic {
            shape: Shape::Hierarchical,
            equal: true,
        },
        Synthetic {
            shape: Shape::Flat,
            equal: false,
        },
        Synthetic {
            shape: Shape::Flat,
            equal: true,
        },
    ];

    /// `hier` or `flat`.
    pub fn shape_name(&self) -> &'static str {
        match self.shape {
            Shape::Hierarchical => "hier",
            Shape::Flat => "flat",
        }
    }

    /// `equal` or `varied`.
    pub fn len_name(&self) -> &'static str {
        if self.equal { "equal" } else { "varied" }
    }

    /// `hier-varied`, `flat-equal`, ...: the set's name in options.
    pub fn name(&self) -> String {
        format!("{}-{}", self.shape_name(), self.len_name())
    }

    /// `n` distinct keys drawn from `seed`, in the order drawn (a random
    /// order: each key's directory and name are drawn independently).
    pub fn generate(&self, n: usize, seed: u64) -> Keys {
        let mut rng = StdRng::seed_from_u64(seed);
        let dirs = match self.shape {
            Shape::Hierarchical => Some(DirTree::new(n, self.equal, &mut rng)),
            Shape::Flat => None,
        };
        // Distinct keys by a 64-bit hash: a collision between two
        // different keys only redraws one of them.
        let mut seen = HashSet::with_capacity(n);
        let mut keys = Keys::default();
        let mut buf = Vec::with_capacity(SYNTH_MAX);
        while keys.len() < n {
            buf.clear();
            match &dirs {
                Some(tree) => {
                    tree.push_prefix(&mut buf, &mut rng);
                    let len = if self.equal {
                        NAME_MAX
                    } else {
                        rng.random_range(1..=NAME_MAX)
                    };
                    push_random(&mut buf, len, PATH_BYTES, &mut rng);
                }
                None => {
                    let len = if self.equal {
                        SYNTH_MAX
                    } else {
                        rng.random_range(1..=SYNTH_MAX)
                    };
                    push_random(&mut buf, len, PRINTABLE, &mut rng);
                }
            }
            if seen.insert(hash64(&buf)) {
                keys.push(&buf);
            }
        }
        keys
    }
}

/// Printable ASCII without the space.
const PRINTABLE: &[u8] = b"!\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~";

/// Appends `len` bytes drawn from `alphabet` (with the small bias of a
/// byte taken modulo its length).
fn push_random(buf: &mut Vec<u8>, len: usize, alphabet: &[u8], rng: &mut StdRng) {
    let start = buf.len();
    buf.resize(start + len, 0);
    rng.fill(&mut buf[start..]);
    for b in &mut buf[start..] {
        *b = alphabet[*b as usize % alphabet.len()];
    }
}

/// A 64-bit hash of `key`, the same in every run (SipHash with zero keys).
fn hash64(key: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

/// The directories of a hierarchical set: a complete tree of [`LEVELS`]
/// levels and `branch` children per directory, each directory's name drawn
/// once.
struct DirTree {
    branch: usize,
    /// `names[l][i]`: the name of directory `i` of level `l` (`branch^(l+1)`
    /// of them), without its `/`.
    names: Vec<Vec<Vec<u8>>>,
}

impl DirTree {
    fn new(n: usize, equal: bool, rng: &mut StdRng) -> DirTree {
        let leaves = n.div_ceil(KEYS_PER_DIR).max(1);
        let mut branch = 2usize;
        while branch.pow(LEVELS as u32) < leaves {
            branch += 1;
        }
        let mut names = Vec::with_capacity(LEVELS);
        let mut count = 1;
        for max in COMPONENT_MAX {
            count *= branch;
            let level = (0..count)
                .map(|_| {
                    let len = if equal {
                        max
                    } else {
                        rng.random_range(1..=max)
                    };
                    let mut name = Vec::with_capacity(len);
                    push_random(&mut name, len, PATH_BYTES, rng);
                    name
                })
                .collect();
            names.push(level);
        }
        DirTree { branch, names }
    }

    /// Appends the path of a random directory of the last level, each
    /// component followed by `/`.
    fn push_prefix(&self, buf: &mut Vec<u8>, rng: &mut StdRng) {
        let leaf = rng.random_range(0..self.names[LEVELS - 1].len());
        let mut div = self.names[LEVELS - 1].len();
        for level in &self.names {
            div /= self.branch;
            buf.extend_from_slice(&level[leaf / div]);
            buf.push(b'/');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_lay_out_with_nuls() {
        let k = Keys::new([&b"ab"[..], b"", b"xyz"]);
        assert_eq!(k.len(), 3);
        assert_eq!(k.key(0), b"ab");
        assert_eq!(k.key(1), b"");
        assert_eq!(k.key_with_nul(2), b"xyz\0");
        assert_eq!((k.max_len(), k.total_len()), (3, 5));
        assert!(!k.has_nul());
        assert!(Keys::new([&b"a\0b"[..]]).has_nul());
        let p = k.permuted(&[2, 0]);
        assert_eq!(p.iter().collect::<Vec<_>>(), [&b"xyz"[..], b"ab"]);
        let pre = Keys::new([&b"ab"[..], b"abc", b"b", b"abd", b"c"]);
        assert_eq!(pre.prefix_keys(), 1);
    }

    #[test]
    fn dedup_keeps_first_occurrences() {
        let v = |s: &[&str]| s.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
        assert_eq!(
            dedup(v(&["b", "a", "", "b", "c", "a"])),
            v(&["b", "a", "c"])
        );
    }

    #[test]
    fn reads_kallsyms_names() {
        let text = b"ffffffff81000000 T _stext\n0000000000000000 t foo.cold\t[mod]\n\nbad line\n";
        assert_eq!(
            kallsyms_names(text),
            [b"_stext".to_vec(), b"foo.cold".to_vec()]
        );
    }

    /// A BTF blob: a 24-byte header, 4 bytes of types, then the strings.
    fn blob(little: bool, strings: &[u8]) -> Vec<u8> {
        let u32b = |x: u32| {
            if little {
                x.to_le_bytes()
            } else {
                x.to_be_bytes()
            }
        };
        let mut b = if little {
            BTF_MAGIC.to_le_bytes().to_vec()
        } else {
            BTF_MAGIC.to_be_bytes().to_vec()
        };
        b.extend([1, 0]);
        for x in [24, 0, 4, 4, strings.len() as u32] {
            b.extend(u32b(x));
        }
        b.extend([0xaa; 4]);
        b.extend_from_slice(strings);
        b
    }

    #[test]
    fn reads_btf_strings_in_either_byte_order() {
        for little in [true, false] {
            let b = blob(little, b"\0int\0char\0\0long int\0");
            assert_eq!(
                btf_strings(&b).unwrap(),
                [b"int".to_vec(), b"char".to_vec(), b"long int".to_vec()]
            );
        }
        assert!(btf_strings(b"\x9f").is_err());
        assert!(btf_strings(b"\x00\x00rest of a file").is_err());
        let mut short = blob(true, b"\0int\0");
        short.truncate(short.len() - 2);
        assert!(btf_strings(&short).is_err());
    }

    #[test]
    fn reads_gzip_lines() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("bpfmaps-strings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("k.txt.gz");
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&path).unwrap(),
            flate2::Compression::fast(),
        );
        gz.write_all(b"one\r\ntwo\n\nthree").unwrap();
        gz.finish().unwrap();
        let lines = read_gz_lines(&path).unwrap();
        assert_eq!(lines, [&b"one"[..], b"two", b"", b"three"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn misses_are_absent_and_one_byte_away() {
        let words: Vec<Vec<u8>> = (0..2000u32)
            .map(|i| format!("w{}", i * 3).into_bytes())
            .chain([b"a".to_vec(), b"b".to_vec()])
            .collect();
        let keys = shuffled(words, 1);
        let stored: HashSet<&[u8]> = keys.iter().collect();
        let m = misses(&keys, 2);
        assert!(m.len() > 1900, "{}", m.len());
        for miss in m.iter() {
            assert!(!stored.contains(miss));
            assert!(stored.iter().any(|k| k.len() == miss.len()
                && k.iter().zip(miss).filter(|(a, b)| a != b).count() == 1));
        }
        assert_eq!(m, misses(&keys, 2), "a fixed seed gives the same misses");
    }

    #[test]
    fn synthetic_sets_have_their_shape() {
        for set in Synthetic::ALL {
            let keys = set.generate(3000, 7);
            assert_eq!(keys.len(), 3000, "{}", set.name());
            assert_eq!(
                keys,
                set.generate(3000, 7),
                "a fixed seed gives the same keys"
            );
            let distinct: HashSet<&[u8]> = keys.iter().collect();
            assert_eq!(distinct.len(), keys.len(), "{}", set.name());
            assert!(keys.max_len() <= SYNTH_MAX);
            if set.equal {
                assert!(keys.iter().all(|k| k.len() == SYNTH_MAX), "{}", set.name());
            } else {
                assert!(
                    keys.iter().any(|k| k.len() < SYNTH_MAX / 2),
                    "{}",
                    set.name()
                );
            }
            assert!(!keys.has_nul());
            for k in keys.iter() {
                match set.shape {
                    Shape::Hierarchical => {
                        let slash = k.iter().rposition(|&b| b == b'/').unwrap();
                        assert!(slash < PREFIX_MAX && k.len() - slash - 1 <= NAME_MAX);
                        assert_eq!(k.iter().filter(|&&b| b == b'/').count(), LEVELS);
                        if set.equal {
                            assert_eq!(slash + 1, PREFIX_MAX);
                        }
                    }
                    Shape::Flat => assert!(k.iter().all(|b| (b'!'..=b'~').contains(b))),
                }
            }
        }
        // Hierarchical keys share their directories: far fewer distinct
        // prefixes than keys.
        let keys = Synthetic::ALL[0].generate(3000, 7);
        let dirs: HashSet<&[u8]> = keys
            .iter()
            .map(|k| &k[..=k.iter().rposition(|&b| b == b'/').unwrap()])
            .collect();
        assert!(dirs.len() < 3000 / 8, "{}", dirs.len());
    }
}
