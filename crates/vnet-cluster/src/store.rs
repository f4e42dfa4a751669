//! An in-memory store with etcd's semantics, for the simulator and tests:
//! a revision bumped by every change (a lease's expiry deletes all its
//! keys in one revision, as etcd's revoke does), leases with a TTL kept
//! alive by keepalives, watches from a revision, and compaction (a watch
//! from a compacted revision fails, and the watcher must list again).

use std::collections::{BTreeMap, VecDeque};

/// A change, as a watch delivers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `created`: the revision that created the key (etcd's
    /// `create_revision`; 0: not known), which orders competing claims on
    /// Kubernetes.
    Put {
        key: String,
        value: Vec<u8>,
        rev: u64,
        created: u64,
    },
    Delete {
        key: String,
        rev: u64,
    },
}

impl Event {
    pub fn key(&self) -> &str {
        match self {
            Event::Put { key, .. } | Event::Delete { key, .. } => key,
        }
    }

    pub fn rev(&self) -> u64 {
        match self {
            Event::Put { rev, .. } | Event::Delete { rev, .. } => *rev,
        }
    }
}

/// A watch asked for history that compaction removed: list again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    /// The oldest revision still watchable.
    pub first: u64,
}

struct Entry {
    value: Vec<u8>,
    lease: Option<u64>,
    /// The revision that created the key (etcd's `create_revision`).
    created: u64,
}

struct Lease {
    ttl_ns: u64,
    deadline_ns: u64,
}

/// The store.
#[derive(Default)]
pub struct MemStore {
    rev: u64,
    kv: BTreeMap<String, Entry>,
    /// Every event after `compacted`, oldest first.
    log: VecDeque<Event>,
    compacted: u64,
    leases: BTreeMap<u64, Lease>,
    next_lease: u64,
}

impl MemStore {
    pub fn new() -> Self {
        MemStore::default()
    }

    /// The store's current revision.
    pub fn revision(&self) -> u64 {
        self.rev
    }

    /// A new lease that lives `ttl_ns` from `now_ns` unless kept alive.
    pub fn grant(&mut self, ttl_ns: u64, now_ns: u64) -> u64 {
        self.next_lease += 1;
        self.leases.insert(self.next_lease, Lease { ttl_ns, deadline_ns: now_ns.saturating_add(ttl_ns) });
        self.next_lease
    }

    /// Keeps lease `id` alive for its TTL from `now_ns`; false if it is gone.
    pub fn keepalive(&mut self, id: u64, now_ns: u64) -> bool {
        match self.leases.get_mut(&id) {
            Some(l) => {
                l.deadline_ns = now_ns.saturating_add(l.ttl_ns);
                true
            }
            None => false,
        }
    }

    /// Revokes the leases whose time is up at `now_ns`, deleting their
    /// keys (one revision per lease). Returns the keys deleted.
    pub fn expire(&mut self, now_ns: u64) -> usize {
        let dead: Vec<u64> =
            self.leases.iter().filter(|(_, l)| l.deadline_ns <= now_ns).map(|(id, _)| *id).collect();
        dead.into_iter().map(|id| self.revoke(id)).sum()
    }

    /// Revokes lease `id` and deletes its keys, all in one revision.
    pub fn revoke(&mut self, id: u64) -> usize {
        if self.leases.remove(&id).is_none() {
            return 0;
        }
        let keys: Vec<String> =
            self.kv.iter().filter(|(_, e)| e.lease == Some(id)).map(|(k, _)| k.clone()).collect();
        if keys.is_empty() {
            return 0;
        }
        self.rev += 1;
        for key in &keys {
            self.kv.remove(key);
            self.log.push_back(Event::Delete { key: key.clone(), rev: self.rev });
        }
        keys.len()
    }

    /// Puts `key` (under lease `lease`, which must exist). Returns the revision.
    pub fn put(&mut self, key: &str, value: Vec<u8>, lease: Option<u64>) -> Option<u64> {
        if lease.is_some_and(|l| !self.leases.contains_key(&l)) {
            return None;
        }
        self.rev += 1;
        let created = self.kv.get(key).map_or(self.rev, |e| e.created);
        self.kv.insert(key.to_string(), Entry { value: value.clone(), lease, created });
        self.log.push_back(Event::Put { key: key.to_string(), value, rev: self.rev, created });
        Some(self.rev)
    }

    /// Deletes `key` if its value is `expected` (any value when `None`):
    /// etcd's compare-and-delete, so a host removes only what it wrote.
    pub fn delete_if(&mut self, key: &str, expected: Option<&[u8]>) -> Option<u64> {
        let e = self.kv.get(key)?;
        if expected.is_some_and(|v| v != e.value.as_slice()) {
            return None;
        }
        self.kv.remove(key);
        self.rev += 1;
        self.log.push_back(Event::Delete { key: key.to_string(), rev: self.rev });
        Some(self.rev)
    }

    /// The revision that created `key` (etcd's `create_revision`), if it exists.
    pub fn created(&self, key: &str) -> Option<u64> {
        self.kv.get(key).map(|e| e.created)
    }

    /// Every key under `prefix` with its value, and the revision they are of.
    pub fn range(&self, prefix: &str) -> (Vec<(String, Vec<u8>)>, u64) {
        let kvs = self
            .kv
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, e)| (k.clone(), e.value.clone()))
            .collect();
        (kvs, self.rev)
    }

    /// The events under `prefix` from revision `from` on (etcd's watch with
    /// a start revision), or [`Compacted`] when that history is gone.
    pub fn watch<'a>(
        &'a self,
        prefix: &'a str,
        from: u64,
    ) -> Result<impl Iterator<Item = &'a Event> + 'a, Compacted> {
        if from <= self.compacted {
            return Err(Compacted { first: self.compacted + 1 });
        }
        let start = self.log.partition_point(|e| e.rev() < from);
        Ok(self.log.range(start..).filter(move |e| e.key().starts_with(prefix)))
    }

    /// Drops the history up to revision `rev` (included).
    pub fn compact(&mut self, rev: u64) {
        let rev = rev.min(self.rev);
        while self.log.front().is_some_and(|e| e.rev() <= rev) {
            self.log.pop_front();
        }
        self.compacted = self.compacted.max(rev);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_leases_watches_and_compaction_behave_as_etcd() {
        let mut s = MemStore::new();
        let l = s.grant(10, 0);
        assert_eq!(s.put("/a/1", b"x".to_vec(), Some(l)), Some(1));
        assert_eq!(s.put("/a/2", b"y".to_vec(), Some(l)), Some(2));
        assert_eq!(s.put("/b/1", b"z".to_vec(), None), Some(3));
        assert_eq!(s.put("/a/3", vec![], Some(99)), None, "no such lease");
        assert_eq!(s.watch("/a/", 2).unwrap().count(), 1);
        assert!(s.keepalive(l, 5));
        assert_eq!(s.expire(14), 0);
        assert_eq!(s.expire(15), 2);
        // Both deletions in one revision.
        let ev: Vec<_> = s.watch("/a/", 4).unwrap().cloned().collect();
        assert_eq!(ev.len(), 2);
        assert!(ev.iter().all(|e| matches!(e, Event::Delete { rev: 4, .. })));
        assert_eq!(s.range("/a/").0.len(), 0);
        // Compare-and-delete.
        assert_eq!(s.delete_if("/b/1", Some(b"other")), None);
        assert_eq!(s.delete_if("/b/1", Some(b"z")), Some(5));
        s.compact(4);
        assert_eq!(s.log.len(), 1, "the history up to 4 is gone (bounded memory)");
        assert_eq!(s.watch("/", 3).err(), Some(Compacted { first: 5 }));
        assert_eq!(s.watch("/", 5).unwrap().count(), 1);
    }
}
