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
use std::time::Duration;

static FOREGROUND: AtomicUsize = AtomicUsize::new(0);

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
        FOREGROUND.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A safe point: on a background thread, wait while foreground work runs.
#[inline]
pub(crate) fn yield_point() {
    if FOREGROUND.load(Ordering::Relaxed) == 0 || !BACKGROUND.with(Cell::get) {
        return;
    }
    while FOREGROUND.load(Ordering::Acquire) > 0 {
        std::thread::sleep(Duration::from_micros(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

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
}
