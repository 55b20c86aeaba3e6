//! Background work that steps aside for foreground work. A server runs long work (a piece deep in a long
//! state) on threads of its own beside the short requests' passes; even at the lowest OS priority those
//! threads take a core whenever a foreground thread waits a moment, and what they stream through the
//! caches makes the short pass slower. So a thread marked [`mark_background`] waits at the engine's
//! safe points (a layer, a weight panel, an attention tile) while any [`Foreground`] guard is alive.
//!
//! The safe points hold no locks and nothing another thread waits for inside the pass: a background pass
//! only pauses, never changes its arithmetic.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

static FOREGROUND: AtomicUsize = AtomicUsize::new(0);
/// Where paused background threads sleep until the last foreground guard is dropped. A sleep, not a
/// poll: a background thread that woke every few microseconds to look would take the foreground's
/// cores from it each time unless the OS ranked it below everything (`SCHED_IDLE`).
static RESUMED: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());

thread_local! {
    static BACKGROUND: Cell<bool> = const { Cell::new(false) };
}

/// Mark the calling thread as background: its passes pause at safe points while foreground work runs.
pub fn mark_background() {
    BACKGROUND.with(|b| b.set(true));
}

/// Foreground work in progress, while the guard lives.
#[derive(Debug)]
pub struct Foreground(());

impl Foreground {
    /// Start foreground work: background threads pause at their next safe point.
    pub fn enter() -> Self {
        FOREGROUND.fetch_add(1, Ordering::SeqCst);
        Foreground(())
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        if FOREGROUND.fetch_sub(1, Ordering::SeqCst) == 1 {
            // Taking the lock orders this wake after any waiter's check of the count (it checks and
            // sleeps holding the lock), so no waiter misses it.
            let _held = RESUMED.0.lock().unwrap_or_else(|p| p.into_inner());
            RESUMED.1.notify_all();
        }
    }
}

/// A safe point: on a background thread, wait while foreground work runs.
#[inline]
pub(crate) fn yield_point() {
    if FOREGROUND.load(Ordering::Relaxed) == 0 || !BACKGROUND.with(Cell::get) {
        return;
    }
    let mut held = RESUMED.0.lock().unwrap_or_else(|p| p.into_inner());
    while FOREGROUND.load(Ordering::SeqCst) > 0 {
        held = RESUMED.1.wait(held).unwrap_or_else(|p| p.into_inner());
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
        let fg = Foreground::enter();
        let passed = Arc::new(AtomicBool::new(false));
        let p = Arc::clone(&passed);
        let bg = std::thread::spawn(move || {
            mark_background();
            yield_point();
            p.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !passed.load(Ordering::SeqCst),
            "the background thread did not wait"
        );
        // A foreground thread is never held.
        yield_point();
        drop(fg);
        bg.join().unwrap();
        assert!(passed.load(Ordering::SeqCst));
    }

    #[test]
    fn no_background_thread_sleeps_on_after_the_last_foreground_guard_is_dropped() {
        // Guards come and go while background threads pass safe points: a wake lost between a waiter's
        // check and its sleep would leave one asleep for good.
        let stop = Arc::new(AtomicBool::new(false));
        let ready = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let (stop, ready) = (Arc::clone(&stop), Arc::clone(&ready));
                std::thread::spawn(move || {
                    mark_background();
                    yield_point();
                    ready.fetch_add(1, Ordering::SeqCst);
                    let mut n = 1u64;
                    while !stop.load(Ordering::SeqCst) {
                        yield_point();
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
            let fg = Foreground::enter();
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
