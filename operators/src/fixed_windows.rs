//! State of tumbling and sliding windows: per key, its open windows; an
//! expiry index by window end so that eviction touches only what expires.
//!
//! The per-row path looks a key up by its encoded bytes without allocating
//! and scans the key's few open windows linearly; allocation happens only
//! when a key or a window opens.
//!
//! Each pointer a row follows is a cache miss once the state outgrows the
//! cache, so the common case keeps them few: a short key's bytes sit in the
//! hash table's slot (compared without a jump), and a window's first two
//! accumulators sit in the window itself. Longer keys and more aggregates
//! spill to the heap.
//!
//! The keys live in the engine's cache of decoded state
//! ([`tidemark_state::StateCache`], `K` + encoded key → the key's windows);
//! beside them in the store, the expiry index (`E` + window end + encoded
//! key → nothing) that eviction scans by range when the state is read
//! through the store.

use super::state_codec::parse_expiry_key;
use super::state_codec::{decode_key_state, encode_key_state, expired_by, expiry_key};
use crate::aggregate::Accumulator;
use crate::error::Result;
use crate::row::Value;
use crate::window::TimeWindow;
use crate::AggregateSpec;
use smallvec::SmallVec;
use std::collections::BTreeMap;
use tidemark_state::{PeekedValue, StateCache, StateCodec, StateStore, StoreEntries};

struct OpenWindow {
    window: TimeWindow,
    accumulators: SmallVec<[Accumulator; 2]>,
    touched: bool,
}

/// One key's open windows.
pub(super) struct KeyWindows {
    key_values: Vec<Value>,
    /// On the heap: keys often hold two or three windows near the
    /// watermark, and an inline one would sit empty in most slots.
    windows: Vec<OpenWindow>,
}

impl KeyWindows {
    /// The key's values and its windows with their accumulators.
    pub(super) fn windows(&self) -> (&[Value], impl Iterator<Item = WindowRef<'_>>) {
        (
            &self.key_values,
            self.windows
                .iter()
                .map(|w| (w.window, w.accumulators.as_slice())),
        )
    }
}

/// A key's windows in the store: [`encode_key_state`]'s layout.
pub(super) struct KeyWindowsCodec {
    aggregates: Vec<AggregateSpec>,
}

impl StateCodec for KeyWindowsCodec {
    type Value = KeyWindows;
    fn encode(&self, key: &KeyWindows) -> Result<Vec<u8>> {
        let (key_values, windows) = key.windows();
        encode_key_state(key_values, windows, &self.aggregates)
    }
    fn decode(&self, bytes: &[u8]) -> Result<KeyWindows> {
        let (key_values, windows) = decode_key_state(bytes, &self.aggregates)?;
        let windows = windows
            .into_iter()
            .map(|(window, accumulators)| OpenWindow {
                window,
                accumulators: accumulators.into_iter().collect(),
                touched: false,
            })
            .collect();
        Ok(KeyWindows {
            key_values,
            windows,
        })
    }
}

/// A window and its accumulators, borrowed from the state.
pub(super) type WindowRef<'a> = (TimeWindow, &'a [Accumulator]);

/// Open fixed windows of one operator in one task.
pub(super) struct FixedWindowState {
    keys: StateCache<KeyWindowsCodec>,
    expiry: BTreeMap<i64, Vec<Vec<u8>>>,
    touched: Vec<(Vec<u8>, TimeWindow)>,
    open: usize,
    /// Windows opened and removed since the last checkpoint: the store's
    /// expiry index entries to add and delete (tracked with a store).
    opened: Vec<(i64, Vec<u8>)>,
    closed: Vec<(i64, Vec<u8>)>,
}

impl FixedWindowState {
    /// No window yet, for aggregates `aggregates` (the store's layout).
    pub(super) fn new(aggregates: Vec<AggregateSpec>) -> Self {
        FixedWindowState {
            keys: StateCache::new(KeyWindowsCodec { aggregates }),
            expiry: BTreeMap::new(),
            touched: Vec::new(),
            open: 0,
            opened: Vec::new(),
            closed: Vec::new(),
        }
    }

    /// Opens the state over `store`: every key into memory, or, with
    /// `max_cached_keys`, read through the store (its expiry index finds
    /// what to close).
    pub(super) fn open(
        &mut self,
        store: Box<dyn StateStore>,
        max_cached_keys: Option<usize>,
    ) -> Result<()> {
        self.expiry.clear();
        self.touched.clear();
        self.opened.clear();
        self.closed.clear();
        // Every stored key has an expiry entry per window.
        self.open = store.approximate_len() / 2;
        self.keys.open(store, max_cached_keys)?;
        if max_cached_keys.is_none() {
            self.open = 0;
            for (key, entry) in self.keys.iter() {
                for open in &entry.windows {
                    self.expiry
                        .entry(open.window.end)
                        .or_default()
                        .push(key.to_vec());
                }
                self.open += entry.windows.len();
            }
        }
        Ok(())
    }

    /// The accumulators of `window` for the key encoded as `key`, opened
    /// with `key_values()` and `zeros()` when new (in memory and in the
    /// store); marks it touched.
    pub(super) fn accumulators(
        &mut self,
        key: &[u8],
        key_values: impl FnOnce() -> Vec<Value>,
        window: TimeWindow,
        zeros: impl FnOnce() -> Vec<Accumulator>,
    ) -> Result<&mut [Accumulator]> {
        let persisted = self.keys.store().is_some();
        // One probe when cached: the key is copied only when it is new.
        let entry = self.keys.get_or_insert_with(key, || KeyWindows {
            key_values: key_values(),
            windows: Vec::with_capacity(1),
        })?;
        let position = match entry.windows.iter().position(|w| w.window == window) {
            Some(p) => p,
            None => {
                // Grown one at a time: a window is 100 bytes and a key holds
                // one to a few; doubling would leave most of them empty.
                entry.windows.reserve_exact(1);
                entry.windows.push(OpenWindow {
                    window,
                    accumulators: SmallVec::from_vec(zeros()),
                    touched: false,
                });
                self.expiry
                    .entry(window.end)
                    .or_default()
                    .push(key.to_vec());
                if persisted {
                    self.opened.push((window.end, key.to_vec()));
                }
                self.open += 1;
                entry.windows.len() - 1
            }
        };
        let open = &mut entry.windows[position];
        if !open.touched {
            open.touched = true;
            self.touched.push((key.to_vec(), window));
        }
        Ok(&mut open.accumulators)
    }

    /// Writes the expiry index's changes and every changed key to the
    /// store in one batch, then flushes it; reading through the store, forgets the
    /// in-memory expiry index (the store's answers for it) and keeps at
    /// most the bound of keys in memory. Returns how many entries changed.
    pub(super) fn checkpoint(&mut self) -> Result<usize> {
        let opened = std::mem::take(&mut self.opened);
        let closed = std::mem::take(&mut self.closed);
        let reads_through = self.keys.reads_through();
        let mut index: StoreEntries = opened
            .into_iter()
            .map(|(end, key)| (expiry_key(end, &key), Some(Vec::new())))
            .collect();
        index.extend(
            closed
                .into_iter()
                .map(|(end, key)| (expiry_key(end, &key), None)),
        );
        let written = self.keys.checkpoint_with(index)?;
        if reads_through {
            self.expiry.clear();
        }
        Ok(written)
    }

    /// Finds, in the store's expiry index, the windows ending at or before
    /// `watermark`, so that eviction reads their keys (reading through the
    /// store: memory knows only the windows it opened since).
    pub(super) fn schedule_stored_expiry(&mut self, watermark: i64) -> Result<()> {
        let Some(store) = self.keys.store().filter(|_| self.keys.reads_through()) else {
            return Ok(());
        };
        for (index_key, _) in expired_by(store, watermark)? {
            if let Some((end, key)) = parse_expiry_key(&index_key) {
                self.expiry.entry(end).or_default().push(key.to_vec());
            }
        }
        Ok(())
    }

    /// A key's values and open windows, if it has any, for a reader: from
    /// memory, or read from the store without caching them.
    pub(super) fn peek(&self, key: &[u8]) -> Result<Option<PeekedValue<'_, KeyWindows>>> {
        self.keys.peek(key)
    }

    /// Number of keys held in memory.
    pub(super) fn cached_keys(&self) -> usize {
        self.keys.cached_len()
    }

    /// Number of open windows.
    pub(super) fn len(&self) -> usize {
        self.open
    }

    /// Windows touched since the last call, in the order first touched;
    /// clears the marks.
    pub(super) fn drain_touched(
        &mut self,
        mut f: impl FnMut(&[Value], TimeWindow, &[Accumulator]),
    ) -> Result<usize> {
        let touched = std::mem::take(&mut self.touched);
        for (key, window) in &touched {
            if let Some(entry) = self.keys.get_mut(key.as_slice())? {
                if let Some(open) = entry.windows.iter_mut().find(|w| w.window == *window) {
                    open.touched = false;
                    f(&entry.key_values, open.window, &open.accumulators);
                }
            }
        }
        Ok(touched.len())
    }

    /// Every open window, by window start then key.
    pub(super) fn for_each(&self, mut f: impl FnMut(&[Value], TimeWindow, &[Accumulator])) {
        let mut all: Vec<(&[u8], &KeyWindows, &OpenWindow)> = self
            .keys
            .iter()
            .flat_map(|(k, e)| e.windows.iter().map(move |w| (k, e, w)))
            .collect();
        all.sort_by(|a, b| (a.2.window.start, a.0).cmp(&(b.2.window.start, b.0)));
        for (_, entry, open) in all {
            f(&entry.key_values, open.window, &open.accumulators);
        }
    }

    /// Removes every window ending at or before `watermark`, handing each to
    /// `f` by window end, start, then key.
    pub(super) fn evict_until(
        &mut self,
        watermark: i64,
        mut f: impl FnMut(&[Value], TimeWindow, &[Accumulator]),
    ) -> Result<usize> {
        let keep = self.expiry.split_off(&watermark.saturating_add(1));
        let expired = std::mem::replace(&mut self.expiry, keep);
        let mut removed = 0;
        for (end, mut keys) in expired {
            keys.sort();
            let mut closed: Vec<(Vec<Value>, OpenWindow)> = Vec::new();
            let persisted = self.keys.store().is_some();
            for key in keys {
                // Read from the store if need be: a key it alone holds.
                let Some(entry) = self.keys.get_mut(key.as_slice())? else {
                    continue;
                };
                let mut i = 0;
                while i < entry.windows.len() {
                    if entry.windows[i].window.end == end {
                        if persisted {
                            self.closed.push((end, key.clone()));
                        }
                        closed.push((entry.key_values.clone(), entry.windows.swap_remove(i)));
                    } else {
                        i += 1;
                    }
                }
                if entry.windows.is_empty() {
                    self.keys.remove(key.as_slice())?;
                }
            }
            closed.sort_by_key(|(_, w)| w.window.start);
            for (key_values, open) in closed {
                removed += 1;
                f(&key_values, open.window, &open.accumulators);
            }
        }
        // With state in the store the count starts from an estimate.
        self.open = self.open.saturating_sub(removed);
        // Touch marks of evicted windows are dropped with them.
        self.touched.retain(|(_, w)| w.end > watermark);
        Ok(removed)
    }
}
