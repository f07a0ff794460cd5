//! The policy engines' clock: one thread advances the epoch of every policy engine each
//! [`TICK`], but only while a policy call is running.
//!
//! Why not always: policy calls are rare next to the time between them (a placement
//! decision when a file is created, an event when a buffer is flushed), and a clock that
//! ticks regardless wakes a thousand times a second for nothing, in every `valet-run` and
//! in a node agent whose pods are all idle. A call holds a [`Running`] guard; the first
//! guard wakes the clock, and when the last one is dropped the clock sleeps until the next
//! call.
//!
//! The epoch only has to move while a call can be past its deadline: a deadline is set
//! when its call starts, in ticks from the current epoch, and ticks that happen while no
//! call runs would only have been counted against no one.
//!
//! Locking: one mutex holds the engines and the count of running calls; it is never held
//! while an epoch is incremented or the clock sleeps.

use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard};
use std::time::Duration;

use wasmtime::{Engine, EngineWeak};

/// How often the epoch advances while a call runs: the granularity of call deadlines.
pub const TICK: Duration = Duration::from_millis(1);

/// The process's clock, started with the first policy engine.
static CLOCK: LazyLock<Arc<Clock>> = LazyLock::new(Clock::start);

struct Clock {
    state: Mutex<State>,
    /// Signalled when the first call starts.
    calls: Condvar,
}

#[derive(Default)]
struct State {
    engines: Vec<EngineWeak>,
    running: usize,
    /// Epoch increments so far (a test watches the clock sleep with it).
    ticks: u64,
}

impl Clock {
    fn start() -> Arc<Clock> {
        let clock = Arc::new(Clock {
            state: Mutex::default(),
            calls: Condvar::new(),
        });
        let own = clock.clone();
        std::thread::Builder::new()
            .name("valet-policy-clock".into())
            .spawn(move || own.run())
            .expect("starting the policy clock thread");
        clock
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn run(&self) {
        loop {
            let engines: Vec<Engine> = {
                let mut state = self.lock();
                while state.running == 0 {
                    state = self.calls.wait(state).unwrap_or_else(|p| p.into_inner());
                }
                state.engines.retain(|e| e.upgrade().is_some());
                state.ticks += 1;
                state
                    .engines
                    .iter()
                    .filter_map(EngineWeak::upgrade)
                    .collect()
            };
            std::thread::sleep(TICK);
            for engine in engines {
                engine.increment_epoch();
            }
        }
    }

    fn register(&self, engine: &Engine) {
        self.lock().engines.push(engine.weak());
    }

    fn call(self: &Arc<Self>) -> Running {
        let mut state = self.lock();
        state.running += 1;
        if state.running == 1 {
            self.calls.notify_one();
        }
        Running(self.clone())
    }
}

/// Puts `engine` on the clock for as long as it lives.
pub fn register(engine: &Engine) {
    CLOCK.register(engine);
}

/// A policy call in progress: the clock ticks while one exists.
pub struct Running(Arc<Clock>);

impl Running {
    pub fn start() -> Running {
        CLOCK.call()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.lock().running -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_ticks_only_while_a_call_runs() {
        // A clock of its own: other tests' policy calls run on the process's.
        let clock = Clock::start();
        let engine = Engine::default();
        clock.register(&engine);
        let ticks = || clock.lock().ticks;
        let call = clock.call();
        std::thread::sleep(20 * TICK);
        assert!(ticks() > 0, "no tick while a call ran");
        drop(call);
        // The tick in progress when the call ended may still count; after it, none.
        std::thread::sleep(5 * TICK);
        let idle = ticks();
        std::thread::sleep(20 * TICK);
        assert_eq!(ticks(), idle, "the clock ticked with no call running");
        let _again = clock.call();
        std::thread::sleep(20 * TICK);
        assert!(ticks() > idle, "a new call did not wake the clock");
    }
}
