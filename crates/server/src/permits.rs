//! Body-read permits: how many request bodies are read at once, and how they are shared.
//!
//! A decision request holds a permit from the moment its headers are in until its body is (a client slow
//! to send holds a permit, never a queue slot). Clients that send headers only and reconnect each time
//! they are cut (408) could otherwise keep every permit taken. So the last quarter of the permits (the
//! reserve) goes only to a peer address — and, with keys, a key — that holds less than its share (a quarter
//! of the permits) at the time: one address or one key may hold three quarters of them while nobody else
//! reads, never the reserve, so any other client always finds a permit that the busy one cannot take. A
//! pool of fewer than four permits has no reserve.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Who holds a permit.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Holder {
    Peer(IpAddr),
    Key(Arc<str>),
}

#[derive(Default)]
struct Held {
    total: usize,
    by: HashMap<Holder, usize>,
}

/// The permits of one server.
pub(crate) struct BodyPermits {
    capacity: usize,
    held: Mutex<Held>,
}

/// Why no permit was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoPermit {
    /// Every permit is held.
    AllHeld,
    /// Only the reserve is left, and this peer address or key holds its share already.
    OverShare,
}

/// A permit held; given back when dropped.
pub(crate) struct BodyPermit<'a> {
    pool: &'a BodyPermits,
    holders: Vec<Holder>,
}

impl Drop for BodyPermit<'_> {
    fn drop(&mut self) {
        let mut held = self.pool.lock();
        held.total -= 1;
        for h in &self.holders {
            if let Some(n) = held.by.get_mut(h) {
                *n -= 1;
                if *n == 0 {
                    held.by.remove(h);
                }
            }
        }
    }
}

impl BodyPermits {
    pub(crate) fn new(capacity: usize) -> Self {
        BodyPermits {
            capacity: capacity.max(1),
            held: Mutex::new(Held::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The permits in all.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Permits only a holder under its share may take.
    fn reserve(&self) -> usize {
        self.capacity / 4
    }

    /// The most one peer address or key holds while taking from the reserve.
    fn share(&self) -> usize {
        (self.capacity / 4).max(1)
    }

    /// Take a permit for a request from `peer` under `key` (either unknown: not counted).
    pub(crate) fn try_take(
        &self,
        peer: Option<IpAddr>,
        key: Option<&str>,
    ) -> Result<BodyPermit<'_>, NoPermit> {
        let holders: Vec<Holder> = peer
            .map(Holder::Peer)
            .into_iter()
            .chain(key.map(|k| Holder::Key(Arc::from(k))))
            .collect();
        let mut held = self.lock();
        let free = self.capacity - held.total;
        if free == 0 {
            return Err(NoPermit::AllHeld);
        }
        if free <= self.reserve()
            && holders
                .iter()
                .any(|h| held.by.get(h).copied().unwrap_or(0) >= self.share())
        {
            return Err(NoPermit::OverShare);
        }
        held.total += 1;
        for h in &holders {
            *held.by.entry(h.clone()).or_default() += 1;
        }
        drop(held);
        Ok(BodyPermit {
            pool: self,
            holders,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([127, 0, 0, last]))
    }

    #[test]
    fn one_address_never_takes_the_reserve_from_another() {
        let pool = BodyPermits::new(8);
        // One address alone takes three quarters, not the reserve.
        let mut busy: Vec<_> = (0..6)
            .map(|_| pool.try_take(ip(2), None).unwrap())
            .collect();
        assert_eq!(pool.try_take(ip(2), None).err(), Some(NoPermit::OverShare));
        // Another address gets the reserve, up to every permit.
        let a = pool.try_take(ip(1), None).unwrap();
        let b = pool.try_take(ip(3), None).unwrap();
        assert_eq!(pool.try_take(ip(4), None).err(), Some(NoPermit::AllHeld));
        // A permit given back by the busy address goes to someone under their share, not to it.
        busy.pop();
        assert_eq!(pool.try_take(ip(2), None).err(), Some(NoPermit::OverShare));
        let c = pool.try_take(ip(1), None).unwrap();
        drop((a, b, c, busy));
        assert_eq!(pool.lock().total, 0);
        assert!(pool.lock().by.is_empty());
    }

    #[test]
    fn a_key_is_held_to_its_share_of_the_reserve_too() {
        let pool = BodyPermits::new(8);
        let held: Vec<_> = (0..6)
            .map(|i| pool.try_take(ip(10 + i), Some("k")).unwrap())
            .collect();
        assert_eq!(
            pool.try_take(ip(20), Some("k")).err(),
            Some(NoPermit::OverShare),
            "a key spread over many addresses is still one key"
        );
        assert!(pool.try_take(ip(20), Some("other")).is_ok());
        drop(held);
    }

    #[test]
    fn a_small_pool_has_no_reserve() {
        let pool = BodyPermits::new(2);
        let a = pool.try_take(ip(1), None).unwrap();
        let b = pool.try_take(ip(1), None).unwrap();
        assert_eq!(pool.try_take(ip(2), None).err(), Some(NoPermit::AllHeld));
        drop((a, b));
    }
}
