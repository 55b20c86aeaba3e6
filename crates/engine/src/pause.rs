//! Background work that steps aside for foreground work. A server runs long work (a piece deep in a long
//! state) beside the short requests' passes; even at the lowest OS priority that work takes a core whenever
//! a foreground thread waits a moment, and what it streams through the caches makes the short pass slower.
//! So a background pass carries its service's [`Lanes`] and waits at the engine's safe points (a layer, a
//! weight panel, an attention tile) while any [`Foreground`] guard of those lanes is alive.
//!
//! The safe points hold no locks and nothing another thread waits for inside the pass: a background pass
//! only pauses, never changes its arithmetic. A pass that carries no lanes never pauses.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// One service's foreground work in progress, and where its background passes sleep until the last
/// foreground guard is dropped. A sleep, not a poll: a background pass that woke every few microseconds to
/// look would take the foreground's cores from it each time unless the OS ranked it below everything
/// (`SCHED_IDLE`).
#[derive(Debug, Default)]
pub struct Lanes {
    foreground: AtomicUsize,
    resumed: (Mutex<()>, Condvar),
}

impl Lanes {
    /// Lanes with no foreground work.
    pub fn new() -> Arc<Self> {
        Arc::new(Lanes::default())
    }

    /// Start foreground work: background passes pause at their next safe point until the guard is dropped.
    pub fn foreground(self: &Arc<Self>) -> Foreground {
        self.foreground.fetch_add(1, Ordering::SeqCst);
        Foreground(Arc::clone(self))
    }

    /// A background pass's safe point: wait while foreground work runs.
    #[inline]
    pub fn step_aside(&self) {
        if self.foreground.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut held = self.resumed.0.lock().unwrap_or_else(|p| p.into_inner());
        while self.foreground.load(Ordering::SeqCst) > 0 {
            held = self.resumed.1.wait(held).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Foreground work in progress, while the guard lives.
#[derive(Debug)]
pub struct Foreground(Arc<Lanes>);

impl Drop for Foreground {
    fn drop(&mut self) {
        let lanes = &self.0;
        if lanes.foreground.fetch_sub(1, Ordering::SeqCst) == 1 {
            // Taking the lock orders this wake after any waiter's check of the count (it checks and
            // sleeps holding the lock), so no waiter misses it.
            let _held = lanes.resumed.0.lock().unwrap_or_else(|p| p.into_inner());
            lanes.resumed.1.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    #[test]
    fn a_background_thread_waits_at_a_safe_point_while_foreground_work_runs() {
        let lanes = Lanes::new();
        let fg = lanes.foreground();
        let passed = Arc::new(AtomicBool::new(false));
        let p = Arc::clone(&passed);
        let bg_lanes = Arc::clone(&lanes);
        let bg = std::thread::spawn(move || {
            bg_lanes.step_aside();
            p.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !passed.load(Ordering::SeqCst),
            "the background thread did not wait"
        );
        // Other lanes' passes are never held.
        Lanes::new().step_aside();
        drop(fg);
        bg.join().unwrap();
        assert!(passed.load(Ordering::SeqCst));
    }

    #[test]
    fn no_background_thread_sleeps_on_after_the_last_foreground_guard_is_dropped() {
        // Guards come and go while background threads pass safe points: a wake lost between a waiter's
        // check and its sleep would leave one asleep for good.
        let lanes = Lanes::new();
        let stop = Arc::new(AtomicBool::new(false));
        let ready = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let (stop, ready, lanes) =
                    (Arc::clone(&stop), Arc::clone(&ready), Arc::clone(&lanes));
                std::thread::spawn(move || {
                    lanes.step_aside();
                    ready.fetch_add(1, Ordering::SeqCst);
                    let mut n = 1u64;
                    while !stop.load(Ordering::SeqCst) {
                        lanes.step_aside();
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        // The guards start once every worker is in its loop (else, on a busy machine, they could all come
        // and go before a worker ran, and the test would prove nothing).
        while ready.load(Ordering::SeqCst) < 3 {
            std::thread::yield_now();
        }
        for _ in 0..20_000 {
            let fg = lanes.foreground();
            std::hint::spin_loop();
            drop(fg);
        }
        stop.store(true, Ordering::SeqCst);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let passed: Vec<u64> = workers.into_iter().map(|w| w.join().unwrap()).collect();
            let _ = tx.send(passed);
        });
        let passed = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a background thread still sleeps with no foreground work");
        assert_eq!(passed.len(), 3, "{passed:?}");
    }
}
