//! Mining one line: the line and exact-match caches, the search of the line's buckets, joining
//! (differing positions become `<*>`), word slots and their merges, creating a template (and
//! evicting the coldest when full); and `lookup`, the id `add` would give without mining.

use super::compare::{Cmp, compare, generalise};
use super::index::{collapse, collapsed_hash, line_buckets, slot_key};
use super::{
    MAX_LINE_BYTES, Template, TemplateId, TemplateMiner, is_wild, keyed, line_hash, shown, truncate,
};
use crate::patterns::hash::{fast_hash, stable_hash};
use crate::patterns::mask::mask_line;

/// Templates compared per search bucket (see [`super::index::bucket`]), newest first: a line
/// that matches nothing costs at most six buckets of this many comparisons.
const MAX_SCAN: usize = 256;

/// What a search for a line's template found.
#[derive(Debug, Clone, Copy)]
enum Found {
    Join(TemplateId),
    /// A template that differs from the line in one word slot at this position.
    Slot(TemplateId, usize),
    Nothing,
}

impl TemplateMiner {
    /// Mines one line (raw with a header, or message only) and returns its template's id.
    pub fn add(&mut self, line: &str) -> TemplateId {
        self.add_keyed("", line)
    }

    /// Mines one line under a key (a failure's exception type and stack fingerprint): lines
    /// of different keys never share a template, and the key is part of the template's id.
    /// The key is not part of the template's text. `add_keyed("", line)` is `add(line)`.
    pub fn add_keyed(&mut self, key: &str, line: &str) -> TemplateId {
        self.tick += 1;
        let line = truncate(line, MAX_LINE_BYTES);
        let lh = line_hash(key, line);
        if let Some(&id) = self.lines.get(&lh) {
            let id = self.resolve(id);
            if let Some(t) = self.templates.get_mut(&id.0) {
                t.count += 1;
                t.last_seen = self.tick;
                return id;
            }
        }
        let mut masked = std::mem::take(&mut self.scratch);
        mask_line(line, &mut masked);
        keyed(key, &mut masked);
        let id = self.add_masked(&masked);
        self.scratch = masked;
        if self.lines.len() >= self.cap().saturating_mul(4).max(1024) {
            self.lines.clear();
        }
        self.lines.insert(lh, id);
        id
    }

    fn add_masked(&mut self, masked: &str) -> TemplateId {
        let h = fast_hash(masked.as_bytes());
        if let Some(&id) = self.exact.get(&h) {
            let id = self.resolve(id);
            if let Some(t) = self.templates.get_mut(&id.0) {
                t.count += 1;
                t.last_seen = self.tick;
                return id;
            }
        }
        let tokens: Vec<&str> = if masked.is_empty() {
            Vec::new()
        } else {
            masked.split(' ').collect()
        };
        let id = match self.find(&tokens) {
            Some(id) => self.join(id, &tokens),
            None => self.create(masked, &tokens),
        };
        if self.exact.len() >= self.cap().saturating_mul(4).max(1024) {
            self.exact.clear();
        }
        self.exact.insert(h, id);
        id
    }

    fn find(&mut self, tokens: &[&str]) -> Option<TemplateId> {
        self.pending_slot = None;
        match self.search(tokens) {
            Found::Join(id) => Some(id),
            Found::Slot(id, pos) => self.count_slot_word(id, pos, tokens[pos]),
            Found::Nothing => None,
        }
    }

    /// The template `tokens` join (read-only): a template of the same shape, a word slot, or a
    /// template of the same collapsed form.
    fn search(&self, tokens: &[&str]) -> Found {
        let thr = self.config.sim_threshold;
        let similar = |eq: usize, diff: usize| eq >= 1 && eq as f32 >= thr * (eq + diff) as f32;
        let mut best: Option<(usize, u64, TemplateId)> = None;
        let mut slot: Option<(usize, TemplateId, usize)> = None;
        let buckets = line_buckets(tokens);
        for ids in buckets.iter().flatten().filter_map(|k| self.by_len.get(k)) {
            for &id in ids.iter().rev().take(MAX_SCAN) {
                let Some(t) = self.templates.get(&id.0) else {
                    continue;
                };
                if t.tokens.len() != tokens.len() {
                    continue;
                }
                match compare(&t.tokens, tokens) {
                    Cmp::Join { eq, diff } => {
                        let ok = similar(eq, diff)
                            || (t.num_const == 0 && tokens.iter().all(|x| is_wild(x)));
                        if ok && best.is_none_or(|(e, c, _)| (eq, t.count) > (e, c)) {
                            best = Some((eq, t.count, id));
                        }
                    }
                    Cmp::Slot { eq, diff, pos } => {
                        if similar(eq, diff + 1) && slot.is_none_or(|(e, _, _)| eq > e) {
                            slot = Some((eq, id, pos));
                        }
                    }
                    Cmp::Apart => {}
                }
            }
        }
        if let Some((_, _, id)) = best {
            return Found::Join(id);
        }
        if let Some((_, id, pos)) = slot {
            return Found::Slot(id, pos);
        }
        // A variable spanning a different number of tokens: compare the collapsed forms.
        let cl = collapse(tokens);
        let ck = collapsed_hash(tokens);
        if let Some(&id) = self.collapsed.get(&ck) {
            let id = self.resolve(id);
            if let Some(t) = self.templates.get(&id.0)
                && t.tokens.len() != tokens.len()
                && collapsed_hash(&t.tokens) == ck
            {
                return Found::Join(id);
            }
        }
        let cl_refs: Vec<&str> = cl.iter().map(String::as_str).collect();
        let mut best: Option<(usize, u64, TemplateId)> = None;
        for ids in line_buckets(&cl)
            .iter()
            .flatten()
            .filter_map(|k| self.by_clen.get(k))
        {
            for &id in ids.iter().rev().take(MAX_SCAN) {
                let Some(t) = self.templates.get(&id.0) else {
                    continue;
                };
                if t.tokens.len() == tokens.len()
                    || (t.tokens.len() == cl.len() && cl.len() == tokens.len())
                {
                    continue;
                }
                let tc: Vec<Box<str>> = collapse(&t.tokens).into_iter().map(Box::from).collect();
                if tc.len() != cl.len() {
                    continue;
                }
                if let Cmp::Join { eq, diff } = compare(&tc, &cl_refs)
                    && similar(eq, diff)
                    && best.is_none_or(|(e, c, _)| (eq, t.count) > (e, c))
                {
                    best = Some((eq, t.count, id));
                }
            }
        }
        best.map_or(Found::Nothing, |(_, _, id)| Found::Join(id))
    }

    /// The template id [`TemplateMiner::add`] would give `line` now, without mining it (no
    /// count, no cache, no slot changes): the template it joins, the template a word slot it
    /// completes merges into, or the id a new template from it would take. Used to tag a
    /// failure at ingest while the line itself is mined later (docs/SCALING.md, shared miner).
    pub fn lookup(&self, line: &str) -> TemplateId {
        self.lookup_keyed("", line)
    }

    /// [`TemplateMiner::lookup`] for [`TemplateMiner::add_keyed`].
    pub fn lookup_keyed(&self, key: &str, line: &str) -> TemplateId {
        let line = truncate(line, MAX_LINE_BYTES);
        if let Some(&id) = self.lines.get(&line_hash(key, line)) {
            let id = self.resolve(id);
            if self.templates.contains_key(&id.0) {
                return id;
            }
        }
        let mut masked = String::with_capacity(line.len());
        mask_line(line, &mut masked);
        keyed(key, &mut masked);
        if let Some(&id) = self.exact.get(&fast_hash(masked.as_bytes())) {
            let id = self.resolve(id);
            if self.templates.contains_key(&id.0) {
                return id;
            }
        }
        let tokens: Vec<&str> = if masked.is_empty() {
            Vec::new()
        } else {
            masked.split(' ').collect()
        };
        match self.search(&tokens) {
            Found::Join(id) => return id,
            Found::Slot(id, pos) => {
                if let Some(t) = self.templates.get(&id.0) {
                    let key = slot_key(&t.tokens, pos);
                    let own = stable_hash(&[t.tokens[pos].as_bytes()]);
                    let w = stable_hash(&[tokens[pos].as_bytes()]);
                    let (members, mut words) =
                        self.slots.get(&key).map_or((Vec::new(), Vec::new()), |s| {
                            (s.members.clone(), s.words.clone())
                        });
                    for x in [own, w] {
                        if !words.contains(&x) {
                            words.push(x);
                        }
                    }
                    if words.len() >= self.config.word_slot_values.max(2) {
                        // The slot completes: its templates merge into the oldest member.
                        let head = members
                            .iter()
                            .chain(std::iter::once(&id))
                            .map(|m| self.resolve(*m))
                            .find(|m| self.templates.contains_key(&m.0));
                        if let Some(head) = head {
                            return head;
                        }
                    }
                }
            }
            Found::Nothing => {}
        }
        self.new_id(&masked)
    }

    /// The id a template created now from `masked` takes (salted past every id in use).
    fn new_id(&self, masked: &str) -> TemplateId {
        let mut raw = stable_hash(&[masked.as_bytes()]);
        while self.templates.contains_key(&raw) || self.aliases.contains_key(&raw) {
            raw = stable_hash(&[&raw.to_le_bytes(), b"salt"]);
        }
        TemplateId(raw)
    }

    /// Counts `word` in the slot at `pos` of template `id`; once the slot has shown enough
    /// words, merges its templates into the oldest and returns it.
    fn count_slot_word(&mut self, id: TemplateId, pos: usize, word: &str) -> Option<TemplateId> {
        let t = self.templates.get(&id.0)?;
        let key = slot_key(&t.tokens, pos);
        let own = stable_hash(&[t.tokens[pos].as_bytes()]);
        let w = stable_hash(&[word.as_bytes()]);
        if self.slots.len() >= self.cap() && !self.slots.contains_key(&key) {
            self.slots.clear();
        }
        let s = self.slots.entry(key).or_default();
        if !s.members.contains(&id) {
            s.members.push(id);
        }
        for x in [own, w] {
            if !s.words.contains(&x) {
                s.words.push(x);
            }
        }
        if s.words.len() < self.config.word_slot_values.max(2) {
            self.pending_slot = Some(key);
            return None;
        }
        let s = self.slots.remove(&key).unwrap_or_default();
        let mut members: Vec<TemplateId> = Vec::new();
        for m in s.members {
            let m = self.resolve(m);
            if self.templates.contains_key(&m.0) && !members.contains(&m) {
                members.push(m);
            }
        }
        let head = *members.first()?;
        for &m in &members[1..] {
            self.merge_into(m, head);
        }
        Some(head)
    }

    /// Merges template `from` into `into`: counts add up, `from` becomes an alias.
    fn merge_into(&mut self, from: TemplateId, into: TemplateId) {
        if from == into {
            return;
        }
        let Some(f) = self.templates.remove(&from.0) else {
            return;
        };
        self.unindex(from, &f.tokens);
        let tick = self.tick;
        let mut reindex = None;
        if let Some(t) = self.templates.get_mut(&into.0) {
            t.count += f.count;
            t.last_seen = t.last_seen.max(f.last_seen).max(tick);
            if t.tokens.len() == f.tokens.len() {
                let old = t.tokens.clone();
                for (slot, tok) in t.tokens.iter_mut().zip(&f.tokens) {
                    if let Some(g) = generalise(slot, tok) {
                        *slot = g.into();
                    }
                }
                t.num_const = t.tokens.iter().filter(|x| !is_wild(x)).count();
                if old != t.tokens {
                    reindex = Some((old, t.tokens.clone()));
                }
            }
        }
        if let Some((old, new)) = reindex {
            self.unindex(into, &old);
            self.index(into, &new);
        }
        self.aliases.insert(from.0, into);
        if self.aliases.len() > self.cap() {
            // Bounded: an alias only saves a lookup (and tells old ids apart); drop them all.
            self.aliases.clear();
        }
        if self.merged.len() < self.cap() {
            self.merged.push((from, into));
        }
    }

    /// Generalises template `id` with a line it matched.
    /// Returns the template's id afterwards (another one when the two became the same).
    fn join(&mut self, id: TemplateId, tokens: &[&str]) -> TemplateId {
        let tick = self.tick;
        let Some(t) = self.templates.get_mut(&id.0) else {
            return id;
        };
        t.count += 1;
        t.last_seen = tick;
        let mut next: Option<Vec<Box<str>>> = None;
        if t.tokens.len() == tokens.len() {
            for (i, tok) in tokens.iter().enumerate() {
                if let Some(g) = generalise(&t.tokens[i], tok) {
                    next.get_or_insert_with(|| t.tokens.clone())[i] = g.into();
                }
            }
        } else {
            // Matched in the collapsed form: the template takes it.
            next = Some(collapse(&t.tokens).into_iter().map(Box::from).collect());
        }
        let Some(new) = next else {
            return id;
        };
        let old = std::mem::replace(&mut t.tokens, new);
        t.num_const = t.tokens.iter().filter(|x| !is_wild(x)).count();
        let (new, seq) = (t.tokens.clone(), t.seq);
        self.unindex(id, &old);
        self.index(id, &new);
        // Generalised into another template's collapsed form (`chrome.exe <*> -` became
        // `<*> <*> -`, which collapses like `<*> -`): the two are one template, the older id.
        let ck = collapsed_hash(&new);
        if let Some(&other) = self.collapsed.get(&ck)
            && other != id
            && let Some(o) = self.templates.get(&other.0)
            && collapsed_hash(&o.tokens) == ck
        {
            let (from, into) = if o.seq < seq {
                (id, other)
            } else {
                (other, id)
            };
            let (ft, it) = (
                self.templates[&from.0].tokens.clone(),
                self.templates[&into.0].tokens.clone(),
            );
            self.merge_into(from, into);
            self.collapsed.insert(ck, into);
            if ft.len() != it.len()
                && let Some(t) = self.templates.get_mut(&into.0)
            {
                // Of different lengths: the survivor takes the collapsed form.
                let c: Vec<Box<str>> = collapse(&t.tokens).into_iter().map(Box::from).collect();
                if c != t.tokens {
                    let old = std::mem::replace(&mut t.tokens, c);
                    t.num_const = t.tokens.iter().filter(|x| !is_wild(x)).count();
                    let new = t.tokens.clone();
                    self.unindex(into, &old);
                    self.index(into, &new);
                }
            }
            return into;
        }
        id
    }

    fn create(&mut self, masked: &str, tokens: &[&str]) -> TemplateId {
        let pending = self.pending_slot.take();
        if self.templates.len() >= self.cap() {
            self.evict();
        }
        let id = self.new_id(masked);
        let raw = id.0;
        self.seq += 1;
        let toks: Vec<Box<str>> = tokens.iter().map(|t| Box::<str>::from(*t)).collect();
        self.index(id, &toks);
        self.templates
            .insert(raw, Template::new(toks, 1, self.tick, self.seq));
        if let Some(key) = pending
            && let Some(s) = self.slots.get_mut(&key)
        {
            s.members.push(id);
        }
        id
    }

    /// Evicts the coldest sixteenth of the templates (least recently seen).
    fn evict(&mut self) {
        let k = (self.templates.len() / 16).max(1);
        let mut ages: Vec<(u64, u64)> = self
            .templates
            .iter()
            .map(|(id, t)| (t.last_seen, *id))
            .collect();
        ages.select_nth_unstable(k - 1);
        let gone: std::collections::HashSet<u64> = ages[..k].iter().map(|(_, id)| *id).collect();
        for id in &gone {
            if let Some(t) = self.templates.remove(id)
                && self.evicted.len() < self.cap().max(1024)
            {
                self.evicted
                    .push((TemplateId(*id), shown(&t.tokens).join(" ")));
            }
        }
        for map in [&mut self.by_len, &mut self.by_clen] {
            map.retain(|_, v| {
                v.retain(|id| !gone.contains(&id.0));
                !v.is_empty()
            });
        }
        self.collapsed.retain(|_, id| !gone.contains(&id.0));
        self.exact.retain(|_, id| !gone.contains(&id.0));
        self.lines.retain(|_, id| !gone.contains(&id.0));
        self.aliases.retain(|_, id| !gone.contains(&id.0));
        self.slots.retain(|_, s| {
            s.members.retain(|id| !gone.contains(&id.0));
            !s.members.is_empty()
        });
        self.num_evictions += gone.len() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::patterns::miner::{KEY_MARK, MinerConfig};

    #[test]
    fn exception_types_are_never_merged_and_keys_never_meet() {
        let mut m = TemplateMiner::default();
        let a = m.add("httpx.ConnectTimeout: timed out");
        let b = m.add("httpx.ReadTimeout: timed out");
        assert_ne!(a, b);
        let c =
            m.add("requests.exceptions.ConnectTimeout: HTTPSConnectionPool(host='a', port=443)");
        let d =
            m.add("requests.exceptions.ConnectionError: HTTPSConnectionPool(host='b', port=443)");
        assert_ne!(c, d);
        assert_eq!(
            m.template(b).as_deref(),
            Some("httpx.ReadTimeout: timed out")
        );
        // A template with a variable at a type's position does not take a type there.
        let v = m.add("call failed with 500");
        assert_ne!(m.add("call failed with RuntimeError"), v);
        // Keys: the same text under two keys, two templates; the key is not shown, survives
        // a state round trip, and `lookup_keyed` agrees with `add_keyed`.
        let k1 = m.add_keyed("RuntimeError@00ff", "engine step failed after 3 ms");
        let k2 = m.add_keyed("ValueError", "engine step failed after 4 ms");
        assert_ne!(k1, k2);
        assert_eq!(
            m.lookup_keyed("ValueError", "engine step failed after 9 ms"),
            k2
        );
        assert_eq!(
            m.add_keyed("ValueError", "engine step failed after 9 ms"),
            k2
        );
        assert_eq!(
            m.template(k1).as_deref(),
            Some("engine step failed after <*> ms")
        );
        assert!(m.templates().iter().all(|t| !t.template.contains(KEY_MARK)));
        let back = TemplateMiner::from_state(m.state()).unwrap();
        assert_eq!(
            back.lookup_keyed("RuntimeError@00ff", "engine step failed after 7 ms"),
            k1
        );
        assert_ne!(back.lookup("engine step failed after 7 ms"), k1);
    }

    fn final_ids(m: &TemplateMiner, ids: &[TemplateId]) -> Vec<TemplateId> {
        ids.iter().map(|i| m.resolve(*i)).collect()
    }

    #[test]
    fn numbers_join_and_a_slot_word_joins_once_it_varies() {
        let mut m = TemplateMiner::default();
        let lines = [
            "tool call to the weather API timed out after 8000 ms",
            "tool call to the hotel API timed out after 5000 ms",
            "tool call to the weather API timed out after 100 ms",
            "KV cache exhausted: no free blocks for seq 12",
            "tool call to the maps API timed out after 7 ms",
            "tool call to the flights API timed out after 9 ms",
        ];
        let ids: Vec<_> = lines.iter().map(|l| m.add(l)).collect();
        assert_eq!(ids[0], ids[2], "numbers are variables");
        assert_ne!(ids[0], ids[1], "two words in the slot: not yet a variable");
        let f = final_ids(&m, &ids);
        assert_eq!(f[0], f[1]);
        assert_eq!(f[0], f[4]);
        assert_eq!(f[0], f[5]);
        assert_eq!(f[0], ids[0], "the oldest template keeps its id");
        assert_ne!(f[0], f[3]);
        assert_eq!(
            m.template(ids[1]).unwrap(),
            "tool call to the <*> API timed out after <*> ms"
        );
        assert_eq!(m.drain_merged(), vec![(ids[1], ids[0])]);
    }

    #[test]
    fn lookup_tells_the_id_add_would_give() {
        let mut m = TemplateMiner::default();
        let lines = [
            "tool call to the weather API timed out after 8000 ms",
            "tool call to the hotel API timed out after 5000 ms",
            "tool call to the weather API timed out after 100 ms",
            "KV cache exhausted: no free blocks for seq 12",
            "tool call to the maps API timed out after 7 ms",
            "tool call to the flights API timed out after 9 ms",
            "user alice logged in from 10.0.0.1",
            "user bob logged in from 10.0.0.2",
        ];
        // New, joining, a slot still counting (a new template), a slot completing (merged into
        // the oldest), a name after `user`: lookup (read-only, `&self`) says what add returns.
        for l in lines {
            let looked = m.lookup(l);
            assert_eq!(m.add(l), looked, "{l}");
        }
        // The slot completed on `maps`: its templates merged into the first one.
        assert_eq!(
            m.lookup("tool call to the trains API timed out after 1 ms"),
            m.lookup(lines[0])
        );
        assert_ne!(m.lookup("disk full on /dev/sda1"), m.lookup(lines[3]));
    }

    #[test]
    fn punctuation_around_a_variable_and_variable_lengths() {
        let mut m = TemplateMiner::default();
        let a = m.add("connection from 1.2.3.4 () at Tue Jul 26 05:47:42 2005");
        let b = m.add("connection from 5.6.7.8 (host-9.example.net) at Fri Jul  1 07:57:30 2005");
        assert_eq!(a, b);
        assert_eq!(m.template(a).unwrap(), "connection from <*> (<*>) at <*>");
        let c = m.add("BLOCK* ask 10.0.0.1:50010 to delete blk_1");
        let d = m.add("BLOCK* ask 10.0.0.2:50010 to delete blk_1 blk_2 blk_-3");
        assert_eq!(c, d);
        assert_eq!(m.template(c).unwrap(), "BLOCK* ask <*> to delete <*>");
        assert_eq!(m.add("BLOCK* ask 10.0.0.3:50010 to delete blk_4 blk_5"), c);
        // Two templates that generalise into the same collapsed form become one (the older).
        let mut m = TemplateMiner::default();
        let short = m.add("a.exe - h.b.com:1 close, lifetime 00:01");
        m.add("b.exe - h.b.com:1 close, lifetime 00:01");
        let long = m.add("a.exe *64 - h.b.com:1 close, lifetime 00:01");
        assert_ne!(long, short);
        let merged = m.add("b.exe *64 - h.b.com:1 close, lifetime 00:01");
        assert_eq!(merged, short);
        assert_eq!(m.resolve(long), short);
        assert_eq!(m.template(long).unwrap(), "<*> - <*> close, lifetime <*>");
    }

    #[test]
    fn memory_is_bounded_and_evictions_are_counted() {
        let mut m = TemplateMiner::new(MinerConfig {
            max_templates: 64,
            ..MinerConfig::default()
        });
        let word = |mut n: usize| {
            let mut s = String::new();
            loop {
                s.push(char::from(b'a' + (n % 26) as u8));
                n /= 26;
                if n == 0 {
                    break s;
                }
            }
        };
        for i in 0..2000usize {
            m.add(&format!("{} {} {}", word(i), word(i + 7919), word(i * 31)));
            assert!(m.num_templates() <= 64);
            assert!(m.exact.len() <= 1024 && m.lines.len() <= 1024);
            assert!(m.slots.len() <= 64 && m.aliases.len() <= 64);
        }
        assert!(m.num_evictions() > 0);
        assert!(!m.drain_evicted().is_empty());
        // The hot template survives eviction.
        let hot = m.add("steady state line");
        for i in 0..500usize {
            m.add("steady state line");
            m.add(&format!(
                "{} {} {}",
                word(i + 5000),
                word(i + 9000),
                word(i * 17)
            ));
        }
        assert_eq!(m.add("steady state line"), hot);
    }

    #[test]
    fn a_huge_line_is_mined_by_its_first_bytes() {
        let mut m = TemplateMiner::default();
        let long = format!("payload {}", "é".repeat(MAX_LINE_BYTES));
        let a = m.add(&long);
        let t = m.template(a).unwrap();
        assert!(t.len() <= MAX_LINE_BYTES, "{}", t.len());
        assert_eq!(m.add(&format!("{long} and more")), a);
    }

    proptest::proptest! {
        #[test]
        fn same_line_twice_gets_the_same_id(lines in proptest::collection::vec("[a-z0-9 ]{0,30}", 1..40)) {
            let mut m = TemplateMiner::new(MinerConfig { max_templates: 1000, ..MinerConfig::default() });
            for l in &lines {
                let a = m.add(l);
                let b = m.add(l);
                proptest::prop_assert_eq!(a, b);
                proptest::prop_assert!(m.template(a).is_some());
            }
        }
    }
}
