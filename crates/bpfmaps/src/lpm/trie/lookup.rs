//! The reader's side: one walk down from the root (or the direct index)
//! to the run that answers, and the get family built on it.

use bytemuck::Pod;

use super::{Found, LpmTrie, Value};
use crate::core::error::{Error, Result};
use crate::core::reclaim::Guard;
use crate::lpm::direct::{FromSlot, GROUP};
use crate::lpm::node::{Answer, Hit, Leaf, Node};

impl LpmTrie {
    /// The answer (leaf or hit) of the longest prefix matching `addr`
    /// (full length).
    #[inline(always)]
    fn lookup<R: FromSlot>(&self, addr: &[u8], guard: &Guard) -> R {
        match self.direct.get() {
            // The index exists only for keys of 3 bytes or more.
            Some(direct) => match direct.start(addr, guard) {
                Ok(node) => self.walk(node, 2, addr, guard),
                Err(leaf) => leaf,
            },
            None => self.walk(&self.root, 0, addr, guard),
        }
    }

    /// The lookup of `addr` from `node`, entered at `depth`.
    #[inline(always)]
    fn walk<'g, R: Answer>(
        &self,
        mut node: &'g Node,
        mut depth: usize,
        addr: &[u8],
        guard: &'g Guard,
    ) -> R {
        loop {
            // `node` was entered at `depth`: first the bytes its edge skips.
            let skip = node.skip;
            if !skip.is_none() {
                if !skip.matches(&addr[depth..]) {
                    return R::from_leaf(node.data(guard).default.load());
                }
                depth += skip.len();
            }
            let b = addr[depth];
            match node.child(b, guard) {
                Some(child) => {
                    node = child;
                    depth += 1;
                }
                None => {
                    let data = node.data(guard);
                    return R::from_run(data, data.run_of(b));
                }
            }
        }
    }

    /// The values of the longest prefixes matching each of `addrs` into
    /// `out` (`None` for no match, or an address of the wrong length), as
    /// `get` would give them. A loop of `get` overlaps only as many lookups
    /// as the CPU's reorder window holds; this one runs the lookups of a
    /// group of 32 in stages, each fetching what the next one reads (index
    /// slots, then block headers, then runs), so their cache misses
    /// overlap. `EINVAL` if `out` is shorter than `addrs`.
    pub fn get_many<'g, A: AsRef<[u8]>>(
        &'g self,
        addrs: &[A],
        guard: &'g Guard,
        out: &mut [Option<Value<'g>>],
    ) -> Result<()> {
        self.lookup_many(addrs, guard, out, |hit| self.answer(hit, guard))
    }

    /// `get_many` with each value copied out as a `V`, as `get_as` gives
    /// it (all `None` if `V` is not `value_size` bytes). `EINVAL` if `out`
    /// is shorter than `addrs`.
    pub fn get_many_as<V: Pod, A: AsRef<[u8]>>(
        &self,
        addrs: &[A],
        guard: &Guard,
        out: &mut [Option<V>],
    ) -> Result<()> {
        if size_of::<V>() != self.value_size {
            return self.lookup_many(addrs, guard, out, |_: Hit| None);
        }
        self.lookup_many(addrs, guard, out, |hit| self.answer_as(hit, guard))
    }

    /// The staged lookups behind `get_many` and `get_many_as`: `answer`
    /// turns each hit into an output (an address of the wrong length
    /// gets `answer(Hit::NONE)`).
    #[inline(always)]
    fn lookup_many<A: AsRef<[u8]>, T>(
        &self,
        addrs: &[A],
        guard: &Guard,
        out: &mut [T],
        answer: impl Fn(Hit) -> T,
    ) -> Result<()> {
        if out.len() < addrs.len() {
            return Err(Error::invalid(format!(
                "{} addresses but room for {} answers",
                addrs.len(),
                out.len()
            )));
        }
        let one = |a: &[u8]| {
            answer(if a.len() == self.data_size {
                self.lookup(a, guard)
            } else {
                Hit::NONE
            })
        };
        let Some(direct) = self.direct.get() else {
            for (a, o) in addrs.iter().zip(out.iter_mut()) {
                *o = one(a.as_ref());
            }
            return Ok(());
        };
        let mut starts = [Err(Hit::NONE); GROUP];
        for (group, outs) in addrs.chunks(GROUP).zip(out.chunks_mut(GROUP)) {
            if group.iter().any(|a| a.as_ref().len() != self.data_size) {
                for (a, o) in group.iter().zip(outs.iter_mut()) {
                    *o = one(a.as_ref());
                }
                continue;
            }
            let starts = &mut starts[..group.len()];
            // Every address has data_size >= 3 bytes (the index exists).
            direct.start_group(group, guard, starts);
            for ((a, start), o) in group.iter().zip(starts.iter()).zip(outs.iter_mut()) {
                *o = answer(match *start {
                    Err(hit) => hit,
                    Ok(node) => self.walk(node, 2, a.as_ref(), guard),
                });
            }
        }
        Ok(())
    }

    /// `get`'s answer from where a lookup ended.
    #[inline(always)]
    fn answer<'g>(&'g self, hit: Hit, guard: &'g Guard) -> Option<Value<'g>> {
        (!hit.is_none()).then(|| self.value(hit.payload(), guard))
    }

    /// `get_as`'s answer from where a lookup ended (`V` is `value_size`
    /// bytes). Values of up to 4 bytes are made from the payload whether
    /// it matched or not, so the caller's test of the answer can be a
    /// conditional move instead of a branch.
    #[inline(always)]
    fn answer_as<V: Pod>(&self, hit: Hit, guard: &Guard) -> Option<V> {
        if size_of::<V>() <= 4 {
            let value = bytemuck::pod_read_unaligned(&hit.payload()[..size_of::<V>()]);
            (!hit.is_none()).then_some(value)
        } else {
            (!hit.is_none())
                .then(|| bytemuck::pod_read_unaligned(&self.value(hit.payload(), guard)))
        }
    }

    /// The value a payload stands for.
    #[inline(always)]
    pub(super) fn value<'g>(&'g self, payload: [u8; 4], guard: &'g Guard) -> Value<'g> {
        if self.inline_values {
            Value::Inline {
                bytes: payload,
                len: self.value_size as u8,
            }
        } else {
            // SAFETY: a payload read from the trie under `guard` is a live
            // route id (its slot is released a grace period after the
            // payload stops naming it).
            Value::Slot(unsafe { self.routes.value(u32::from_ne_bytes(payload), guard) })
        }
    }

    /// The value of the longest prefix matching `addr` (a full-length
    /// address of `data_size` bytes). Lock-free. An address of the wrong
    /// length matches nothing. To read values of up to 4 bytes in a loop,
    /// `get_as` is faster for random addresses (see there).
    // Always inlined: callers' loops then keep the trie's fields in
    // registers and overlap more lookups.
    #[inline(always)]
    pub fn get<'g>(&'g self, addr: &[u8], guard: &'g Guard) -> Option<Value<'g>> {
        if addr.len() != self.data_size {
            return None;
        }
        self.answer(self.lookup(addr, guard), guard)
    }

    /// The value of the longest prefix matching `addr`, copied out as a
    /// `V`: a plain-old-data type of the map's `value_size` bytes (`u32`,
    /// `[u8; 6]`, ...). `None` when nothing matches, when `addr` has the
    /// wrong length, or when `V` is not `value_size` bytes. Lock-free.
    ///
    /// ```
    /// use bpfmaps::lpm::LpmTrie;
    ///
    /// let routes = LpmTrie::new(4, 4, 1024)?;
    /// routes.insert(&[10, 0, 0, 0], 8, &7u32.to_ne_bytes(), 0)?;
    /// let guard = bpfmaps::pin();
    /// assert_eq!(routes.get_as::<u32>(&[10, 1, 2, 3], &guard), Some(7));
    /// assert_eq!(routes.get_as::<u32>(&[11, 1, 2, 3], &guard), None);
    /// assert_eq!(routes.get_as::<u64>(&[10, 1, 2, 3], &guard), None); // not 4 bytes
    /// # Ok::<(), bpfmaps::Error>(())
    /// ```
    ///
    /// Why beside `get`: for values of up to 4 bytes the answer is made
    /// from the leaf without branching on whether anything matched, so a
    /// caller's `if let Some(v) = trie.get_as(..)` over many addresses can
    /// compile to a conditional move. Through `get`'s `Value` it stays a
    /// branch, which mispredicts whenever matches and misses mix (random
    /// addresses) and throws away the lookups in flight behind it.
    #[inline(always)]
    pub fn get_as<V: Pod>(&self, addr: &[u8], guard: &Guard) -> Option<V> {
        if addr.len() != self.data_size || size_of::<V>() != self.value_size {
            return None;
        }
        self.answer_as(self.lookup(addr, guard), guard)
    }

    /// The longest prefix matching `addr`: its length and value.
    // Always inlined: callers' loops then keep the trie's fields in
    // registers and overlap more lookups.
    #[inline(always)]
    pub fn longest_match<'g>(&'g self, addr: &[u8], guard: &'g Guard) -> Option<(u32, Value<'g>)> {
        if addr.len() != self.data_size {
            return None;
        }
        let leaf: Leaf = self.lookup(addr, guard);
        (!leaf.is_none()).then(|| (leaf.prefixlen, self.value(leaf.payload, guard)))
    }

    /// The value of a prefix returned by a query, read under `guard`. (For
    /// values over 4 bytes, a `Found` kept past the guard it came from may
    /// name a recycled slot; the bytes are then those of another route.)
    pub fn value_of<'g>(&'g self, found: &Found, guard: &'g Guard) -> Value<'g> {
        self.value(found.payload, guard)
    }
}
