//! The epoch clock: one thread advances the epoch of every engine registered with it each
//! [`TICK`] while something needs ticks, and sleeps when nothing does. Two things do: a
//! policy call in progress (its deadline, `policy.rs`) and a metered guest running (its
//! CPU budget, [`crate::cpu_limit`]: every pod of the node agent, a guest with `--cpus`);
//! each holds a [`Running`] meanwhile.
//!
//! For a policy call, a deadline is set when the call starts, in ticks from the current
//! epoch, and the callback at the deadline checks the CPU time the call used. So ticks
//! matter only while a call runs, and a clock that ticks regardless wakes for nothing, in
//! every `valet-run` and in a node agent whose pods are all idle.
//!
//! Calls come in bursts (an event for every flushed write buffer, a decision for every
//! created file), and most last microseconds. Waking the clock for each of them would cost
//! more wake-ups than ticking, so a call only wakes a sleeping clock; an awake clock ticks
//! until a whole [`QUIET`] has passed without a call, then sleeps until the next one. A
//! call therefore meets its first tick within one [`TICK`] of the clock's waking, and a
//! call that overruns its budget is stopped within a tick of the budget's end. A metered
//! guest holds its [`Running`] from start to end, so the clock ticks all that while.
//!
//! Locking: one mutex holds the engines and the clock's counters; it is never held while
//! an epoch is incremented or the clock sleeps.

use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard};
use std::time::Duration;

use wasmtime::{Engine, EngineWeak};

/// How often the epoch advances while calls are made: the granularity of call deadlines
/// (a 20 ms budget is two ticks).
pub const TICK: Duration = Duration::from_millis(10);

/// Time without any call after which the clock sleeps.
const QUIET: Duration = Duration::from_secs(1);

/// The process's clock, started with the first engine registered.
static CLOCK: LazyLock<Arc<Clock>> = LazyLock::new(Clock::start);

struct Clock {
    state: Mutex<State>,
    /// Signalled by a call that finds the clock asleep.
    wake: Condvar,
}

#[derive(Default)]
struct State {
    engines: Vec<EngineWeak>,
    /// Calls in progress.
    running: usize,
    /// Calls started so far.
    started: u64,
    /// The clock waits for a call (no tick until one starts).
    asleep: bool,
    /// Epoch increments so far (a test watches the clock sleep with it).
    ticks: u64,
}

impl Clock {
    fn start() -> Arc<Clock> {
        let clock = Arc::new(Clock {
            state: Mutex::default(),
            wake: Condvar::new(),
        });
        let own = clock.clone();
        std::thread::Builder::new()
            .name("valet-epoch-clock".into())
            .spawn(move || own.run())
            .expect("starting the epoch clock thread");
        clock
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn run(&self) {
        let quiet_ticks = (QUIET.as_millis() / TICK.as_millis()).max(1) as u32;
        let mut seen = 0;
        let mut quiet = 0;
        loop {
            let engines: Vec<Engine> = {
                let mut state = self.lock();
                if state.running == 0 && state.started == seen {
                    quiet += 1;
                } else {
                    quiet = 0;
                }
                if quiet >= quiet_ticks {
                    state.asleep = true;
                    while state.asleep {
                        state = self.wake.wait(state).unwrap_or_else(|p| p.into_inner());
                    }
                    quiet = 0;
                }
                seen = state.started;
                state.ticks += 1;
                let mut live = Vec::with_capacity(state.engines.len());
                state
                    .engines
                    .retain(|e| e.upgrade().map(|engine| live.push(engine)).is_some());
                live
            };
            std::thread::sleep(TICK);
            for engine in engines {
                engine.increment_epoch();
            }
        }
    }

    /// Adds `engine`, once (the node agent registers its one engine for every pod).
    fn register(&self, engine: &Engine) {
        let mut state = self.lock();
        let known = state
            .engines
            .iter()
            .any(|e| e.upgrade().is_some_and(|e| Engine::same(&e, engine)));
        if !known {
            state.engines.push(engine.weak());
        }
    }

    fn call(self: &Arc<Self>) -> Running {
        let mut state = self.lock();
        state.running += 1;
        state.started += 1;
        if state.asleep {
            state.asleep = false;
            self.wake.notify_one();
        }
        Running(self.clone())
    }
}

/// Puts `engine` on the clock for as long as it lives.
pub fn register(engine: &Engine) {
    CLOCK.register(engine);
}

/// A reason to tick (a policy call in progress, a metered guest running): the clock does
/// not sleep while one exists.
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

    /// Waits (a bounded time) until `clock` sleeps.
    fn until_asleep(clock: &Clock) {
        for _ in 0..500 {
            if clock.lock().asleep {
                return;
            }
            std::thread::sleep(TICK);
        }
        panic!("the clock never went to sleep");
    }

    #[test]
    fn the_clock_ticks_while_calls_are_made_and_sleeps_after_a_quiet_spell() {
        // A clock of its own: other tests' policy calls run on the process's.
        let clock = Clock::start();
        let engine = Engine::default();
        clock.register(&engine);
        let ticks = || clock.lock().ticks;
        until_asleep(&clock);
        let asleep = ticks();
        std::thread::sleep(5 * TICK);
        assert_eq!(ticks(), asleep, "the clock ticked while asleep");
        // A long call keeps it ticking past the quiet spell.
        let call = clock.call();
        std::thread::sleep(QUIET + 5 * TICK);
        assert!(ticks() > asleep + 50, "too few ticks during a call");
        assert!(!clock.lock().asleep, "the clock slept during a call");
        drop(call);
        until_asleep(&clock);
        let idle = ticks();
        std::thread::sleep(5 * TICK);
        assert_eq!(ticks(), idle, "the clock ticked with no call made");
        // A short call wakes it again.
        drop(clock.call());
        std::thread::sleep(5 * TICK);
        assert!(ticks() > idle, "a new call did not wake the clock");
    }
}
