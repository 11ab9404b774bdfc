//! Queries and iteration: covering and covered prefixes, pre-order
//! visits, and the post-order `get_next_key` walk.

use std::cmp::Ordering as Cmp;

use super::{Found, LpmTrie, position};
use crate::core::error::Result;
use crate::core::reclaim::Guard;
use crate::lpm::key::{self, mask_host_bits, prefix_contains};
use crate::lpm::node::{Children, Node, Prefixes, index_range, prefix_index};

impl LpmTrie {
    /// Every stored prefix containing `data/prefixlen` (itself included),
    /// shortest first.
    pub fn covering(&self, data: &[u8], prefixlen: u32, guard: &Guard) -> Result<Vec<Found>> {
        let (buf, prefixlen) = self.masked(data, prefixlen)?;
        let data = &buf[..self.data_size];
        let mut out = Vec::new();
        let mut node = &self.root;
        let mut depth = 0;
        loop {
            let nd = node.data(guard);
            for l in u32::from(depth > 0)..=8 {
                let plen = 8 * depth as u32 + l;
                if plen > prefixlen {
                    break;
                }
                if let Some(payload) = nd.prefix(prefix_index(l, data[depth])) {
                    let mut d = data.to_vec();
                    mask_host_bits(&mut d, plen);
                    out.push(Found {
                        data: d,
                        prefixlen: plen,
                        payload,
                    });
                }
            }
            if prefixlen <= 8 * (depth as u32 + 1) {
                return Ok(out);
            }
            let Some(child) = node.child(data[depth], guard) else {
                return Ok(out);
            };
            // The child's prefixes are all longer than its depth's bytes.
            let below = depth + 1 + child.skip.len();
            if prefixlen <= 8 * below as u32 || !child.skip.matches(&data[depth + 1..]) {
                return Ok(out);
            }
            (node, depth) = (child, below);
        }
    }

    /// Every stored prefix inside `data/prefixlen` (itself included), in
    /// prefix order (address, then length).
    pub fn covered(&self, data: &[u8], prefixlen: u32, guard: &Guard) -> Result<Vec<Found>> {
        let (buf, prefixlen) = self.masked(data, prefixlen)?;
        let data = &buf[..self.data_size];
        let (depth, idx) = position(data, prefixlen);
        let mut out = Vec::new();
        let mut push = |d: &[u8], l, r| {
            out.push(Found {
                data: d.to_vec(),
                prefixlen: l,
                payload: r,
            })
        };
        let path = &data[..depth];
        let (node, pos) = self.along(path, guard).last().expect("the root");
        if pos.depth == depth {
            PreOrder {
                trie: self,
                path: path.to_vec(),
                visit: &mut push,
                guard,
            }
            .node(node, idx);
        } else if pos.depth < depth {
            // A compressed edge may skip past `depth`: then the whole
            // subtree below it is inside the prefix, or none of it is.
            if let Some(child) = node.child(path[pos.depth], guard) {
                let mut below = path[..=pos.depth].to_vec();
                below.extend(child.skip.bytes());
                if below.len() > depth && prefix_contains(data, prefixlen, &below) {
                    PreOrder {
                        trie: self,
                        path: below,
                        visit: &mut push,
                        guard,
                    }
                    .node(child, 1);
                }
            }
        }
        Ok(out)
    }

    /// Calls `f(data, prefixlen, value)` for every prefix in prefix order
    /// (address ascending, then length ascending). Weakly consistent under
    /// concurrent updates.
    pub fn for_each(&self, guard: &Guard, mut f: impl FnMut(&[u8], u32, &[u8])) {
        self.for_each_payload(guard, |d, l, p| f(d, l, &self.value(p, guard)));
    }

    pub(super) fn for_each_payload(&self, guard: &Guard, mut f: impl FnMut(&[u8], u32, [u8; 4])) {
        let mut walk = PreOrder {
            trie: self,
            path: Vec::with_capacity(self.data_size),
            visit: &mut f,
            guard,
        };
        walk.node(&self.root, 1);
    }

    /// The prefix with `l` bits in byte `byte` after `path` (host bits
    /// zero), as a full-length data buffer.
    fn prefix_data(&self, path: &[u8], byte: u8) -> [u8; key::DATA_SIZE_MAX] {
        let mut data = [0u8; key::DATA_SIZE_MAX];
        data[..path.len()].copy_from_slice(path);
        if path.len() < self.data_size {
            data[path.len()] = byte;
        }
        data
    }

    /// The first prefix after `after` in post-order (children before their
    /// parents: ascending last address, then longer first); the first of all
    /// for `None`.
    pub fn next_after(&self, after: Option<(&[u8], u32)>, guard: &Guard) -> Result<Option<Found>> {
        let bound = match after {
            Some((data, len)) => {
                let (mut buf, len) = self.masked(data, len)?;
                set_host_bits(&mut buf[..self.data_size], len);
                Some((buf, len))
            }
            None => None,
        };
        let mut walk = PostOrder {
            trie: self,
            path: Vec::with_capacity(self.data_size),
            bound: bound.as_ref().map(|(b, l)| (&b[..self.data_size], *l)),
            guard,
        };
        Ok(walk.node(&self.root, 1))
    }
}

/// A pre-order walk of the prefixes under a node's index, calling `visit`
/// with each prefix's data, length and payload.
struct PreOrder<'a> {
    trie: &'a LpmTrie,
    /// The key bytes that lead to the node walked.
    path: Vec<u8>,
    visit: Visit<'a>,
    guard: &'a Guard,
}

impl PreOrder<'_> {
    /// The prefixes under index `idx` of `node`.
    fn node(&mut self, node: &Node, idx: usize) {
        let guard = self.guard;
        let prefixes = Box::new(node.data(guard).prefixes());
        self.inside(&prefixes, node.children(guard), idx);
    }

    /// The same, inside one node whose prefixes and child block were read
    /// once, on entry.
    fn inside(&mut self, prefixes: &Prefixes, children: Option<Children<'_>>, idx: usize) {
        if subtree_empty(prefixes, children, idx) {
            return;
        }
        let (l, lo, _) = index_range(idx);
        if let Some(payload) = prefixes.get(idx) {
            let data = self.trie.prefix_data(&self.path, lo as u8);
            let plen = 8 * self.path.len() as u32 + l;
            (self.visit)(&data[..self.trie.data_size], plen, payload);
        }
        if l < 8 {
            self.inside(prefixes, children, 2 * idx);
            self.inside(prefixes, children, 2 * idx + 1);
        } else if let Some(child) = children.filter(|c| c.bits.get(lo)) {
            // SAFETY: bit set.
            let child = unsafe { child.node(child.bits.rank(lo)) };
            let depth = self.path.len();
            self.path.push(lo as u8);
            self.path.extend(child.skip.bytes());
            self.node(child, 1);
            self.path.truncate(depth);
        }
    }
}

/// A post-order search for the first prefix beyond `bound`.
struct PostOrder<'a> {
    trie: &'a LpmTrie,
    /// The key bytes that lead to the node walked.
    path: Vec<u8>,
    /// The last address and length of the prefix to start after.
    bound: Option<(&'a [u8], u32)>,
    guard: &'a Guard,
}

impl PostOrder<'_> {
    /// The first prefix beyond the bound under index `idx` of `node`.
    fn node(&mut self, node: &Node, idx: usize) -> Option<Found> {
        let guard = self.guard;
        let prefixes = Box::new(node.data(guard).prefixes());
        self.inside(&prefixes, node.children(guard), idx)
    }

    /// The same, inside one node whose prefixes and child block were read
    /// once, on entry.
    fn inside(
        &mut self,
        prefixes: &Prefixes,
        children: Option<Children<'_>>,
        idx: usize,
    ) -> Option<Found> {
        if subtree_empty(prefixes, children, idx) {
            return None;
        }
        let (l, lo, hi) = index_range(idx);
        let plen = 8 * self.path.len() as u32 + l;
        // Every prefix under idx is at most (last address of idx, plen) in
        // post-order: skip the subtree if that is not beyond the bound.
        if let Some((last, len)) = self.bound {
            match cmp_last(&self.path, (hi - 1) as u8, last) {
                Cmp::Less => return None,
                Cmp::Equal if plen >= len => return None,
                _ => {}
            }
        }
        if l < 8 {
            let found = self.inside(prefixes, children, 2 * idx);
            if found.is_some() {
                return found;
            }
            let found = self.inside(prefixes, children, 2 * idx + 1);
            if found.is_some() {
                return found;
            }
        } else if let Some(child) = children.filter(|c| c.bits.get(lo)) {
            // SAFETY: bit set.
            let child = unsafe { child.node(child.bits.rank(lo)) };
            let depth = self.path.len();
            self.path.push(lo as u8);
            self.path.extend(child.skip.bytes());
            let found = self.node(child, 1);
            self.path.truncate(depth);
            if found.is_some() {
                return found;
            }
        }
        let payload = prefixes.get(idx)?;
        let data = self.trie.prefix_data(&self.path, lo as u8);
        Some(Found {
            data: data[..self.trie.data_size].to_vec(),
            prefixlen: plen,
            payload,
        })
    }
}

/// A visitor of (prefix data, prefix length, payload).
type Visit<'a> = &'a mut dyn FnMut(&[u8], u32, [u8; 4]);

/// Sets every bit from `prefixlen` on: the last address of the prefix.
fn set_host_bits(data: &mut [u8], prefixlen: u32) {
    let len = prefixlen as usize;
    let full = len / 8;
    if full < data.len() {
        data[full] |= 0xffu8.checked_shr((len % 8) as u32).unwrap_or(0);
        data[full + 1..].fill(0xff);
    }
}

/// Compares the last address of the range `path ++ [last_byte] ++ 0xff..`
/// with `last` (a full-length address).
fn cmp_last(path: &[u8], last_byte: u8, last: &[u8]) -> Cmp {
    let depth = path.len();
    path.cmp(&last[..depth]).then_with(|| {
        if depth == last.len() {
            return Cmp::Equal;
        }
        last_byte.cmp(&last[depth]).then_with(|| {
            if last[depth + 1..].iter().all(|&b| b == 0xff) {
                Cmp::Equal
            } else {
                Cmp::Greater
            }
        })
    })
}

/// Whether no prefix and no child lies under index `idx` of a node.
fn subtree_empty(prefixes: &Prefixes, children: Option<Children<'_>>, idx: usize) -> bool {
    let (l, lo, hi) = index_range(idx);
    if children.is_some_and(|c| c.bits.any_in(lo, hi)) {
        return false;
    }
    (l..=8).all(|level| {
        let shift = level - l;
        !prefixes.bits.any_in(idx << shift, (idx + 1) << shift)
    })
}
