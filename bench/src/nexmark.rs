//! A Nexmark event generator (persons, auctions, bids), after the
//! generator of the Nexmark benchmark as Flink and Beam run it: of every 50
//! events, 1 is a person, 3 are auctions and 46 are bids; auctions are sold
//! by recent persons, bids go half to a hot auction and a quarter come from
//! a hot bidder; prices are log-uniform from $1 to $10,000; event times
//! advance by a fixed step, `1 / rate`.
//!
//! Simplified from the original: one generator (no interleaved splits),
//! ids dense from 1000, strings from short fixed lists, no `extra` padding.
//! Events are JSON objects, one topic per kind (`person`, `auction`,
//! `bid`), with Nexmark's field names.
//!
//! ```
//! use tidemark_bench::nexmark::{Generator, Kind};
//! let mut g = Generator::new(10_000_000);
//! let kinds: Vec<Kind> = (0..50).map(|_| g.next_event().0).collect();
//! assert_eq!(kinds.iter().filter(|k| **k == Kind::Person).count(), 1);
//! assert_eq!(kinds.iter().filter(|k| **k == Kind::Auction).count(), 3);
//! assert_eq!(kinds.iter().filter(|k| **k == Kind::Bid).count(), 46);
//! ```

use std::fmt::Write;
use tidemark::schema::{FieldType, Schema};
use tidemark::time::TimestampMicros;

/// The kind of a Nexmark event, also its topic name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A person joins the auction site.
    Person,
    /// A person puts an item up for auction.
    Auction,
    /// A person bids on an auction.
    Bid,
}

impl Kind {
    /// The topic of this kind's events.
    pub fn topic(self) -> &'static str {
        match self {
            Kind::Person => "person",
            Kind::Auction => "auction",
            Kind::Bid => "bid",
        }
    }

    /// The schema of this kind's events.
    pub fn schema(self) -> Schema {
        use FieldType::*;
        match self {
            Kind::Person => Schema::new([
                ("id", Long),
                ("name", String),
                ("emailAddress", String),
                ("creditCard", String),
                ("city", String),
                ("state", String),
                ("dateTime", Timestamp),
            ]),
            Kind::Auction => Schema::new([
                ("id", Long),
                ("itemName", String),
                ("description", String),
                ("initialBid", Long),
                ("reserve", Long),
                ("dateTime", Timestamp),
                ("expires", Timestamp),
                ("seller", Long),
                ("category", Long),
            ]),
            Kind::Bid => Schema::new([
                ("auction", Long),
                ("bidder", Long),
                ("price", Long),
                ("channel", String),
                ("url", String),
                ("dateTime", Timestamp),
            ]),
        }
    }
}

/// The event time of the first event: 2026-01-01T00:00:00Z.
pub const START_MICROS: TimestampMicros = 1_767_225_600_000_000;

const FIRST_ID: u64 = 1000;
const FIRST_NAMES: [&str; 8] = [
    "Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie",
];
const LAST_NAMES: [&str; 8] = [
    "Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
];
const CITIES: [&str; 8] = [
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
];
const STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];
const CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];
/// Recent persons and auctions a new auction or bid picks from.
const ACTIVE: u64 = 1000;

/// Generates Nexmark events in order, deterministically.
pub struct Generator {
    next: u64,
    step_nanos: u64,
    rng: u64,
}

impl Generator {
    /// A generator whose event times advance at `events_per_second`
    /// (Nexmark's default first-event rate is 10,000,000).
    pub fn new(events_per_second: u64) -> Self {
        Generator {
            next: 0,
            step_nanos: 1_000_000_000 / events_per_second.max(1),
            rng: 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// Events generated so far.
    pub fn generated(&self) -> u64 {
        self.next
    }

    /// splitmix64.
    fn random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn pick<'a>(&mut self, list: &[&'a str]) -> &'a str {
        list[(self.random() % list.len() as u64) as usize]
    }

    /// A recent id among `count` ids so far: the newest with probability
    /// `1 / hot_ratio` (rounded down to a "hot" id), else any of the last
    /// `ACTIVE`.
    fn recent(&mut self, count: u64, hot_ratio: u64) -> u64 {
        let last = count.saturating_sub(1);
        if self.random().is_multiple_of(hot_ratio) {
            return FIRST_ID + last / 100 * 100;
        }
        let back = self.random() % ACTIVE.min(count.max(1));
        FIRST_ID + last - back.min(last)
    }

    /// The next event: its kind and its JSON bytes.
    pub fn next_event(&mut self) -> (Kind, Vec<u8>) {
        let n = self.next;
        self.next += 1;
        let time = START_MICROS + (n * self.step_nanos / 1000) as i64;
        let at = tidemark::time::format_rfc3339(time);
        let (epoch, offset) = (n / 50, n % 50);
        let persons = epoch + 1;
        let auctions = epoch * 3 + offset.min(3);
        let mut out = String::with_capacity(200);
        let kind = match offset {
            0 => {
                let id = FIRST_ID + epoch;
                let (first, last) = (self.pick(&FIRST_NAMES), self.pick(&LAST_NAMES));
                let (city, state) = (self.pick(&CITIES), self.pick(&STATES));
                let card = self.random() % 10_000_000_000_000_000;
                let _ = write!(
                    out,
                    r#"{{"id":{id},"name":"{first} {last}","emailAddress":"{first}@{last}.com","creditCard":"{card:016}","city":"{city}","state":"{state}","dateTime":"{at}"}}"#
                );
                Kind::Person
            }
            1..=3 => {
                let id = FIRST_ID + epoch * 3 + offset - 1;
                let seller = self.recent(persons, 100);
                let category = 10 + self.random() % 5;
                let initial = self.price();
                let reserve = initial + self.price();
                let expires = tidemark::time::format_rfc3339(time + 10_000_000);
                let _ = write!(
                    out,
                    r#"{{"id":{id},"itemName":"item {id}","description":"an item","initialBid":{initial},"reserve":{reserve},"dateTime":"{at}","expires":"{expires}","seller":{seller},"category":{category}}}"#
                );
                Kind::Auction
            }
            _ => {
                let auction = self.recent(auctions, 2);
                let bidder = self.recent(persons, 4);
                let price = self.price();
                let channel = self.pick(&CHANNELS);
                let _ = write!(
                    out,
                    r#"{{"auction":{auction},"bidder":{bidder},"price":{price},"channel":"{channel}","url":"https://www.nexmark.com/item.htm?query=1","dateTime":"{at}"}}"#
                );
                Kind::Bid
            }
        };
        (kind, out.into_bytes())
    }

    /// Nexmark's price: cents, log-uniform from 100 to 1,000,000.
    fn price(&mut self) -> u64 {
        let u = (self.random() >> 11) as f64 / (1u64 << 53) as f64;
        (10f64.powf(u * 4.0) * 100.0).round() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_valid_json_of_their_schema_and_bids_name_existing_ids() {
        let mut g = Generator::new(1_000_000);
        let (mut persons, mut auctions) = (0u64, 0u64);
        for _ in 0..5000 {
            let (kind, bytes) = g.next_event();
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            for (name, _) in kind.schema().fields() {
                assert!(v.get(name).is_some(), "{kind:?} lacks {name}");
            }
            match kind {
                Kind::Person => persons += 1,
                Kind::Auction => {
                    auctions += 1;
                    assert!(v["seller"].as_u64().unwrap() < FIRST_ID + persons);
                }
                Kind::Bid => {
                    assert!(v["auction"].as_u64().unwrap() < FIRST_ID + auctions);
                    assert!(v["bidder"].as_u64().unwrap() < FIRST_ID + persons);
                    let price = v["price"].as_u64().unwrap();
                    assert!((100..=1_000_000).contains(&price), "{price}");
                }
            }
        }
        assert_eq!((persons, auctions), (100, 300));
    }
}
