//! A store for operator tests that outlives the operator holding it: a
//! restart opens a new operator over the same entries.

use std::sync::{Arc, Mutex};
use tidemark_state::{Entries, Entry, InMemoryStore, StateError, StateStore};

/// An in-memory store shared by its clones.
#[derive(Clone, Default)]
pub(crate) struct SharedStore(Arc<Mutex<InMemoryStore>>);

impl StateStore for SharedStore {
    fn name(&self) -> &str {
        "shared"
    }
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.0.lock().unwrap().get(key)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        self.0.lock().unwrap().put(key, value)
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), StateError> {
        self.0.lock().unwrap().delete(key)
    }
    fn range(&self, start: &[u8], end: &[u8]) -> Result<Entries, StateError> {
        self.0.lock().unwrap().range(start, end)
    }
    fn prefix(&self, prefix: &[u8]) -> Result<Entries, StateError> {
        self.0.lock().unwrap().prefix(prefix)
    }
    fn first_in_range(&self, start: &[u8], end: &[u8]) -> Result<Option<Entry>, StateError> {
        self.0.lock().unwrap().first_in_range(start, end)
    }
    fn approximate_len(&self) -> usize {
        self.0.lock().unwrap().approximate_len()
    }
}
