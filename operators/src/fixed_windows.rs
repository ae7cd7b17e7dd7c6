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

use crate::aggregate::Accumulator;
use crate::row::Value;
use crate::window::TimeWindow;
use hashbrown::hash_map::EntryRef;
use smallvec::SmallVec;
use std::collections::BTreeMap;

type HashMap<K, V> = crate::CacheMap<K, V>;

/// An encoded key, inline up to 24 bytes.
type KeyBytes = SmallVec<[u8; 24]>;

struct OpenWindow {
    window: TimeWindow,
    accumulators: SmallVec<[Accumulator; 2]>,
    touched: bool,
}

struct KeyWindows {
    key_values: Vec<Value>,
    /// On the heap: keys often hold two or three windows near the
    /// watermark, and an inline one would sit empty in most slots.
    windows: Vec<OpenWindow>,
}

/// Expiry index entries added and removed: `(window end, key)`.
pub(super) type IndexChanges = (Vec<(i64, Vec<u8>)>, Vec<(i64, Vec<u8>)>);

/// A window and its accumulators, borrowed from the state.
pub(super) type WindowRef<'a> = (TimeWindow, &'a [Accumulator]);

/// Open fixed windows of one operator in one task.
#[derive(Default)]
pub(super) struct FixedWindowState {
    keys: HashMap<KeyBytes, KeyWindows>,
    expiry: BTreeMap<i64, Vec<Vec<u8>>>,
    touched: Vec<(Vec<u8>, TimeWindow)>,
    open: usize,
    /// Keys changed since the last `take_dirty`, tracked only when the
    /// state is persisted.
    track_dirty: bool,
    dirty: Vec<Vec<u8>>,
    /// Windows opened and removed since the last checkpoint: the store's
    /// expiry index entries to add and delete (tracked with `dirty`).
    opened: Vec<(i64, Vec<u8>)>,
    closed: Vec<(i64, Vec<u8>)>,
}

impl FixedWindowState {
    /// The accumulators of `window` for the key encoded as `key`, opened
    /// with `key_values()` and `zeros()` when new; marks it touched.
    pub(super) fn accumulators(
        &mut self,
        key: &[u8],
        key_values: impl FnOnce() -> Vec<Value>,
        window: TimeWindow,
        zeros: impl FnOnce() -> Vec<Accumulator>,
    ) -> &mut [Accumulator] {
        // One probe: the key is copied only when it is new.
        let entry = match self.keys.entry_ref(key) {
            EntryRef::Occupied(entry) => entry.into_mut(),
            EntryRef::Vacant(entry) => entry.insert_with_key(
                KeyBytes::from_slice(key),
                KeyWindows {
                    key_values: key_values(),
                    windows: Vec::with_capacity(1),
                },
            ),
        };
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
                if self.track_dirty {
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
        &mut open.accumulators
    }

    /// Starts tracking which keys change, for checkpoints.
    pub(super) fn track_changes(&mut self) {
        self.track_dirty = true;
    }

    /// Keys changed since the last call, sorted, each once.
    pub(super) fn take_dirty(&mut self) -> Vec<Vec<u8>> {
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort();
        dirty.dedup();
        dirty
    }

    /// Windows opened and closed since the last call, by end and key.
    pub(super) fn take_index_changes(&mut self) -> IndexChanges {
        (
            std::mem::take(&mut self.opened),
            std::mem::take(&mut self.closed),
        )
    }

    /// Whether the key's windows are in memory.
    pub(super) fn contains(&self, key: &[u8]) -> bool {
        self.keys.contains_key(key)
    }

    /// Puts back a key read from the store on demand: its windows are
    /// already counted and in the store's expiry index.
    pub(super) fn insert_loaded(
        &mut self,
        key: Vec<u8>,
        key_values: Vec<Value>,
        windows: Vec<(TimeWindow, Vec<Accumulator>)>,
    ) {
        let windows = windows
            .into_iter()
            .map(|(window, accumulators)| OpenWindow {
                window,
                accumulators: accumulators.into_iter().collect(),
                touched: false,
            })
            .collect();
        self.keys.insert(
            KeyBytes::from_vec(key),
            KeyWindows {
                key_values,
                windows,
            },
        );
    }

    /// Makes `key`'s window ending at `end` (found in the store's expiry
    /// index) a candidate for the next eviction.
    pub(super) fn schedule_expiry(&mut self, end: i64, key: Vec<u8>) {
        self.expiry.entry(end).or_default().push(key);
    }

    /// Counts windows that live only in the store.
    pub(super) fn add_stored(&mut self, windows: usize) {
        self.open += windows;
    }

    /// After a checkpoint, when the store holds everything: forgets the
    /// in-memory expiry index (the store's answers for it) and keeps at
    /// most `max_keys` keys in memory. Clean keys only: every change was
    /// just written.
    pub(super) fn shrink_to(&mut self, max_keys: usize) {
        self.expiry.clear();
        if self.keys.len() > max_keys {
            super::shrink_cache(&mut self.keys, max_keys * 3 / 4, max_keys);
        }
    }

    /// A key's values and open windows, if it has any.
    pub(super) fn key_state(
        &self,
        key: &[u8],
    ) -> Option<(&[Value], impl Iterator<Item = WindowRef<'_>>)> {
        let entry = self.keys.get(key)?;
        Some((
            entry.key_values.as_slice(),
            entry
                .windows
                .iter()
                .map(|w| (w.window, w.accumulators.as_slice())),
        ))
    }

    /// Puts back a key's windows read from a store.
    pub(super) fn insert_key(
        &mut self,
        key: Vec<u8>,
        key_values: Vec<Value>,
        windows: Vec<(TimeWindow, Vec<Accumulator>)>,
    ) {
        for (window, _) in &windows {
            self.expiry.entry(window.end).or_default().push(key.clone());
        }
        self.open += windows.len();
        self.insert_loaded(key, key_values, windows);
    }

    /// Number of keys held in memory.
    pub(super) fn cached_keys(&self) -> usize {
        self.keys.len()
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
    ) -> usize {
        let touched = std::mem::take(&mut self.touched);
        if self.track_dirty {
            self.dirty.extend(touched.iter().map(|(k, _)| k.clone()));
        }
        for (key, window) in &touched {
            if let Some(entry) = self.keys.get_mut(key.as_slice()) {
                if let Some(open) = entry.windows.iter_mut().find(|w| w.window == *window) {
                    open.touched = false;
                    f(&entry.key_values, open.window, &open.accumulators);
                }
            }
        }
        touched.len()
    }

    /// Every open window, by window start then key.
    pub(super) fn for_each(&self, mut f: impl FnMut(&[Value], TimeWindow, &[Accumulator])) {
        let mut all: Vec<(&KeyBytes, &KeyWindows, &OpenWindow)> = self
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
    ) -> usize {
        let keep = self.expiry.split_off(&watermark.saturating_add(1));
        let expired = std::mem::replace(&mut self.expiry, keep);
        let mut removed = 0;
        for (end, mut keys) in expired {
            keys.sort();
            let mut closed: Vec<(Vec<Value>, OpenWindow)> = Vec::new();
            for key in keys {
                if self.track_dirty {
                    self.dirty.push(key.clone());
                }
                let Some(entry) = self.keys.get_mut(key.as_slice()) else {
                    continue;
                };
                let mut i = 0;
                while i < entry.windows.len() {
                    if entry.windows[i].window.end == end {
                        if self.track_dirty {
                            self.closed.push((end, key.clone()));
                        }
                        closed.push((entry.key_values.clone(), entry.windows.swap_remove(i)));
                    } else {
                        i += 1;
                    }
                }
                if entry.windows.is_empty() {
                    self.keys.remove(key.as_slice());
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
        removed
    }
}
