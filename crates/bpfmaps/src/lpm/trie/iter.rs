//! Queries and iteration: covering and covered prefixes, pre-order
//! visits, and the post-order `get_next_key` walk. Both orders read each
//! node's blocks in place (`node::order`): a pre-order visit reads each
//! node once, and `get_next_key` walks down the path to where the
//! previous key was and on from there, O(depth) nodes per call.

use std::cmp::Ordering as Cmp;

use super::{Found, LpmTrie, Value, position};
use crate::core::error::Result;
use crate::core::reclaim::Guard;
use crate::lpm::key::{self, mask_host_bits, prefix_contains};
use crate::lpm::node::{
    Children, DataBlock, Node, PreOrder, Skip, Unit, child_post_key, index_range, next_post,
    post_key, prefix_index,
};

impl LpmTrie {
    /// The value stored for exactly `data/prefixlen` (host bits ignored),
    /// found as the writer finds a prefix: the walk to its node, then its
    /// slot. Lock-free; `None` for a prefix not stored, data of the wrong
    /// size or a length past it.
    pub fn exact<'g>(&'g self, data: &[u8], prefixlen: u32, guard: &'g Guard) -> Option<Value<'g>> {
        let (buf, prefixlen) = self.masked(data, prefixlen).ok()?;
        let (depth, idx) = position(&buf, prefixlen);
        let payload = self.locate(&buf[..depth], guard)?.data.prefix(idx)?;
        Some(self.value(payload, guard))
    }

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
        let push = |d: &[u8], l, r| {
            out.push(Found {
                data: d.to_vec(),
                prefixlen: l,
                payload: r,
            })
        };
        let mut walk = PreWalk {
            data_size: self.data_size,
            path: buf,
            visit: push,
            guard,
        };
        let path = &data[..depth];
        let (node, pos) = self.along(path, guard).last().expect("the root");
        if pos.depth == depth {
            walk.node(node, depth, idx);
        } else if pos.depth < depth {
            // A compressed edge may skip past `depth`: then the whole
            // subtree below it is inside the prefix, or none of it is.
            if let Some(child) = node.child(path[pos.depth], guard) {
                let below = enter(&mut walk.path, pos.depth, path[pos.depth], child.skip);
                if below > depth && prefix_contains(data, prefixlen, &walk.path[..below]) {
                    walk.node(child, below, 1);
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

    pub(super) fn for_each_payload(&self, guard: &Guard, f: impl FnMut(&[u8], u32, [u8; 4])) {
        let mut walk = PreWalk {
            data_size: self.data_size,
            path: [0; key::DATA_SIZE_MAX],
            visit: f,
            guard,
        };
        walk.node(&self.root, 0, 1);
    }

    /// The first prefix after `after` in post-order (children before their
    /// parents: ascending last address, then longer first); the first of all
    /// for `None`.
    pub fn next_after(&self, after: Option<(&[u8], u32)>, guard: &Guard) -> Result<Option<Found>> {
        let mut data = [0; key::DATA_SIZE_MAX];
        Ok(self
            .next_after_in(after, &mut data, guard)?
            .map(|(prefixlen, payload)| Found {
                data: data[..self.data_size].to_vec(),
                prefixlen,
                payload,
            }))
    }

    /// `next_after` without allocating: the prefix's length and payload,
    /// its data (host bits zero) in `data[..data_size]`. Walks down the
    /// path to `after`'s place, then on from there: O(depth) nodes, each
    /// read in place (`node::next_post`).
    pub(super) fn next_after_in(
        &self,
        after: Option<(&[u8], u32)>,
        data: &mut [u8; key::DATA_SIZE_MAX],
        guard: &Guard,
    ) -> Result<Option<(u32, [u8; 4])>> {
        let ds = self.data_size;
        let mut walk = PostWalk {
            data_size: ds,
            bound: None,
            path: data,
            guard,
        };
        Ok(match after {
            Some((d, len)) => {
                if d.len() != ds || len as usize > 8 * ds {
                    self.masked(d, len)?; // the error
                }
                // The walk starts on the path to the bound's last address.
                walk.path[..ds].copy_from_slice(d);
                set_host_bits(&mut walk.path[..ds], len);
                walk.bound = Some(len);
                walk.below(&self.root, 0)
            }
            None => walk.first(&self.root, 0, 0),
        })
    }
}

/// Writes the bytes that lead from a node at `depth` to its child at
/// byte `b` with edge `skip` into `path`; returns the child's depth.
fn enter(path: &mut [u8], depth: usize, b: u8, skip: Skip) -> usize {
    path[depth] = b;
    for (i, s) in skip.bytes().enumerate() {
        path[depth + 1 + i] = s;
    }
    depth + 1 + skip.len()
}

/// Writes the data of the prefix at `idx` of the node at `depth` into
/// `path` (which holds the node's bytes): its byte there, then zeroes.
/// Returns its length.
fn prefix_at(path: &mut [u8], depth: usize, idx: usize) -> u32 {
    let (l, lo, _) = index_range(idx);
    path[depth] = lo as u8;
    path[depth + 1..].fill(0);
    8 * depth as u32 + l
}

/// A pre-order walk calling `visit` with each prefix's data, length and
/// payload.
struct PreWalk<'a, F> {
    data_size: usize,
    /// The key bytes that lead to the node walked (what follows is
    /// scratch).
    path: [u8; key::DATA_SIZE_MAX],
    visit: F,
    guard: &'a Guard,
}

impl<F: FnMut(&[u8], u32, [u8; 4])> PreWalk<'_, F> {
    /// The prefixes under index `idx` of `node`, entered at `depth`.
    fn node(&mut self, node: &Node, depth: usize, idx: usize) {
        let guard = self.guard;
        for unit in PreOrder::new(node.data(guard), node.children(guard), idx) {
            match unit {
                Unit::Prefix(i, payload) => {
                    let path = &mut self.path[..self.data_size];
                    let prefixlen = prefix_at(path, depth, i);
                    (self.visit)(path, prefixlen, payload);
                }
                Unit::Child(b, child) => {
                    let below = enter(&mut self.path, depth, b, child.skip);
                    self.node(child, below, 1);
                }
            }
        }
    }
}

/// A search for the first prefix after a bound in post-order.
struct PostWalk<'a> {
    data_size: usize,
    /// The length of the prefix to start after.
    bound: Option<u32>,
    /// The key bytes that lead to the node walked (what follows is
    /// scratch); the answer's data once found. Going down to the bound,
    /// the bound's last address: each node on its path reads the next
    /// bytes before the walk leaves the path.
    path: &'a mut [u8; key::DATA_SIZE_MAX],
    guard: &'a Guard,
}

/// A prefix found: its length and payload (its data is in the path).
type Hit = Option<(u32, [u8; 4])>;

impl PostWalk<'_> {
    /// The first prefix after the bound at or below `node`, entered at
    /// `depth` on the bound's path (`path` is the bound's last address).
    fn below(&mut self, node: &Node, depth: usize) -> Hit {
        let len = self.bound.expect("a bound");
        let at = (len.max(1) as usize - 1) / 8;
        let guard = self.guard;
        let (data, children) = (node.data(guard), node.children(guard));
        let last = &self.path[..self.data_size];
        let from = if depth == at {
            // The bound's own node: after the bound's index.
            post_key(prefix_index(len - 8 * depth as u32, last[depth])) + 1
        } else {
            let b = last[depth];
            let child = children
                .filter(|ch| ch.bits.get(b as usize))
                // SAFETY: the bit says the entry exists.
                .map(|ch| unsafe { ch.node(ch.bits.rank(b as usize)) });
            if let Some(child) = child {
                // The child's subtree lies wholly after the bound if its
                // edge's bytes are above the bound's, wholly before if
                // below; if equal, the bound is in it, or ends inside
                // the edge and so comes after all of it.
                let below = depth + 1 + child.skip.len();
                let edge = child
                    .skip
                    .bytes()
                    .cmp(last[depth + 1..below].iter().copied());
                let found = match edge {
                    Cmp::Greater => {
                        enter(&mut self.path[..], depth, b, child.skip);
                        self.first(child, below, 0)
                    }
                    Cmp::Equal if below <= at => self.below(child, below),
                    _ => None,
                };
                if found.is_some() {
                    return found;
                }
            }
            child_post_key(b) + 1
        };
        self.scan(data, children, depth, from)
    }

    /// The first prefix at or below `node`, entered at `depth`, whose
    /// post-order key in `node` is `from` or more.
    fn first(&mut self, node: &Node, depth: usize, from: u16) -> Hit {
        let guard = self.guard;
        self.scan(node.data(guard), node.children(guard), depth, from)
    }

    /// `first`, in a node whose blocks were read once, on entry.
    fn scan(
        &mut self,
        data: &DataBlock,
        children: Option<Children<'_>>,
        depth: usize,
        mut from: u16,
    ) -> Hit {
        while let Some((key, unit)) = next_post(data, children, from) {
            match unit {
                Unit::Prefix(idx, payload) => {
                    let prefixlen = prefix_at(&mut self.path[..self.data_size], depth, idx);
                    return Some((prefixlen, payload));
                }
                Unit::Child(b, child) => {
                    let below = enter(&mut self.path[..], depth, b, child.skip);
                    // A child may hold no prefix for a moment (a writer
                    // removing it): then go on after it.
                    let found = self.first(child, below, 0);
                    if found.is_some() {
                        return found;
                    }
                }
            }
            from = key + 1;
        }
        None
    }
}

/// Sets every bit from `prefixlen` on: the last address of the prefix.
fn set_host_bits(data: &mut [u8], prefixlen: u32) {
    let len = prefixlen as usize;
    let full = len / 8;
    if full < data.len() {
        data[full] |= 0xffu8.checked_shr((len % 8) as u32).unwrap_or(0);
        data[full + 1..].fill(0xff);
    }
}
