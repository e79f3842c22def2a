//! Per-user in-flight counts, bounded.
//!
//! The table holds at most `capacity` users. A user with requests in flight is never evicted
//! (their count must stay exact); a user with none sits in an LRU list and is the first to go
//! when a new user needs the room. The number of *active* users is bounded by the requests in
//! flight, so the table only overflows when more than `capacity` distinct users each have a
//! request running at once: then a new user is admitted *untracked* (fail open, counted) rather
//! than refused for someone else's load. Memory is `O(capacity)` whatever the clients send; every
//! operation is O(1) (a hash lookup plus an intrusive doubly linked list).

use std::collections::HashMap;
use std::sync::Arc;

/// Longest user id the table keeps (longer ids are refused before they get here).
pub const MAX_USER_ID_BYTES: usize = 256;

const NIL: u32 = u32::MAX;

#[derive(Debug)]
struct Node {
    user: Arc<str>,
    in_flight: u32,
    /// Requests refused for this user over the cap while it was tracked.
    refused: u64,
    prev: u32,
    next: u32,
}

/// What [`UserTable::acquire`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    /// Counted; release the slot with [`UserTable::release`] and this index.
    Counted(u32),
    /// At the cap: refused (the user's in-flight count).
    Over(u32),
    /// The table is full of active users: admitted without counting.
    Untracked,
}

/// One entry of [`UserTable::top_offenders`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Offender {
    pub user: String,
    pub in_flight: u32,
    pub refused: u64,
}

/// The bounded user table (see the module docs).
#[derive(Debug)]
pub struct UserTable {
    capacity: usize,
    index: HashMap<Arc<str>, u32>,
    nodes: Vec<Node>,
    /// Slots of evicted nodes, reused before the vector grows.
    free: Vec<u32>,
    /// Idle users, least recently used first.
    head: u32,
    tail: u32,
    /// Users admitted while the table was full of active users.
    pub untracked_total: u64,
    /// Idle users dropped to make room.
    pub evicted_total: u64,
}

impl UserTable {
    pub fn new(capacity: usize) -> UserTable {
        let capacity = capacity.max(1);
        UserTable {
            capacity,
            index: HashMap::with_capacity(capacity.min(1 << 16)),
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            untracked_total: 0,
            evicted_total: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Users tracked now (active and idle).
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Users with at least one request in flight.
    pub fn active(&self) -> usize {
        self.index
            .values()
            .filter(|&&i| self.nodes[i as usize].in_flight > 0)
            .count()
    }

    /// Agent requests in flight over all tracked users.
    pub fn in_flight_total(&self) -> u64 {
        self.index
            .values()
            .map(|&i| u64::from(self.nodes[i as usize].in_flight))
            .sum()
    }

    /// The in-flight count of `user` (0 when untracked).
    pub fn in_flight(&self, user: &str) -> u32 {
        self.index
            .get(user)
            .map_or(0, |&i| self.nodes[i as usize].in_flight)
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next) = {
            let n = &self.nodes[i as usize];
            (n.prev, n.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
        let n = &mut self.nodes[i as usize];
        n.prev = NIL;
        n.next = NIL;
    }

    fn push_idle(&mut self, i: u32) {
        let old_tail = self.tail;
        {
            let n = &mut self.nodes[i as usize];
            n.prev = old_tail;
            n.next = NIL;
        }
        if old_tail == NIL {
            self.head = i;
        } else {
            self.nodes[old_tail as usize].next = i;
        }
        self.tail = i;
    }

    /// Takes one slot for `user` if it has fewer than `cap` in flight.
    pub fn acquire(&mut self, user: &str, cap: u32) -> Acquire {
        if let Some(&i) = self.index.get(user) {
            let n = &self.nodes[i as usize];
            if n.in_flight >= cap {
                self.nodes[i as usize].refused += 1;
                return Acquire::Over(self.nodes[i as usize].in_flight);
            }
            if n.in_flight == 0 {
                self.unlink(i);
            }
            self.nodes[i as usize].in_flight += 1;
            return Acquire::Counted(i);
        }
        if cap == 0 {
            return Acquire::Over(0);
        }
        if self.index.len() >= self.capacity {
            // Evict the least recently used idle user, if any.
            let victim = self.head;
            if victim == NIL {
                self.untracked_total += 1;
                return Acquire::Untracked;
            }
            self.unlink(victim);
            let user = self.nodes[victim as usize].user.clone();
            self.index.remove(&user);
            self.free.push(victim);
            self.evicted_total += 1;
        }
        let user: Arc<str> = Arc::from(user);
        let node = Node {
            user: user.clone(),
            in_flight: 1,
            refused: 0,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.index.insert(user, i);
        Acquire::Counted(i)
    }

    /// Gives back a slot taken by [`UserTable::acquire`].
    pub fn release(&mut self, i: u32) {
        let Some(n) = self.nodes.get_mut(i as usize) else {
            return;
        };
        if n.in_flight == 0 {
            return;
        }
        n.in_flight -= 1;
        if n.in_flight == 0 {
            self.push_idle(i);
        }
    }

    /// The `k` tracked users with the most refusals (then the most in flight). Ids are cut to
    /// 64 characters for display.
    pub fn top_offenders(&self, k: usize) -> Vec<Offender> {
        let mut v: Vec<&Node> = self
            .index
            .values()
            .map(|&i| &self.nodes[i as usize])
            .filter(|n| n.refused > 0)
            .collect();
        v.sort_by(|a, b| {
            (b.refused, b.in_flight)
                .cmp(&(a.refused, a.in_flight))
                .then_with(|| a.user.cmp(&b.user))
        });
        v.into_iter()
            .take(k)
            .map(|n| Offender {
                user: n.user.chars().take(64).collect(),
                in_flight: n.in_flight,
                refused: n.refused,
            })
            .collect()
    }

    /// Approximate heap bytes held (for the memory benchmark and `/debug/resource`).
    pub fn approx_bytes(&self) -> usize {
        let keys: usize = self
            .index
            .keys()
            .map(|k| k.len() + 2 * std::mem::size_of::<usize>())
            .sum();
        keys + self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.index.capacity() * (std::mem::size_of::<Arc<str>>() + 4 + 1)
            + self.free.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_each_user_independently_and_releases() {
        let mut t = UserTable::new(8);
        let a1 = t.acquire("alice", 2);
        let a2 = t.acquire("alice", 2);
        assert!(matches!(a1, Acquire::Counted(_)) && matches!(a2, Acquire::Counted(_)));
        assert_eq!(t.acquire("alice", 2), Acquire::Over(2));
        assert!(matches!(t.acquire("bob", 2), Acquire::Counted(_)));
        if let Acquire::Counted(i) = a1 {
            t.release(i);
        }
        assert!(matches!(t.acquire("alice", 2), Acquire::Counted(_)));
        assert_eq!(t.top_offenders(5)[0].user, "alice");
        assert_eq!(t.top_offenders(5)[0].refused, 1);
    }

    #[test]
    fn millions_of_distinct_users_stay_within_capacity_and_evict_lru_idle_first() {
        let mut t = UserTable::new(1000);
        // One user stays active the whole time: it must never be evicted.
        let keep = t.acquire("active-user", 3);
        assert!(matches!(keep, Acquire::Counted(_)));
        for i in 0..200_000u32 {
            let u = format!("user-{i}");
            match t.acquire(&u, 3) {
                Acquire::Counted(slot) => t.release(slot),
                other => panic!("{u}: {other:?}"),
            }
            assert!(t.len() <= 1000);
        }
        assert_eq!(t.len(), 1000);
        assert_eq!(t.in_flight("active-user"), 1);
        assert_eq!(t.evicted_total, 200_000 - 999);
        // The most recent idle users are kept; the oldest went first.
        assert!(t.index.contains_key("user-199999"));
        assert!(!t.index.contains_key("user-0"));
        assert!(t.nodes.len() <= 1000, "slots are reused");
    }

    #[test]
    fn a_table_full_of_active_users_admits_new_ones_untracked() {
        let mut t = UserTable::new(2);
        assert!(matches!(t.acquire("a", 1), Acquire::Counted(_)));
        assert!(matches!(t.acquire("b", 1), Acquire::Counted(_)));
        assert_eq!(t.acquire("c", 1), Acquire::Untracked);
        assert_eq!(t.untracked_total, 1);
        assert_eq!(
            t.acquire("a", 1),
            Acquire::Over(1),
            "tracked users stay exact"
        );
    }

    #[test]
    fn offender_ids_are_cut_for_display() {
        let mut t = UserTable::new(4);
        let long = "é".repeat(200);
        assert!(matches!(t.acquire(&long, 1), Acquire::Counted(_)));
        assert_eq!(t.acquire(&long, 1), Acquire::Over(1));
        assert_eq!(t.top_offenders(1)[0].user.chars().count(), 64);
    }
}
