//! The transfer guard: allow, log or refuse the copies lazybuf would make, per direction, per
//! thread and process-wide, as JAX's `jax.transfer_guard` does.
//!
//! **Levels** (JAX's names and meanings). An *explicit* copy is one the caller asked for
//! (`sync_to_*`, `copy_to`, `to_vec`; in Python also `to_numpy`, `copy_from`, `copy_to`,
//! `synchronize`, `allocate`); an *implicit* one is made for an access (a host or device view,
//! `mark_*_dirty`, a fill) or by spilling:
//!
//! | level | implicit copies | explicit copies |
//! |---|---|---|
//! | `allow` | allowed | allowed |
//! | `log` | logged | allowed |
//! | `disallow` | refused | allowed |
//! | `log_explicit` | logged | logged |
//! | `disallow_explicit` | refused | refused |
//!
//! **Scopes.** Each direction (`h2d`, `d2h`, `d2d`) has a process-wide level ([`set_global`],
//! initially from `LAZYBUF_TRANSFER_GUARD`, else `allow`) and, per thread, an optional level
//! that overrides it ([`scope`], [`set_thread`]): a thread's guard never applies to another
//! thread. `LAZYBUF_TRANSFER_GUARD` is either one level for every direction (`disallow`) or a
//! comma-separated list (`h2d=disallow,d2h=log`, each direction at most once); a value that is
//! neither makes every guarded check fail with an error that names the accepted values.
//!
//! **When.** The engine checks a plan's copies when the plan is made, before anything is
//! allocated, enqueued or committed: a refused access changes nothing. A logged copy is written
//! as one line on standard error (or handed to the hook of [`set_log_hook`]) when its plan is
//! checked.
//!
//! ```
//! use lazybuf::observe::guard::{self, GuardLevel, GuardLevels};
//! use lazybuf::observe::Direction;
//! use lazybuf::{Device, Error, UnifiedBuffer};
//!
//! let device = Device::host(); // any device; on the host a sync moves no byte, so none is refused
//! let mut buf = UnifiedBuffer::<f32>::on(&[256], &device)?;
//! buf.host_mut()?.fill(1.0);
//! // On this thread, until `_scope` goes: implicit host-to-device copies are refused.
//! let _scope = guard::scope(GuardLevels::default().with(Direction::HostToDevice, Some(GuardLevel::Disallow)));
//! match buf.device() {
//!     Err(Error::TransferGuard { call, bytes, .. }) => println!("refused: {call} would copy {bytes} bytes"),
//!     other => { other?; } // a zero-copy device: nothing to refuse
//! }
//! buf.sync_to_device()?; // explicit: allowed under `disallow`
//! # Ok::<(), lazybuf::Error>(())
//! ```

use std::fmt;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, PoisonError, RwLock, Weak};

pub use super::kinds::GuardLevel;
use super::kinds::NAMES;
use super::{Direction, GUARD_BIT, TransferInfo};
use crate::backend::fork::{ForkAwareMutex, ForkAwareOnce};
use crate::error::{Error, Result};

impl GuardLevel {
    const ALL: [GuardLevel; 5] = [
        GuardLevel::Allow,
        GuardLevel::Log,
        GuardLevel::Disallow,
        GuardLevel::LogExplicit,
        GuardLevel::DisallowExplicit,
    ];

    /// The level's name (`"disallow"`).
    pub fn name(self) -> &'static str {
        NAMES[self as usize]
    }

    /// The level named `name`, else an error naming the accepted values (`what` names the
    /// argument in it).
    pub fn parse(name: &str, what: &'static str) -> Result<GuardLevel> {
        let wanted = name.trim();
        Self::ALL.into_iter().find(|level| level.name() == wanted).ok_or_else(|| {
            Error::invalid(what, format!("expected one of {}, got {name:?}", NAMES.join(", ")))
        })
    }

    fn from_u8(value: u8) -> GuardLevel {
        Self::ALL.get(usize::from(value)).copied().unwrap_or_default()
    }

    fn verdict(self, explicit: bool) -> Verdict {
        match (self, explicit) {
            (GuardLevel::Allow, _) | (GuardLevel::Log | GuardLevel::Disallow, true) => Verdict::Allow,
            (GuardLevel::Log, false) | (GuardLevel::LogExplicit, _) => Verdict::Log,
            (GuardLevel::Disallow, false) | (GuardLevel::DisallowExplicit, _) => Verdict::Refuse,
        }
    }

    /// What the level does, in words, for error messages.
    pub(crate) fn meaning(self) -> &'static str {
        match self {
            GuardLevel::Allow => "every transfer allowed",
            GuardLevel::Log => "implicit transfers logged, explicit ones allowed",
            GuardLevel::Disallow => {
                "implicit transfers refused; explicit ones (sync_to_device(), sync_to_host(), copy_to(), \
                 to_numpy()) are allowed"
            }
            GuardLevel::LogExplicit => "every transfer logged",
            GuardLevel::DisallowExplicit => "every transfer refused",
        }
    }
}

impl fmt::Display for GuardLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

enum Verdict {
    Allow,
    Log,
    Refuse,
}

/// A level per direction (`None`: not set here), indexed as [`Direction::ALL`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuardLevels(pub [Option<GuardLevel>; 3]);

impl GuardLevels {
    /// `level` for every direction.
    pub fn all(level: GuardLevel) -> GuardLevels {
        GuardLevels([Some(level); 3])
    }

    /// The level for `direction`, if set.
    pub fn get(&self, direction: Direction) -> Option<GuardLevel> {
        self.0[direction.index()]
    }

    /// These levels with `direction`'s set to `level`.
    pub fn with(mut self, direction: Direction, level: Option<GuardLevel>) -> GuardLevels {
        self.0[direction.index()] = level;
        self
    }

    /// Parses `disallow` (every direction) or `h2d=disallow,d2h=log` (the directions named,
    /// each at most once: a direction named twice is refused, never left to the order of its
    /// levels); `what` names the setting in errors.
    pub fn parse(text: &str, what: &'static str) -> Result<GuardLevels> {
        if !text.contains('=') {
            return GuardLevel::parse(text, what).map(GuardLevels::all);
        }
        let mut levels = GuardLevels::default();
        for part in text.split(',').filter(|p| !p.trim().is_empty()) {
            let (key, value) = part.split_once('=').ok_or_else(|| {
                Error::invalid(what, format!("expected DIRECTION=LEVEL (h2d=disallow), got {part:?}"))
            })?;
            let direction = Direction::ALL.into_iter().find(|d| d.name() == key.trim()).ok_or_else(|| {
                Error::invalid(what, format!("expected a direction h2d, d2h or d2d, got {:?}", key.trim()))
            })?;
            let level = GuardLevel::parse(value, what)?;
            if let Some(first) = levels.get(direction) {
                return Err(Error::invalid(
                    what,
                    format!(
                        "expected each direction once, got {} twice ({}={first} and {}={level}) in {text:?}",
                        direction.name(),
                        direction.name(),
                        direction.name()
                    ),
                ));
            }
            levels = levels.with(direction, Some(level));
        }
        Ok(levels)
    }
}

/// The process-wide levels, as `GuardLevel as u8`.
static GLOBAL: [AtomicU8; 3] = [AtomicU8::new(0), AtomicU8::new(0), AtomicU8::new(0)];

/// Serializes the writers of [`GLOBAL`], the thread count and [`super::ACTIVE`]. Fork-aware
/// (`backend::fork`): a forked child whose parent's thread held it at the fork does not wait.
static STATE: ForkAwareMutex<usize> = ForkAwareMutex::unwatched(0);

/// `LAZYBUF_TRANSFER_GUARD`, read once.
static ENV: ForkAwareOnce<Result<()>> = ForkAwareOnce::new();

/// Receives each logged copy and the level that logged it ([`set_log_hook`]).
pub type LogHook = Arc<dyn Fn(&TransferInfo, GuardLevel) + Send + Sync>;
static LOG_HOOK: RwLock<Option<LogHook>> = RwLock::new(None);

/// The environment variable that sets the initial process-wide levels.
pub const ENV_VAR: &str = "LAZYBUF_TRANSFER_GUARD";

/// Takes the writers' lock; `threads` counts the threads with levels of their own.
fn with_state<R>(f: impl FnOnce(&mut usize) -> R) -> R {
    crate::backend::fork::watch_every_fork();
    let Some(mut threads) = STATE.lock() else {
        // A forked child whose parent's thread held the lock at the fork: the count is gone,
        // so the hooks stay on for good (they then look at each thread's levels, which is
        // always right; the bit only lets them skip that when nothing guards).
        let result = f(&mut 0);
        super::set_bit(GUARD_BIT, true);
        return result;
    };
    let result = f(&mut threads);
    let global_on = GLOBAL.iter().any(|l| l.load(Ordering::Relaxed) != 0);
    let env_bad = matches!(ENV.get(), Some(Err(_)));
    super::set_bit(GUARD_BIT, global_on || env_bad || *threads > 0);
    result
}

/// Reads `LAZYBUF_TRANSFER_GUARD` if that was not done yet; its error, if it is malformed.
pub(crate) fn env() -> Result<()> {
    ENV.get_or_init(|| {
        // (Not Unicode: malformed, never unset.)
        let parsed = match crate::env::text(ENV_VAR) {
            Ok(Some(text)) if !text.trim().is_empty() => GuardLevels::parse(&text, ENV_VAR).map(Some),
            Ok(_) => Ok(None),
            Err(err) => Err(err),
        };
        with_state(|_| {
            if let Ok(Some(levels)) = &parsed {
                store_global(*levels);
            }
        });
        parsed.map(drop)
    })
    .clone()
    .inspect(|()| super::set_bit(super::ENV_BIT, false))
    .inspect_err(|_| {
        // Keep checking: every guarded copy reports the malformed variable.
        super::set_bit(GUARD_BIT, true);
        super::set_bit(super::ENV_BIT, false);
    })
}

fn store_global(levels: GuardLevels) {
    for (slot, level) in GLOBAL.iter().zip(levels.0) {
        if let Some(level) = level {
            slot.store(level as u8, Ordering::Relaxed);
        }
    }
}

/// Sets the process-wide level of the directions `levels` names (the others keep theirs).
/// Threads with a level of their own for a direction keep using theirs. An error, with
/// nothing set, when `LAZYBUF_TRANSFER_GUARD` is malformed: every guarded access reports it
/// then, so a level set here would never take effect.
pub fn set_global(levels: GuardLevels) -> Result<()> {
    // The environment's levels are the starting point, not a later override.
    env()?;
    with_state(|_| store_global(levels));
    Ok(())
}

/// The process-wide levels (after `LAZYBUF_TRANSFER_GUARD`; its error if it is malformed).
pub fn global() -> Result<GuardLevels> {
    env()?;
    Ok(GuardLevels(std::array::from_fn(|i| Some(GuardLevel::from_u8(GLOBAL[i].load(Ordering::Relaxed))))))
}

/// A thread's guard: its own levels (what its checks read) and its open scopes, oldest first.
/// Shared (the thread holds it in [`THREAD`], [`THREADS`] lists it weakly) so that a scope
/// entered on this thread can be left from another one, as a Python generator holding a
/// `transfer_guard` block leaves it when it is finalised on another thread (before the
/// nineteenth hostile pass such an exit changed nothing, and the block's levels stayed on the
/// thread that entered it for good).
struct ThreadGuard {
    /// The levels, one byte per direction: 0 none, else the level's number + 1.
    levels: AtomicU32,
    /// The open scopes, and whether the thread has exited (a scope left afterwards changes
    /// nothing). Fork-aware: a child whose parent's thread held it at the fork gives up on the
    /// scopes instead of waiting.
    scopes: ForkAwareMutex<(Vec<OpenScope>, bool)>,
}

impl ThreadGuard {
    fn levels(&self) -> GuardLevels {
        unpack(self.levels.load(Ordering::Relaxed))
    }

    /// Replaces the levels and returns the previous ones, counting the threads with levels of
    /// their own in [`STATE`] (under its lock: the count follows every change of whether any
    /// level is set, whichever thread makes it).
    fn set(&self, levels: GuardLevels) -> GuardLevels {
        let packed = pack(levels);
        with_state(|threads| {
            let previous = self.levels.swap(packed, Ordering::Relaxed);
            match (previous == 0, packed == 0) {
                (true, false) => *threads += 1,
                (false, true) => *threads = threads.saturating_sub(1),
                _ => {}
            }
            unpack(previous)
        })
    }
}

fn pack(levels: GuardLevels) -> u32 {
    levels
        .0
        .iter()
        .enumerate()
        .fold(0, |word, (i, level)| word | level.map_or(0, |l| u32::from(l as u8) + 1) << (8 * i))
}

fn unpack(word: u32) -> GuardLevels {
    GuardLevels(std::array::from_fn(|i| match (word >> (8 * i)) & 0xff {
        0 => None,
        n => Some(GuardLevel::from_u8(n as u8 - 1)),
    }))
}

/// This thread's [`ThreadGuard`]; when the thread exits its levels go (uncounted) and its
/// scopes close.
struct ThreadSlot(Arc<ThreadGuard>);

impl Drop for ThreadSlot {
    fn drop(&mut self) {
        if let Some(mut scopes) = self.0.scopes.lock() {
            scopes.0.clear();
            scopes.1 = true;
        }
        if self.0.levels.load(Ordering::Relaxed) != 0 {
            self.0.set(GuardLevels::default());
        }
    }
}

thread_local! {
    static THREAD: ThreadSlot = ThreadSlot(Arc::new(ThreadGuard {
        levels: AtomicU32::new(0),
        scopes: ForkAwareMutex::unwatched((Vec::new(), false)),
    }));
}

/// The threads that opened a scope, for a scope left on another thread ([`leave`]). Fork-aware
/// (`backend::fork`): a forked child whose parent's thread held it at the fork does not wait.
static THREADS: ForkAwareMutex<Vec<Weak<ThreadGuard>>> = ForkAwareMutex::unwatched(Vec::new());

/// Replaces this thread's own levels (`None` per direction: the process-wide level applies)
/// and returns the previous ones.
pub fn set_thread(levels: GuardLevels) -> GuardLevels {
    let _ = env();
    THREAD.try_with(|t| t.0.set(levels)).unwrap_or_default()
}

/// This thread's own levels.
pub fn thread() -> GuardLevels {
    THREAD.try_with(|t| t.0.levels()).unwrap_or_default()
}

/// Sets this thread's levels for the directions `levels` names until the scope is dropped
/// (on this thread: the scope cannot be sent to another one).
///
/// Scopes nest last in, first out: each restores, when dropped, the levels it found. One
/// dropped out of that order (scopes kept in a struct, whose fields drop first to last; two
/// asyncio tasks' blocks on one thread, each left while the other is open) takes its own
/// levels away and leaves the others': the scopes still open apply over the levels the
/// thread had before the first of them, and once all are gone the thread has those back.
/// (Each restoring what it found left the levels of the first one entered in force for good
/// when the first one entered was the first one left: the seventeenth hostile pass.)
pub fn scope(levels: GuardLevels) -> GuardScope {
    GuardScope { token: enter(levels), _not_send: std::marker::PhantomData }
}

/// The levels [`scope`] set, until dropped.
#[derive(Debug)]
#[must_use = "the guard applies only while the scope lives"]
pub struct GuardScope {
    token: ScopeToken,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for GuardScope {
    fn drop(&mut self) {
        leave(self.token);
    }
}

/// A scope opened by [`enter`], for [`leave`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScopeToken(u64);

/// One open scope of a thread: its token, the levels it sets (`None`: unchanged) and the
/// thread's levels when it opened.
struct OpenScope {
    token: ScopeToken,
    levels: GuardLevels,
    found: GuardLevels,
}

/// `levels` over `base`: the directions `levels` names take its level.
fn overlay(base: GuardLevels, levels: GuardLevels) -> GuardLevels {
    let mut merged = base;
    for direction in Direction::ALL {
        if let Some(level) = levels.get(direction) {
            merged = merged.with(direction, Some(level));
        }
    }
    merged
}

/// Opens a scope on this thread (what [`scope`] does, for a caller that cannot hold a
/// [`GuardScope`], such as a Python context manager): `levels` over the thread's levels until
/// [`leave`] is called with the token.
pub fn enter(levels: GuardLevels) -> ScopeToken {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let token = ScopeToken(NEXT.fetch_add(1, Ordering::Relaxed));
    let _ = env();
    // (A thread whose thread-locals are gone keeps no scope: its levels are gone too.)
    let _ = THREAD.try_with(|t| {
        let Some(mut scopes) = t.0.scopes.lock() else { return };
        if scopes.0.is_empty() {
            register(&t.0);
        }
        // Read and set under the scopes' lock: a scope left from another thread meanwhile
        // cannot come between.
        let found = t.0.levels();
        t.0.set(overlay(found, levels));
        scopes.0.push(OpenScope { token, levels, found });
    });
    token
}

/// Lists `guard` among the threads with scopes (once; entries of exited threads go when the
/// list would grow past twice the live ones).
fn register(guard: &Arc<ThreadGuard>) {
    let Some(mut threads) = THREADS.lock() else { return };
    if threads.iter().any(|t| std::ptr::eq(t.as_ptr(), Arc::as_ptr(guard))) {
        return;
    }
    if threads.len() >= 64 && threads.len() == threads.capacity() {
        threads.retain(|t| t.strong_count() > 0);
    }
    threads.push(Arc::downgrade(guard));
}

/// Closes the scope `token` opened, on the thread that opened it, from this thread or any
/// other (a Python generator holding a `transfer_guard` block, finalised on another thread):
/// the innermost restores the levels it found; one left out of order takes its levels away
/// and leaves the others' ([`scope`]). False, with nothing changed, when no thread has such
/// an open scope (it was left already, or its thread has exited).
pub fn leave(token: ScopeToken) -> bool {
    if let Ok(Some(left)) = THREAD.try_with(|t| leave_on(&t.0, token)) {
        return left;
    }
    let threads: Vec<Arc<ThreadGuard>> = match THREADS.lock() {
        Some(threads) => threads.iter().filter_map(Weak::upgrade).collect(),
        None => return false,
    };
    threads.iter().any(|guard| leave_on(guard, token) == Some(true))
}

/// [`leave`] on `guard`'s thread: `None` when it has no such scope.
fn leave_on(guard: &ThreadGuard, token: ScopeToken) -> Option<bool> {
    let mut scopes = guard.scopes.lock()?;
    let (scopes, exited) = &mut *scopes;
    let index = scopes.iter().position(|s| s.token == token)?;
    if *exited {
        return Some(false);
    }
    let restore = if index + 1 == scopes.len() {
        scopes.pop().map_or_else(GuardLevels::default, |s| s.found)
    } else {
        // Out of order: the scopes after it apply over what it found, as if it had never opened.
        let left = scopes.remove(index);
        let mut levels = left.found;
        for open in &mut scopes[index..] {
            open.found = levels;
            levels = overlay(levels, open.levels);
        }
        levels
    };
    guard.set(restore);
    Some(true)
}

/// The level that applies to `direction` on this thread.
pub fn effective(direction: Direction) -> GuardLevel {
    thread()
        .get(direction)
        .unwrap_or_else(|| GuardLevel::from_u8(GLOBAL[direction.index()].load(Ordering::Relaxed)))
}

/// Sets (or, with `None`, removes) the hook that receives logged copies instead of standard
/// error.
pub fn set_log_hook(hook: Option<LogHook>) {
    *LOG_HOOK.write().unwrap_or_else(PoisonError::into_inner) = hook;
}

/// Checks the copies one call is about to make, all before any runs: the first refused one is
/// the error; when none is, the logged ones are logged.
pub(crate) fn check(copies: &[TransferInfo]) -> Result<()> {
    env()?;
    let mut logged = 0usize;
    for copy in copies {
        let level = effective(copy.direction);
        match level.verdict(copy.cause.reason.is_explicit()) {
            Verdict::Allow => {}
            Verdict::Log => logged += 1,
            Verdict::Refuse => return Err(refused(copy, level)),
        }
    }
    if logged > 0 {
        for copy in copies {
            let level = effective(copy.direction);
            if matches!(level.verdict(copy.cause.reason.is_explicit()), Verdict::Log) {
                log(copy, level);
            }
        }
    }
    Ok(())
}

/// The guard's error if it refuses `copy`, logging nothing (for a copy of a later step of a
/// call, checked before an earlier step changes anything; its own check logs it).
pub(crate) fn check_refusal(copy: &TransferInfo) -> Result<()> {
    env()?;
    let level = effective(copy.direction);
    match level.verdict(copy.cause.reason.is_explicit()) {
        Verdict::Refuse => Err(refused(copy, level)),
        Verdict::Allow | Verdict::Log => Ok(()),
    }
}

fn refused(copy: &TransferInfo, level: GuardLevel) -> Error {
    Error::TransferGuard {
        buffer: copy.buffer,
        direction: copy.direction,
        bytes: copy.bytes,
        from: copy.from.clone(),
        to: copy.to.clone(),
        call: copy.cause.call,
        explicit: copy.cause.reason.is_explicit(),
        level,
    }
}

fn log(copy: &TransferInfo, level: GuardLevel) {
    let hook = LOG_HOOK.read().unwrap_or_else(PoisonError::into_inner).clone();
    if let Some(hook) = hook {
        hook(copy, level);
        return;
    }
    #[cfg(feature = "tracing")]
    {
        tracing::warn!(
            target: "lazybuf::transfer_guard",
            buffer = copy.buffer,
            direction = copy.direction.name(),
            bytes = copy.bytes,
            call = copy.cause.call,
            "transfer guard ({level}): {}",
            describe(copy)
        );
    }
    #[cfg(not(feature = "tracing"))]
    {
        use std::io::Write as _;
        // A closed or full stderr loses the line; the copy still runs.
        let _ = writeln!(std::io::stderr(), "{}", log_line(copy, level));
    }
}

/// The line a logged copy makes on standard error (and in Python's `logging`):
/// `lazybuf transfer guard (log): host-to-device copy of 4096 bytes (host -> dev) of buffer 7,
/// caused by implicit .device`.
pub fn log_line(copy: &TransferInfo, level: GuardLevel) -> String {
    format!("lazybuf transfer guard ({level}): {}", describe(copy))
}

/// `host-to-device copy of 4096 bytes (host -> dev) of buffer 7, caused by implicit host`.
pub(crate) fn describe(copy: &TransferInfo) -> String {
    format!(
        "{} copy of {} bytes ({} -> {}) of buffer {}, caused by {} {}",
        copy.direction,
        copy.bytes,
        copy.from,
        copy.to,
        copy.buffer,
        if copy.cause.reason.is_explicit() { "explicit" } else { "implicit" },
        copy.cause.call
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hostile pass (2026-11-27): `h2d=disallow,d2h=disallow,h2d=allow` left h2d at
    /// `allow`, the last one silently winning: a direction named twice is refused.
    #[test]
    fn a_direction_named_twice_is_refused() {
        for text in ["h2d=disallow,d2h=disallow,h2d=allow", "d2d=log, d2d=log"] {
            let err = GuardLevels::parse(text, ENV_VAR).unwrap_err().to_string();
            assert!(
                err.contains(ENV_VAR)
                    && err.contains("expected each direction once")
                    && err.contains("twice"),
                "{text}: {err}"
            );
        }
        assert!(GuardLevels::parse("h2d=disallow,d2h=log,d2d=allow", ENV_VAR).is_ok());
    }
}
