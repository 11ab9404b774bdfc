//! [`WildcardMap`]'s writer: inserts and removes (a bucket's chain
//! edited and published again), loads of whole rule sets, and the splits,
//! merges and exit bounds that shape the tables; one writer at a time.

use super::*;

impl WildcardMap {
    /// Stores `value` for `rule` under update `flags` (`BPF_ANY`,
    /// `BPF_NOEXIST`, `BPF_EXIST`). `E2BIG` when a new rule finds the map
    /// holding `max_entries`; `EINVAL` for a rule of another schema.
    pub fn insert(&self, rule: &Rule, value: &[u8], flags: u64) -> Result<()> {
        self.insert_flagged(rule, value, UpdateFlag::from_bits(flags)?)
    }

    /// [`insert`](Self::insert) with its flag decoded.
    pub(in crate::wildcard) fn insert_flagged(
        &self,
        rule: &Rule,
        value: &[u8],
        flag: UpdateFlag,
    ) -> Result<()> {
        self.check_rule(rule)?;
        check_len("value", value.len(), self.value_size)?;
        if let Some(index) = &self.index {
            if index.insert(rule, value, flag, self.max_entries as usize)? {
                self.len.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(());
        }
        let mut w = self.writer.lock();
        let guard = &pin();
        let entry = || Entry::shared(rule, value);
        match (w.placed.get(rule).copied(), flag) {
            (Some(_), UpdateFlag::NoExist) => Err(Error::Exists),
            (None, UpdateFlag::Exist) => Err(Error::NotFound),
            (Some(id), _) => {
                w.replace(id, entry(), guard);
                Ok(())
            }
            (None, _) => {
                if self.len() >= self.max_entries as usize {
                    return Err(Error::Full);
                }
                self.add(&mut w, entry(), false, guard);
                self.len.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        }
    }

    /// Inserts every rule of `rules` with its value under `flags`, as a
    /// rule set is loaded: all or nothing (every rule is checked first:
    /// `EINVAL` for a rule of another schema or a value of another size,
    /// `EEXIST` with `BPF_NOEXIST` for a rule held or given twice,
    /// `ENOENT` with `BPF_EXIST` for one not held, `E2BIG` past
    /// `max_entries`; a rule given twice otherwise keeps its last value,
    /// as inserts in turn would).
    ///
    /// The new rules go in in a scrambled (but fixed) order, and a split
    /// moves every rule of its table that fits the new one. Rules inserted
    /// in priority order, one at a time, shape the tables after the first
    /// rules (the tables made for them, then split for their neighbours);
    /// a scrambled order shapes them after the whole set, as the
    /// reference's loader (which shuffles the rules) does. On the
    /// ClassBench sets that is about half the tables and half the probes
    /// a packet makes (docs/benchmarks.md, "Loading a rule set"). Then
    /// tables merge into coarser ones their rules fit, and rules of a
    /// priority two tables share move into one, where buckets stay short
    /// (Cilium's wildcard policies of 1,000 rules: 8 tables to 4, 4.7
    /// probes a packet to 1.7; its mixed ones of 100K: 2.1 to 1.3;
    /// docs/benchmarks.md, "Tables merged after a load"), or, where the
    /// tied rules fit neither table, gather into a table of their own
    /// (its mixed ones of 1,000: 2.4 probes a packet to 1.3; "Exact
    /// fields split whole; tied priorities gathered"). Last, each rule's
    /// exit bound is worked out over every rule held, so that a probe
    /// stops where no later table can beat its match (`exits.rs`; ipc1
    /// 10K: 4.7 tables probed a packet to 3.2, at twice the load's
    /// time), until the next insert of a rule that was not held then (a
    /// rule taken out and put back keeps its bound).
    ///
    /// Readers see the rules appear one by one, each whole. It returns
    /// after a grace period (as `synchronize_rcu`), having freed what it
    /// replaced, so that the updates after it do not pay for that; a
    /// caller holding a guard of its own skips the wait.
    pub fn load<R, V>(&self, rules: impl IntoIterator<Item = (R, V)>, flags: u64) -> Result<()>
    where
        R: std::borrow::Borrow<Rule>,
        V: AsRef<[u8]>,
    {
        use rand::SeedableRng;
        use rand::seq::SliceRandom;
        let flag = UpdateFlag::from_bits(flags)?;
        let mut given = Vec::new();
        for (rule, value) in rules {
            let (rule, value) = (rule.borrow(), value.as_ref());
            self.check_rule(rule)?;
            check_len("value", value.len(), self.value_size)?;
            given.push(Entry::shared(rule, value));
        }
        let given = last_of_each(self.schema.fields(), given, flag)?;
        if let Some(index) = &self.index {
            let fresh = index.load(given, flag, self.max_entries as usize)?;
            self.len.fetch_add(fresh, Ordering::Relaxed);
            return Ok(());
        }
        let mut w = self.writer.lock();
        let pinned = pin();
        let guard = &pinned;
        let empty = w.placed.is_empty();
        count_fresh(
            given.iter().map(|e| &e.rule),
            flag,
            |r| !empty && w.placed.contains_key(r),
            self.len(),
            self.max_entries as usize,
        )?;
        // Into an empty map every rule is new (`given` holds each once).
        w.placing_later = empty;
        let mut entries = given;
        entries.shuffle(&mut rand::rngs::StdRng::seed_from_u64(LOAD_SEED));
        let first_new = w.next_id;
        for entry in entries {
            let held = if empty {
                None
            } else {
                w.placed.get(&entry.rule).copied()
            };
            match held {
                Some(id) => w.replace(id, entry, guard),
                None => {
                    self.add(&mut w, entry, true, guard);
                    self.len.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        self.absorb(&mut w, first_new, guard);
        self.set_exits(&mut w, guard);
        self.carve_loaded(&mut w, first_new, guard);
        if empty {
            w.place_all(guard);
        }
        drop(w);
        // The buckets and tables the load replaced are freed now, on the
        // loader's time (a grace period, then this thread's deferred
        // frees), not by whichever update or lookup pins next.
        drop(pinned);
        synchronize();
        Ok(())
    }

    /// Removes `rule`; `ENOENT` if it is not held.
    pub fn remove(&self, rule: &Rule) -> Result<()> {
        self.take_with(rule, |_| ())
    }

    /// Removes `rule` and returns its value.
    pub fn take(&self, rule: &Rule) -> Result<Vec<u8>> {
        self.take_with(rule, <[u8]>::to_vec)
    }

    /// Removes `rule` and returns what `read` makes of its value (a
    /// removal copies nothing).
    fn take_with<T>(&self, rule: &Rule, read: impl FnOnce(&[u8]) -> T) -> Result<T> {
        self.check_rule(rule)?;
        if let Some(index) = &self.index {
            let value = index.take(rule)?;
            self.len.fetch_sub(1, Ordering::Relaxed);
            return Ok(read(&value));
        }
        let mut w = self.writer.lock();
        let guard = &pin();
        self.ask_for_bucket(&w, rule, guard);
        let (Placed(entry), id) = w.placed.remove_entry(rule).ok_or(Error::NotFound)?;
        let voided = w.exits_after_taking(&entry, id);
        w.rule_order_changed(|o| o.remove(rule));
        let state = w.tables.get_mut(&id).expect("a placed rule's table");
        assert!(chain_remove(&state.table, rule, guard), "a placed rule");
        let before = state.best();
        count(&mut state.priorities, rule.priority, false);
        state.rules -= 1;
        let (after, empty) = (state.best(), state.rules == 0);
        if empty {
            w.tables.remove(&id);
        }
        // An emptied table's best is `u32::MAX`: it leaves the list.
        if before != after || voided {
            self.publish(&mut w, guard);
        }
        self.len.fetch_sub(1, Ordering::Relaxed);
        Ok(read(&entry.value))
    }

    /// Asks for the first lines of the chain of `rule`'s bucket in the
    /// table it most likely sits in, the first in published order it
    /// fits (where [`add`](Self::add) puts a new rule; 89-100 % of the
    /// removes of the ClassBench sets' cold passes), before the index of
    /// rules says which table holds it: the chain's misses then overlap
    /// the index's. A wrong guess costs a few wasted prefetches. The cold
    /// pass of updates took 4-14 % less time (docs/benchmarks.md, "The
    /// bucket asked for before the index").
    fn ask_for_bucket(&self, w: &Writer, rule: &Rule, guard: &Guard) {
        let Some(id) = w.first_fit(&rule.prefix_lengths(&self.schema)) else {
            return;
        };
        let chain = w.tables[&id]
            .table
            .slot(&lows(rule))
            .load(Ordering::Relaxed, guard);
        if !chain.is_null() {
            for line in 0..CHAIN_LINES_ASKED {
                prefetch(std::ptr::without_provenance::<u8>(
                    chain.into_usize() + 64 * line,
                ));
            }
        }
    }

    /// Removes every rule.
    pub fn clear(&self) {
        if let Some(index) = &self.index {
            // Under the index's writer lock, so no update runs between.
            index.clear(|| self.len.store(0, Ordering::Relaxed));
            return;
        }
        let mut w = self.writer.lock();
        let guard = &pin();
        w.tables.clear();
        w.placed.clear();
        w.rule_order = None;
        w.exits = false;
        w.forget_gone();
        self.publish(&mut w, guard);
        self.len.store(0, Ordering::Relaxed);
    }

    fn check_rule(&self, rule: &Rule) -> Result<()> {
        let fields = self.schema.fields();
        let ok = rule.bounds().len() == fields.len()
            && rule
                .bounds()
                .iter()
                .zip(fields)
                .all(|(&(lo, hi), f)| lo <= hi && hi <= f.max());
        if ok {
            Ok(())
        } else {
            Err(Error::invalid("a rule of another schema"))
        }
    }

    /// Places a new rule: the first table (in published order) it fits,
    /// or a new one; splits the table if the rule's bucket overflows
    /// (moving the table's fitting rules if `whole`, else the bucket's).
    fn add(&self, w: &mut Writer, entry: Arc<Entry>, whole: bool, guard: &Guard) {
        let fixed = entry.rule.prefix_lengths(&self.schema);
        let (voided, was_in) = w.exits_after_adding(&entry);
        // A rule put back goes back to its table, if it is still there:
        // elsewhere it could lower a table's best priority, and packets
        // whose bounds stopped them before that table would probe it.
        let was_in = was_in
            .filter(|id| (w.tables.get(id)).is_some_and(|state| fits(&fixed, &state.table.tuple)));
        let (id, fresh) = match was_in.or_else(|| w.first_fit(&fixed)) {
            Some(id) => (id, false),
            None => {
                let tuple = relax(&fixed, &self.schema);
                (w.new_table(Table::new(tuple, &self.schema, 8)), true)
            }
        };
        let placed = Arc::clone(&entry);
        let rule = &placed.rule;
        let lone = w.tables.len() == 1;
        let state = w.tables.get_mut(&id).expect("its table");
        let before = state.best();
        let bucket = chain_insert(&state.table, entry, guard);
        count(&mut state.priorities, rule.priority, true);
        state.rules += 1;
        // Outgrown, twice the buckets: a new table, published below with
        // a new view.
        let grown = outgrows(state.rules, &state.table);
        if grown {
            let slots = slots_for(state.rules);
            state.table = self.rebuilt(&state.table, slots, &[], lone, guard);
        }
        let after = state.best();
        w.place_new(&placed, id);
        if bucket > self.collision_limit {
            let colliding = bucket_of(&w.tables[&id].table, rule, guard);
            if self.split(w, id, &colliding, whole, guard) {
                return; // published
            }
        }
        if fresh || grown || before != after || voided {
            self.publish(w, guard);
        }
    }

    /// Splits the overflowing bucket of table `id` (its rules are
    /// `colliding`) as the reference does: hash more bits of the field
    /// where the colliding rules' prefix lengths differ most (half way
    /// between their least and most), in a table of that tuple (made if
    /// there is none), which takes the colliding rules that fit it, or
    /// if `whole` (a [`load`](Self::load)) every rule of the table that
    /// fits it, as the reference's split does, while the table holds at
    /// most [`WHOLE_SPLIT_MAX`] rules. Otherwise the work is the
    /// bucket's, not the table's. The moved rules go into the target's
    /// buckets (and are published with it) before they leave the
    /// source's, so a reader finds each in one table or both, never in
    /// neither. False when no tuple separates them (nothing changes).
    fn split(
        &self,
        w: &mut Writer,
        id: u64,
        colliding: &[Arc<Entry>],
        whole: bool,
        guard: &Guard,
    ) -> bool {
        let n = self.schema.fields().len();
        let tuples: Vec<Tuple> = colliding
            .iter()
            .map(|e| e.rule.prefix_lengths(&self.schema))
            .collect();
        let mut least = tuples[0];
        let mut most = tuples[0];
        for t in &tuples {
            for d in 0..n {
                least[d] = least[d].min(t[d]);
                most[d] = most[d].max(t[d]);
            }
        }
        let Some(d) = (0..n)
            .filter(|&d| most[d] > least[d])
            .max_by_key(|&d| (most[d] - least[d], std::cmp::Reverse(d)))
        else {
            return false;
        };
        let mut target = least;
        target[d] = match self.schema.fields()[d].kind {
            // An exact field's rules fix all its bits or none: fewer bits
            // split nothing more, and leave the bucket longer.
            FieldKind::Match | FieldKind::WildcardMatch => most[d],
            FieldKind::Prefix | FieldKind::Range => least[d] + (most[d] - least[d]).div_ceil(2),
        };
        let source = Arc::clone(&w.tables[&id].table);
        if target == source.tuple {
            return false;
        }
        let whole = whole && w.tables[&id].rules <= WHOLE_SPLIT_MAX;
        let moving: Vec<Arc<Entry>> = if whole {
            table_entries(&source, guard)
                .into_iter()
                .filter(|e| fits(&e.rule.prefix_lengths(&self.schema), &target))
                .collect()
        } else {
            colliding
                .iter()
                .zip(&tuples)
                .filter(|(_, t)| fits(t, &target))
                .map(|(e, _)| Arc::clone(e))
                .collect()
        };
        if moving.is_empty() {
            return false;
        }
        // Into the target: a new table, a rebuilt larger one, or its
        // buckets one chain at a time.
        let existing = w
            .tables
            .iter()
            .find(|(_, s)| s.table.tuple == target)
            .map(|(&tid, _)| tid);
        let target_id = match existing {
            None => w.new_table(self.build_table(target, slots_for(moving.len()), &moving, false)),
            Some(t) => {
                let state = w.tables.get_mut(&t).expect("target");
                if outgrows(state.rules + moving.len(), &state.table) {
                    let slots = slots_for(state.rules + moving.len());
                    state.table = self.rebuilt(&state.table, slots, &moving, false, guard);
                } else {
                    for e in &moving {
                        chain_insert(&state.table, Arc::clone(e), guard);
                    }
                }
                t
            }
        };
        let state = w.tables.get_mut(&target_id).expect("target");
        for e in &moving {
            count(&mut state.priorities, e.rule.priority, true);
            state.rules += 1;
        }
        w.place(&moving, target_id);
        self.publish(w, guard);
        // Readers of the view before this one probe again if they see
        // a rule gone (`read_view`).
        self.moves.fetch_add(1, Ordering::Release);
        // Out of the source: each bucket they leave rewritten once (a
        // bucket's split empties one; a whole-table split, many).
        let moved: std::collections::HashSet<*const Entry> =
            moving.iter().map(Arc::as_ptr).collect();
        let mut left: Vec<usize> = moving
            .iter()
            .map(|e| source.slot_index(&lows(&e.rule)))
            .collect();
        left.sort_unstable();
        left.dedup();
        for i in left {
            let slot = &source.slots[i];
            let staying: Vec<Arc<Entry>> = chain_entries(slot, guard)
                .into_iter()
                .filter(|e| !moved.contains(&Arc::as_ptr(e)))
                .collect();
            publish_chain(slot, staying, source.width, guard);
        }
        let state = w.tables.get_mut(&id).expect("source");
        let before = state.best();
        for e in &moving {
            count(&mut state.priorities, e.rule.priority, false);
            state.rules -= 1;
        }
        if state.rules == 0 {
            w.tables.remove(&id);
            self.publish(w, guard);
        } else if state.best() != before {
            self.publish(w, guard);
        }
        true
    }

    /// Moves rules between tables once a load is in, two ways:
    /// - a table whose rules all fit another table's tuple merges into
    ///   it: one probe fewer for the packets that reach both;
    /// - of two tables with the same best priority, the rules of that
    ///   priority in one move to the other, if they all fit its tuple:
    ///   the first table's best rises past the second's, and a packet
    ///   matched at that priority no longer probes both (a tie sends the
    ///   probe on; a table whose best is worse ends it).
    ///
    /// Either only while the receiving table keeps every bucket within
    /// the collision limit and the bucket a rule sits in holds at most
    /// [`ABSORB_MEAN`] rules on average. A packet probes every table
    /// whose best priority is at or below its answer's; neither move adds
    /// to those tables at any priority, so no packet probes more. At
    /// least one of the two tables is one this load made (its id
    /// `first_new` or later), so a small load into a large map does not
    /// count its old tables again. Then gathers tied rules
    /// ([`gather_ties`](Self::gather_ties)) and, last, splits crowded
    /// tables ([`split_crowded`](Self::split_crowded)). Publishes the
    /// result once.
    ///
    /// Why: rules arrive in any order, so a table made for the first
    /// rule of a shape may be finer than the table its later kin needed
    /// (Cilium's exact ports, then port blocks of 16: one table hashing
    /// 16 bits of the port and one hashing 12), and rules of one priority
    /// spread over the tables that existed as they came (Cilium's exact
    /// rules among the identity rules' table and the ports'). Once the
    /// whole set is in, which moves keep buckets short is known.
    pub(super) fn absorb(&self, w: &mut Writer, first_new: u64, guard: &Guard) {
        let mut changed = false;
        // A gather can open a merge, and a merge a tie: a few rounds
        // settle them (a bound, should they chase each other).
        for _ in 0..GATHER_ROUNDS {
            changed |= self.merge_and_move(w, first_new, guard);
            if !self.gather_ties(w, first_new, guard) {
                break;
            }
            changed = true;
        }
        changed |= self.split_crowded(w, first_new, guard);
        if changed {
            self.publish(w, guard);
        }
    }

    /// Moves the chains of each table this load made (an id from
    /// `first_new` on) that holds some not carved from its block into
    /// one new block, one after another in bucket order: a load inserts
    /// its rules one at a time, and those after a table's last growth
    /// got chains allocated alone, up to half of them. (Tables the map
    /// held before are left as they are: a small load into a big map
    /// copies only what it made.) The copies replace the chains in
    /// their buckets one by one (each the same rules, so a reader sees
    /// the one or the other alike), and the originals are retired. A
    /// copy of every chain's words, no entry read: a rebuild of each
    /// table instead took a million exact rules' load 4.6 s, against
    /// 2.9-3.4 s without it and with this copy (docs/benchmarks.md,
    /// "Each table's chains in one block").
    ///
    /// A table with homes ([`HOMED_SLOTS`](super::chain::HOMED_SLOTS))
    /// gets the new block's, and the view is published again so that
    /// probes ask for them.
    fn carve_loaded(&self, w: &mut Writer, first_new: u64, guard: &Guard) {
        let mut homed = false;
        let lone = w.tables.len() == 1;
        for state in w.tables.range(first_new..).map(|(_, state)| state) {
            let table = &state.table;
            let held: Vec<(usize, &Chain)> = table
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, slot)| {
                    // SAFETY: under the guard (the writer's).
                    unsafe { slot.load(Ordering::Acquire, guard).as_ref() }.map(|c| (i, c))
                })
                .collect();
            if held.iter().all(|(_, chain)| chain.carved_from().is_some()) {
                continue;
            }
            let slots = table.slots.len();
            let Some(copies) =
                Chain::carve_copies(&held, slots, self.homed(slots, state.rules, lone))
            else {
                continue;
            };
            for ((i, _), copy) in held.into_iter().zip(copies.chains) {
                install(&table.slots[i], Some(copy), guard);
            }
            table.homes.store(copies.homes, Ordering::Relaxed);
            homed |= copies.homes != 0;
        }
        if homed {
            self.publish(w, guard);
        }
    }

    /// Whether a table of `slots` buckets holding `rules` rules gets
    /// homes for its chains ([`homes_from`](Self::homes_from)), or, when
    /// it is the map's only table (`lone`), by its rules
    /// ([`lone_homes_over`](Self::lone_homes_over)).
    fn homed(&self, slots: usize, rules: usize, lone: bool) -> bool {
        slots >= self.homes_from || (lone && rules > self.lone_homes_over)
    }

    /// A fresh, unpublished table like `table` (its tuple) with `slots`
    /// buckets, holding `table`'s entries and `more`; `lone` if it is the
    /// map's only table.
    fn rebuilt(
        &self,
        table: &Table,
        slots: usize,
        more: &[Arc<Entry>],
        lone: bool,
        guard: &Guard,
    ) -> Arc<Table> {
        let mut all = table_entries(table, guard);
        all.extend(more.iter().cloned());
        Arc::new(self.build_table(table.tuple, slots, &all, lone))
    }

    /// A fresh, unpublished table of `tuple` with `slots` buckets holding
    /// `entries`, with homes if [`homed`](Self::homed) (`lone`: it is the
    /// map's only table).
    fn build_table(&self, tuple: Tuple, slots: usize, entries: &[Arc<Entry>], lone: bool) -> Table {
        let table = Table::new(tuple, &self.schema, slots);
        let mut chains: Vec<Vec<Arc<Entry>>> = vec![Vec::new(); slots];
        for e in entries {
            let i = bucket_index(table.hash(&lows(&e.rule)), slots);
            chains[i].push(Arc::clone(e));
        }
        // The chains of the buckets that hold rules, carved from one block
        // in bucket order.
        let buckets: Vec<(usize, Vec<Arc<Entry>>)> = chains
            .into_iter()
            .enumerate()
            .filter(|(_, chain)| !chain.is_empty())
            .map(|(i, mut chain)| {
                chain.sort_by(|a, b| a.rule.cmp(&b.rule));
                (i, chain)
            })
            .collect();
        let held: Vec<usize> = buckets.iter().map(|(i, _)| *i).collect();
        let carved = Chain::carve(
            buckets,
            slots,
            self.homed(slots, entries.len(), lone),
            table.width,
        );
        for (i, chain) in held.into_iter().zip(carved.chains) {
            table.slots[i].store(chain, Ordering::Relaxed);
        }
        table.homes.store(carved.homes, Ordering::Relaxed);
        table
    }

    /// Works out every rule's exit bound (`exits.rs`) and publishes the
    /// chains whose bounds changed, then a view whose probes read them.
    /// Nothing to skip with one table; nothing to do for a layout
    /// without the word.
    fn set_exits(&self, w: &mut Writer, guard: &Guard) {
        // Bounds over the rules held now: a rule taken out before is not
        // of that set.
        w.forget_gone();
        if w.tables.len() < 2 || !self.layout.exit {
            return;
        }
        let ids: Vec<u64> = w.tables.keys().copied().collect();
        let tables: Vec<TableRules> = ids
            .iter()
            .map(|id| TableRules {
                tuple: w.tables[id].table.tuple,
                rules: table_entries(&w.tables[id].table, guard),
            })
            .collect();
        let bounds = exit_bounds(
            &tables,
            Width::of(&self.schema),
            |rule| rule.prefix_lengths(&self.schema),
            |t, rule, visit| {
                let slot = w.tables[&ids[t]].table.slot(&lows(rule));
                // SAFETY: under the writer's guard.
                if let Some(chain) = unsafe { slot.load(Ordering::Acquire, guard).as_ref() } {
                    chain.entry_refs().for_each(visit);
                }
            },
        );
        let mut changed = std::collections::HashSet::<_, foldhash::fast::RandomState>::default();
        w.exits = false;
        for (table, bounds) in tables.iter().zip(&bounds) {
            for (e, &bound) in table.rules.iter().zip(bounds) {
                w.exits |= bound < e.rule.priority;
                if e.exit.swap(bound, Ordering::Relaxed) != bound {
                    changed.insert(Arc::as_ptr(e));
                }
            }
        }
        for id in &ids {
            let table = &w.tables[id].table;
            for slot in table.slots.iter() {
                // SAFETY: under the writer's guard.
                let chain = unsafe { slot.load(Ordering::Acquire, guard).as_ref() };
                if chain.is_some_and(|c| {
                    c.entry_refs()
                        .any(|e| changed.contains(&std::ptr::from_ref(e)))
                }) {
                    publish_chain(slot, chain_entries(slot, guard), table.width, guard);
                }
            }
        }
        self.publish(w, guard);
    }

    /// Splits crowded tables this load made while a split pays (at most
    /// [`CROWDED_SPLITS`] of them, the best first): the rules that fix at
    /// least `L` bits of one field go to a new table hashing `L` bits of
    /// it, the rest stay. Unpublished; whether it split.
    ///
    /// Why: a table hashes what its first rule fixed (relaxed), and may
    /// hash too little of its later rules to tell them apart, with no
    /// bucket over the collision limit to split it: acl1_10k's rules of
    /// a /21-/32 source and a /14-/32 destination shared 127 buckets of a
    /// table hashing 21 bits of the source alone, 28 rules in a rule's
    /// bucket (docs/benchmarks.md, "Crowded tables split").
    fn split_crowded(&self, w: &mut Writer, first_new: u64, guard: &Guard) -> bool {
        // Each table's best split, kept while it is unchanged: a split
        // moves rules between two tables only, so the others' scores
        // stand (unless their split's tuple came to exist).
        let mut scored: HashMap<u64, Option<(usize, Tuple)>> = HashMap::new();
        let mut changed = false;
        for _ in 0..CROWDED_SPLITS {
            let stale: Vec<u64> = w
                .tables
                .keys()
                .copied()
                .filter(|&id| id >= first_new)
                .filter(|id| {
                    scored
                        .get(id)
                        .is_none_or(|s| s.is_some_and(|(_, t)| w.has_table_of(&t)))
                })
                .collect();
            for id in stale {
                scored.insert(id, self.best_split(w, id, guard));
            }
            let Some((from, tuple)) = scored
                .iter()
                .filter_map(|(&id, s)| s.map(|(gain, t)| (gain, id, t)))
                .max()
                .map(|(_, id, t)| (id, t))
            else {
                break;
            };
            let (moving, staying): (Vec<_>, Vec<_>) = table_entries(&w.tables[&from].table, guard)
                .into_iter()
                .partition(|e| fits(&e.rule.prefix_lengths(&self.schema), &tuple));
            let into = w.new_table(Table::new(tuple, &self.schema, 8));
            self.move_rules(w, (from, staying), (into, &moving), guard);
            scored.remove(&from);
            changed = true;
        }
        changed
    }

    /// The split of table `id` that saves the most rules scanned, and
    /// how many, if any does ([`split_crowded`](Self::split_crowded)).
    /// Scored with packets in proportion to rules: a rule's packet scans
    /// about half its bucket (its rules summed over the rules, halved);
    /// a packet probes each half whose best priority is at or above its
    /// answer's, and a probe costs [`PROBE_COST`] rules scanned. Only
    /// tables whose rules' buckets hold over [`ABSORB_MEAN`] on average,
    /// of at most [`WHOLE_SPLIT_MAX`] rules (a bound on the work).
    fn best_split(&self, w: &Writer, id: u64, guard: &Guard) -> Option<(usize, Tuple)> {
        let state = &w.tables[&id];
        if state.rules > WHOLE_SPLIT_MAX {
            return None;
        }
        let entries = table_entries(&state.table, guard);
        let fixed: Vec<Tuple> = entries
            .iter()
            .map(|e| e.rule.prefix_lengths(&self.schema))
            .collect();
        let lows: Vec<_> = entries.iter().map(|e| lows(&e.rule)).collect();
        let all: Vec<usize> = (0..entries.len()).collect();
        let now = self.crowding(state.table.tuple, &lows, &all);
        if now <= ABSORB_MEAN * entries.len() {
            return None;
        }
        // The other tables' rules' priorities, sorted: how many answer
        // below a priority is a binary search.
        let mut others: Vec<u32> = w
            .tables
            .iter()
            .filter(|&(&other, _)| other != id)
            .flat_map(|(_, s)| s.priorities.iter())
            .flat_map(|(&p, &n)| std::iter::repeat_n(p, n))
            .collect();
        others.sort_unstable();
        let mut best = None;
        for d in 0..self.schema.fields().len() {
            let mut lengths: Vec<u8> = fixed
                .iter()
                .map(|t| t[d])
                .filter(|&l| l > state.table.tuple[d])
                .collect();
            lengths.sort_unstable();
            lengths.dedup();
            for l in lengths {
                let mut tuple = state.table.tuple;
                tuple[d] = l;
                if w.has_table_of(&tuple) {
                    continue;
                }
                let (moving, staying): (Vec<usize>, Vec<usize>) =
                    all.iter().partition(|&&i| fits(&fixed[i], &tuple));
                let best_of = |ix: &[usize]| {
                    ix.iter()
                        .map(|&i| entries[i].rule.priority)
                        .min()
                        .unwrap_or(u32::MAX)
                };
                let (best_moving, best_staying) = (best_of(&moving), best_of(&staying));
                let answered_below = |half: &[usize], best: u32| {
                    half.iter()
                        .filter(|&&i| entries[i].rule.priority >= best)
                        .count()
                };
                // Packets answered by other tables below both halves'
                // best probe both, where they probed one table.
                let through =
                    others.len() - others.partition_point(|&p| p < best_moving.max(best_staying));
                let probes = through
                    + answered_below(&moving, best_staying)
                    + answered_below(&staying, best_moving);
                let cost = self.crowding(tuple, &lows, &moving)
                    + self.crowding(state.table.tuple, &lows, &staying)
                    + 2 * PROBE_COST * probes;
                if cost < now && best.is_none_or(|(gain, _)| now - cost > gain) {
                    best = Some((now - cost, tuple));
                }
            }
        }
        best
    }

    /// The rules at `which` (of those whose low bounds are `lows`), in a
    /// table of `tuple` and [`slots_for`] them: the sum over them of
    /// their bucket's rules.
    fn crowding(&self, tuple: Tuple, lows: &[[u128; MAX_FIELDS]], which: &[usize]) -> usize {
        let table = Table::new(tuple, &self.schema, 1);
        let slots = slots_for(which.len());
        let mut held = vec![0u32; slots];
        for &i in which {
            held[bucket_index(table.hash(&lows[i]), slots)] += 1;
        }
        held.iter().map(|&n| (n as usize) * (n as usize)).sum()
    }

    /// [`absorb`](Self::absorb)'s merges and moves, until none is left;
    /// unpublished. Whether it made any.
    fn merge_and_move(&self, w: &mut Writer, first_new: u64, guard: &Guard) -> bool {
        // Pairs (from, into) refused: unchanged tables are not counted
        // again.
        let mut refused = std::collections::HashSet::new();
        let mut changed = false;
        loop {
            // The smallest tables first: the cheapest to move.
            let mut ids: Vec<u64> = w.tables.keys().copied().collect();
            ids.sort_by_key(|id| (w.tables[id].rules, *id));
            let mut found = None;
            'search: for &from in &ids {
                for &into in &ids {
                    if into == from || from.max(into) < first_new || refused.contains(&(from, into))
                    {
                        continue;
                    }
                    let (source, target) = (&w.tables[&from], &w.tables[&into]);
                    let tuple = target.table.tuple;
                    let whole = fits(&source.table.tuple, &tuple);
                    if !whole && source.best() != target.best() {
                        continue;
                    }
                    // The whole table, or its rules of the tied priority.
                    let (moving, staying): (Vec<_>, Vec<_>) = table_entries(&source.table, guard)
                        .into_iter()
                        .partition(|e| whole || e.rule.priority == source.best());
                    let all_fit = whole
                        || moving
                            .iter()
                            .all(|e| fits(&e.rule.prefix_lengths(&self.schema), &tuple));
                    if all_fit && stays_short(&moving, target, self.collision_limit, guard) {
                        found = Some((from, into, moving, staying));
                        break 'search;
                    }
                    refused.insert((from, into));
                }
            }
            let Some((from, into, moving, staying)) = found else {
                break;
            };
            refused.retain(|&(a, b)| ![a, b].iter().any(|t| *t == from || *t == into));
            self.move_rules(w, (from, staying), (into, &moving), guard);
            changed = true;
        }
        changed
    }

    /// Where tables tie on their best priority and no move settled it
    /// (the tied rules fit neither table's tuple, or would crowd its
    /// buckets), gathers the rules of that priority from all of them
    /// into a new table whose tuple each fits (per field, the fewest
    /// bits any of them fixes), if its buckets stay short. A packet
    /// answered at that priority then probes one table, not each of the
    /// tied ones; one answered below it probes at most one table more,
    /// so only where the tied rules (times the tables less one)
    /// outnumber the tables' other rules.
    ///
    /// Cilium's mixed policies: exact rules, some with port blocks,
    /// spread over the identity rules' table and the ports' (which
    /// neither takes whole). One gather, unpublished; whether it made
    /// one.
    fn gather_ties(&self, w: &mut Writer, first_new: u64, guard: &Guard) -> bool {
        let mut by_best: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for (&id, state) in &w.tables {
            by_best.entry(state.best()).or_default().push(id);
        }
        let n = self.schema.fields().len();
        for (best, ids) in by_best {
            if ids.len() < 2 || ids.iter().all(|&id| id < first_new) {
                continue;
            }
            let mut moving = Vec::new();
            let mut staying = Vec::new();
            for &id in &ids {
                let (tied, rest): (Vec<_>, Vec<_>) = table_entries(&w.tables[&id].table, guard)
                    .into_iter()
                    .partition(|e| e.rule.priority == best);
                moving.extend(tied);
                staying.push((id, rest));
            }
            // A packet answered at `best` saves a probe of each tied
            // table but one; one answered worse may pay one more (the new
            // table). With packets in proportion to rules, worth it when
            // the first outweigh the second.
            let worse: usize = staying.iter().map(|(_, rest)| rest.len()).sum();
            if moving.len() * (ids.len() - 1) < worse {
                continue;
            }
            let mut meet = moving[0].rule.prefix_lengths(&self.schema);
            for e in &moving[1..] {
                let t = e.rule.prefix_lengths(&self.schema);
                for d in 0..n {
                    meet[d] = meet[d].min(t[d]);
                }
            }
            if w.has_table_of(&meet) {
                continue;
            }
            let table = self.build_table(meet, slots_for(moving.len()), &moving, false);
            if !is_short(&table, self.collision_limit, guard) {
                continue;
            }
            for (id, rest) in staying {
                let state = w.tables.get_mut(&id).expect("a tied table");
                state.priorities.remove(&best);
                state.rules = rest.len();
                if rest.is_empty() {
                    w.tables.remove(&id);
                } else {
                    let tuple = state.table.tuple;
                    let slots = slots_for(rest.len());
                    state.table = Arc::new(self.build_table(tuple, slots, &rest, false));
                }
            }
            let id = w.new_table(table);
            let state = w.tables.get_mut(&id).expect("the new table");
            state.priorities.insert(best, moving.len());
            state.rules = moving.len();
            w.place(&moving, id);
            return true;
        }
        false
    }

    /// Moves `moving` (rules of table `from` that fit table `into`) into
    /// `into`, `from` keeping `staying` (the rest of its rules): both
    /// tables rebuilt unpublished (`from` dropped if emptied), the books
    /// updated; the caller publishes.
    fn move_rules(
        &self,
        w: &mut Writer,
        (from, staying): (u64, Vec<Arc<Entry>>),
        (into, moving): (u64, &[Arc<Entry>]),
        guard: &Guard,
    ) {
        let source = w.tables.get_mut(&from).expect("the source");
        for e in moving {
            count(&mut source.priorities, e.rule.priority, false);
        }
        source.rules -= moving.len();
        if staying.is_empty() {
            w.tables.remove(&from);
        } else {
            let tuple = source.table.tuple;
            let slots = slots_for(staying.len());
            source.table = Arc::new(self.build_table(tuple, slots, &staying, false));
        }
        let lone = w.tables.len() == 1;
        let target = w.tables.get_mut(&into).expect("the target");
        let slots = merged_slots(moving.len(), target);
        target.table = self.rebuilt(&target.table, slots, moving, lone, guard);
        for e in moving {
            count(&mut target.priorities, e.rule.priority, true);
        }
        target.rules += moving.len();
        w.place(moving, into);
    }

    /// Panics unless the writer's books agree with the tables: each
    /// table's rule count and priorities with its chains, each rule in
    /// the bucket it hashes to, of the table `placed` names, once; the
    /// published order that of the tables' best priorities; the rule
    /// order, if built, every held rule once, in order. The tests
    /// call it after every change, so a broken split fails there, not
    /// later as a wrong answer or a runaway table.
    #[cfg(test)]
    pub(crate) fn check_structure(&self) {
        if let Some(index) = &self.index {
            index.check_structure(self.len());
            return;
        }
        let w = self.writer.lock();
        let guard = &pin();
        let mut total = 0;
        for (&id, state) in &w.tables {
            let mut priorities = BTreeMap::new();
            let mut rules = 0;
            for (i, slot) in state.table.slots.iter().enumerate() {
                for e in chain_entries(slot, guard) {
                    assert_eq!(
                        state.table.slot_index(&lows(&e.rule)),
                        i,
                        "a rule in another bucket"
                    );
                    assert!(fits(
                        &e.rule.prefix_lengths(&self.schema),
                        &state.table.tuple
                    ));
                    assert_eq!(
                        w.placed.get(&e.rule),
                        Some(&id),
                        "a rule its table does not own"
                    );
                    count(&mut priorities, e.rule.priority, true);
                    rules += 1;
                }
            }
            assert!(rules > 0, "an empty table kept");
            assert_eq!(
                (rules, &priorities),
                (state.rules, &state.priorities),
                "a table's books"
            );
            total += rules;
        }
        assert_eq!(
            (total, w.placed.len()),
            (self.len(), self.len()),
            "rules counted"
        );
        // Rules taken out and remembered: only while the bounds hold,
        // none held, no more than the cap.
        assert!(
            w.exits || w.gone.is_empty(),
            "rules remembered for void bounds"
        );
        assert!(
            w.gone.len() <= gone_most(w.placed.len()),
            "too many remembered"
        );
        for e in w.gone.entries() {
            assert!(
                !w.placed.contains_key(&e.rule),
                "a rule remembered and held"
            );
        }
        if let Some(order) = &w.rule_order {
            let mut held: Vec<&Rule> = w.placed.keys().map(|p| &p.0.rule).collect();
            held.sort_unstable();
            let (mut walked, mut at) = (Vec::new(), None);
            while let Some(r) = order.next(at, |r| w.placed.contains_key(r)) {
                walked.push(r);
                at = Some(r);
            }
            assert_eq!(walked, held, "the rule order");
        }
        let mut order: Vec<(u32, u64)> = w.tables.iter().map(|(&id, s)| (s.best(), id)).collect();
        order.sort_unstable();
        let published: Vec<(u64, Tuple)> = order
            .iter()
            .map(|&(_, id)| (id, w.tables[&id].table.tuple))
            .collect();
        assert_eq!(published, w.order);
        // SAFETY: under the guard.
        let view = unsafe { self.view.load(Ordering::Acquire, guard).deref() };
        assert_eq!(view.tables.len(), w.order.len(), "the published view");
        for ((best, table), (id, _)) in view.tables.iter().zip(&w.order) {
            assert_eq!(*best, w.tables[id].best());
            assert!(
                Arc::ptr_eq(table, &w.tables[id].table),
                "a table not published"
            );
        }
        assert_eq!(view.exits, w.exits, "the published exit bounds");
        self.check_exits(&w, guard);
    }

    /// Panics unless every rule's chains hold its entry's exit bound, and
    /// the bound is no worse than its priority and, while the bounds
    /// hold, no better than any rule that overlaps it and comes before
    /// it.
    /// Every pair of rules: for maps of up to 2,048 rules.
    #[cfg(test)]
    fn check_exits(&self, w: &Writer, guard: &Guard) {
        fn words_hold<W: Word>(chain: &Chain, layout: &Layout, fields: usize) {
            for (words, e) in chain.rules::<W>(layout).zip(chain.entry_refs()) {
                let held = W::of(u128::from(e.exit.load(Ordering::Relaxed)));
                assert!(words[exit_word(fields)] == held, "a chain's exit word");
            }
        }
        let fields = self.schema.fields().len();
        let mut held: Vec<Arc<Entry>> = Vec::new();
        for state in w.tables.values() {
            for slot in state.table.slots.iter() {
                // SAFETY: under the guard.
                let chain = unsafe { slot.load(Ordering::Acquire, guard).as_ref() };
                if let Some(chain) = chain.filter(|_| self.layout.exit) {
                    match state.table.width {
                        Width::W32 => words_hold::<u32>(chain, &self.layout, fields),
                        Width::W64 => words_hold::<u64>(chain, &self.layout, fields),
                        Width::W128 => words_hold::<u128>(chain, &self.layout, fields),
                    }
                }
                held.extend(chain_entries(slot, guard));
            }
        }
        if held.len() > 2048 {
            return;
        }
        for r in &held {
            let exit = r.exit.load(Ordering::Relaxed);
            assert!(exit <= r.rule.priority, "an exit bound past its priority");
            if !w.exits {
                break;
            }
            for q in &held {
                if q.rule < r.rule && crate::wildcard::exits::overlap(&q.rule, &r.rule) {
                    assert!(
                        exit >= q.rule.priority,
                        "{:?}'s exit bound {exit} misses {:?}",
                        r.rule,
                        q.rule
                    );
                }
            }
        }
    }

    /// Publishes the tables in order of their best priority.
    fn publish(&self, w: &mut Writer, guard: &Guard) {
        let mut order: Vec<(u32, u64)> = w.tables.iter().map(|(&id, s)| (s.best(), id)).collect();
        order.sort_unstable();
        w.order = order
            .iter()
            .map(|&(_, id)| (id, w.tables[&id].table.tuple))
            .collect();
        let view = View::new(
            order
                .iter()
                .map(|&(best, id)| (best, Arc::clone(&w.tables[&id].table)))
                .collect(),
            w.exits,
        );
        let old = self.view.swap(Owned::new(view), Ordering::AcqRel, guard);
        // SAFETY: unreachable for new readers; freed after the grace
        // period of those that may hold it.
        unsafe { guard.defer_destroy(old) };
    }
}

impl Writer {
    /// A new rule, `entry`: the exit bounds, which do not count it, no
    /// longer hold, unless it is a rule taken out since they were worked
    /// out. Whether the view needs publishing for it, and the table a
    /// rule put back was in.
    ///
    /// Why a rule put back keeps them: the bounds were worked out over a
    /// set of rules, and while every rule held is of that set, each
    /// rule's bound still counts every held rule that overlaps it and
    /// comes before it (a removal only leaves a bound too high). A rule
    /// taken out and put back (a policy's rule toggled, the suites'
    /// updates) is of the set, with the bound it had then. Any other
    /// rule voids them all until the next load.
    fn exits_after_adding(&mut self, entry: &Entry) -> (bool, Option<u64>) {
        if !self.exits {
            return (false, None);
        }
        if let Some((was, id)) = self.gone.take(&entry.rule) {
            entry
                .exit
                .store(was.exit.load(Ordering::Relaxed), Ordering::Relaxed);
            return (false, Some(id));
        }
        self.exits = false;
        self.forget_gone();
        (true, None)
    }

    /// Records `entry`'s rule as taken out of table `id`, with its bound,
    /// while the bounds hold; past [`gone_most`] of them (a map emptied
    /// rule by rule), the bounds are voided instead. Whether the view
    /// needs publishing for it.
    fn exits_after_taking(&mut self, entry: &Arc<Entry>, id: u64) -> bool {
        if !self.exits {
            return false;
        }
        if self.gone.len() >= gone_most(self.placed.len()) {
            self.exits = false;
            self.forget_gone();
            return true;
        }
        self.gone.insert(Arc::clone(entry), id);
        false
    }

    /// Empties [`gone`](Self::gone) (the bounds were voided or worked out
    /// again), its entries freed off the writer's path.
    fn forget_gone(&mut self) {
        if !self.gone.is_empty() {
            drop_in_background(std::mem::take(&mut self.gone));
        }
    }

    /// Records a new rule, held in table `id` (unless a load records
    /// every rule at its end, [`place_all`](Self::place_all)).
    fn place_new(&mut self, entry: &Arc<Entry>, id: u64) {
        if !self.placing_later {
            self.placed.insert(Placed(Arc::clone(entry)), id);
            self.rule_order_changed(|o| o.add(entry));
        }
    }

    /// Tells the rule order of a change (if there is one), and drops it
    /// once the changes wear it out.
    fn rule_order_changed(&mut self, change: impl FnOnce(&mut RuleOrder)) {
        if let Some(order) = &mut self.rule_order {
            change(order);
            if order.worn() {
                self.rule_order = None;
            }
        }
    }

    /// Records that `moved` rules are now in table `id` (as
    /// [`place_new`](Self::place_new)).
    fn place(&mut self, moved: &[Arc<Entry>], id: u64) {
        if self.placing_later {
            return;
        }
        for e in moved {
            *self.placed.get_mut(&e.rule).expect("a placed rule") = id;
        }
    }

    /// Builds `placed` from the tables, for a load into an empty map
    /// that left it alone: each of the load's searches of it (is the
    /// rule held? then its insert, and one for each rule a split or a
    /// merge moves) compared rules whose bounds sit in boxes scattered
    /// in memory: loads of 100K and 1M Cilium rules took 1.11-1.71x
    /// the time (docs/benchmarks.md, "Loading into an empty map", when
    /// the index was a B-tree).
    // A `Placed` hashes and compares by its entry's rule alone, never by
    // the exit bound the entry's atomic holds.
    #[allow(clippy::mutable_key_type)]
    fn place_all(&mut self, guard: &Guard) {
        let rules = self.tables.values().map(|s| s.rules).sum();
        let mut placed = HashMap::with_capacity_and_hasher(rules, Default::default());
        for (&id, state) in &self.tables {
            for e in table_entries(&state.table, guard) {
                placed.insert(Placed(e), id);
            }
        }
        self.placed = placed;
        self.rule_order = None;
        self.placing_later = false;
    }

    /// Puts `entry` in place of the entry of its rule, held in table `id`.
    fn replace(&mut self, id: u64, entry: Arc<Entry>, guard: &Guard) {
        // The index holds the entry in use, not the one replaced.
        let (Placed(was), _) = self.placed.remove_entry(&entry.rule).expect("a held rule");
        // The same rule: its bound still holds.
        entry
            .exit
            .store(was.exit.load(Ordering::Relaxed), Ordering::Relaxed);
        chain_replace(&self.tables[&id].table, Arc::clone(&entry), guard);
        self.rule_order_changed(|o| o.replace(&entry));
        self.placed.insert(Placed(entry), id);
    }

    /// The first table, in published order, whose tuple a rule fixing
    /// `fixed` bits fits: where [`WildcardMap::add`] puts a new rule, and
    /// so where a remove first looks for one.
    fn first_fit(&self, fixed: &Tuple) -> Option<u64> {
        self.order
            .iter()
            .find(|(id, tuple)| fits(fixed, tuple) && self.tables.contains_key(id))
            .map(|&(id, _)| id)
    }

    /// Whether a table of `tuple` exists.
    fn has_table_of(&self, tuple: &Tuple) -> bool {
        self.tables.values().any(|s| s.table.tuple == *tuple)
    }

    fn new_table(&mut self, table: Table) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.tables.insert(
            id,
            TableState {
                table: Arc::new(table),
                priorities: BTreeMap::new(),
                rules: 0,
            },
        );
        id
    }
}
