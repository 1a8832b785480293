//! `lazybuf check`: a short run of the coherence contract on each device, compared step by
//! step with a reference model ([`model`]):
//!
//! 1. **transitions**: every operation from every one of the six states, on a small buffer
//!    and, where the device aliases host memory from some size (zero-copy), on one that large;
//! 2. **random**: random sequences of operations on buffers from empty to zero-copy sizes;
//! 3. **faults**: each allocation every transition of the small buffer makes is made to fail
//!    in turn
//!    ([`faults::FailingResource`]); the error must surface, and state, counters and data
//!    must stay as they were; and an operation must make exactly the allocations the
//!    contract needs.
//!
//! After each operation the buffer's state, its counters (bytes moved each way, zero-copy
//! syncs, allocations) and every element it returned are compared with the model. The first
//! divergence ends the device's check and is printed; the exit status is then 1.
//!
//! Test suites can run `check` on a deliberately broken device (feature `testing`, hidden
//! option `--inject-fault copy:N|allocation:N`: lazybuf's `FaultyDevice` fails its N-th copy
//! or allocation) to prove that a broken device fails the check.

pub mod faults;
pub mod model;

use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use lazybuf::{BufferOptions, BufferState, Device, UnifiedBuffer};

use crate::cli::CheckArgs;
use crate::devices::{select_or_all, selector_of, zero_copy_threshold};
use crate::error::CliError;
use crate::output::Terminal;
use crate::{Context, Result};
use faults::FailingResource;
use model::{Access, Counters, Loc, Model};

/// One operation on a buffer of `u32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `host()`: a host read.
    HostRead,
    /// `host_mut()`, then element 0 written.
    HostWrite(u32),
    /// `host_overwrite()`, every element written.
    HostOverwrite(u32),
    /// `device()`, then read back.
    DeviceRead,
    /// `device_mut()`, then element 0 written through the view.
    DeviceWrite(u32),
    /// `device_overwrite()`, every element written through the view.
    DeviceOverwrite(u32),
    /// `sync_to_device()`.
    SyncToDevice,
    /// `sync_to_host()`.
    SyncToHost,
    /// `sync_to_device_async()`, then waited for and settled (`poll()`).
    SyncToDeviceAsync,
    /// `sync_to_host_async()`, then waited for and settled (`poll()`).
    SyncToHostAsync,
    /// `mark_host_dirty()`.
    MarkHostDirty,
    /// `mark_device_dirty()`.
    MarkDeviceDirty,
    /// `fill(value)`.
    Fill(u32),
    /// `copy_from(pattern)`.
    CopyFrom(u32),
    /// `to_vec()`.
    ToVec,
    /// `invalidate()`.
    Invalidate,
    /// `release_memory()`.
    Release,
}

impl Op {
    /// One of each operation (with fixed seeds), the transitions part's list.
    pub const ALL: [Op; 17] = [
        Op::HostRead,
        Op::HostWrite(11),
        Op::HostOverwrite(12),
        Op::DeviceRead,
        Op::DeviceWrite(13),
        Op::DeviceOverwrite(14),
        Op::SyncToDevice,
        Op::SyncToHost,
        Op::SyncToDeviceAsync,
        Op::SyncToHostAsync,
        Op::MarkHostDirty,
        Op::MarkDeviceDirty,
        Op::Fill(15),
        Op::CopyFrom(16),
        Op::ToVec,
        Op::Invalidate,
        Op::Release,
    ];

    /// A random operation with random values.
    fn random(rng: &mut Rng) -> Op {
        let value = rng.next() as u32;
        match Op::ALL[(rng.next() % Op::ALL.len() as u64) as usize] {
            Op::HostWrite(_) => Op::HostWrite(value),
            Op::HostOverwrite(_) => Op::HostOverwrite(value),
            Op::DeviceWrite(_) => Op::DeviceWrite(value),
            Op::DeviceOverwrite(_) => Op::DeviceOverwrite(value),
            Op::Fill(_) => Op::Fill(value),
            Op::CopyFrom(_) => Op::CopyFrom(value),
            op => op,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::HostRead => write!(f, "host()"),
            Op::HostWrite(v) => write!(f, "host_mut()[0] = {v}"),
            Op::HostOverwrite(s) => write!(f, "host_overwrite() <- pattern {s}"),
            Op::DeviceRead => write!(f, "device()"),
            Op::DeviceWrite(v) => write!(f, "device_mut()[0] = {v}"),
            Op::DeviceOverwrite(s) => write!(f, "device_overwrite() <- pattern {s}"),
            Op::SyncToDevice => write!(f, "sync_to_device()"),
            Op::SyncToHost => write!(f, "sync_to_host()"),
            Op::SyncToDeviceAsync => write!(f, "sync_to_device_async().wait(), poll()"),
            Op::SyncToHostAsync => write!(f, "sync_to_host_async().wait(), poll()"),
            Op::MarkHostDirty => write!(f, "mark_host_dirty()"),
            Op::MarkDeviceDirty => write!(f, "mark_device_dirty()"),
            Op::Fill(v) => write!(f, "fill({v})"),
            Op::CopyFrom(s) => write!(f, "copy_from(pattern {s})"),
            Op::ToVec => write!(f, "to_vec()"),
            Op::Invalidate => write!(f, "invalidate()"),
            Op::Release => write!(f, "release_memory()"),
        }
    }
}

/// The six states, each with operations that reach it from a new buffer.
pub const STATES: [(BufferState, &[Op]); 6] = [
    (BufferState::Uninitialized, &[]),
    (BufferState::HostOnly, &[Op::CopyFrom(1)]),
    (BufferState::DeviceOnly, &[Op::DeviceOverwrite(2)]),
    (BufferState::Synchronized, &[Op::CopyFrom(3), Op::SyncToDevice]),
    (BufferState::HostDirty, &[Op::CopyFrom(4), Op::SyncToDevice, Op::MarkHostDirty]),
    (BufferState::DeviceDirty, &[Op::CopyFrom(5), Op::SyncToDevice, Op::MarkDeviceDirty]),
];

/// What went differently from the model (or from the contract), in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Divergence(pub String);

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

type Checked<T = ()> = std::result::Result<T, Divergence>;

fn diverged<T>(message: impl Into<String>) -> Checked<T> {
    Err(Divergence(message.into()))
}

/// A deterministic, seed-dependent pattern of `n` values (the one lazybuf's tests use).
pub fn pattern(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(seed.wrapping_mul(40_503))).collect()
}

/// splitmix64: small, seedable, good enough to pick operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// What a real operation handed back to compare with the model.
enum Observed {
    Nothing,
    /// Elements read (host view, device view, to_vec).
    Read(Vec<u32>),
    /// Elements seen by a write access before it wrote.
    BeforeWrite(Vec<u32>),
}

/// A real buffer and its model, side by side.
pub struct Subject {
    resource: Arc<FailingResource>,
    buf: UnifiedBuffer<u32>,
    model: Model,
}

impl Subject {
    /// A new buffer of `len` elements on `device`, its memory from a [`FailingResource`].
    pub fn new(device: &Device, len: usize) -> Checked<Subject> {
        let resource = FailingResource::new();
        let options = BufferOptions {
            device: Some(device.clone()),
            resource: Some(resource.clone()),
            ..BufferOptions::default()
        };
        let buf = match UnifiedBuffer::<u32>::with_options(&[len], options) {
            Ok(buf) => buf,
            Err(err) => return diverged(format!("a new buffer of {len} elements: {err}")),
        };
        let model = Model::new(len, device.is_zero_copy(len * 4));
        let subject = Subject { resource, buf, model };
        subject.compare("a new buffer")?;
        Ok(subject)
    }

    /// A buffer brought to `state` by `recipe`, checked on the way.
    pub fn in_state(device: &Device, len: usize, state: BufferState, recipe: &[Op]) -> Checked<Subject> {
        let mut subject = Subject::new(device, len)?;
        for &op in recipe {
            subject.apply(op).map_err(|d| Divergence(format!("reaching {state}: {d}")))?;
        }
        if subject.model.state() != state {
            return diverged(format!("reaching {state}: the model says {}", subject.model.state()));
        }
        Ok(subject)
    }

    /// Runs `op` on the buffer and the model, and compares them.
    pub fn apply(&mut self, op: Op) -> Checked {
        let before = self.buf.state();
        let observed = match self.run(op) {
            Ok(observed) => observed,
            Err(err) => {
                let expected = {
                    let mut m = self.model.clone();
                    model_apply(&mut m, op);
                    m.state()
                };
                return diverged(format!("{op} from {before}: expected {expected}, got the error: {err}"));
            }
        };
        let context = format!("{op} from {before}");
        model_apply(&mut self.model, op);
        match observed {
            Observed::Nothing => {}
            Observed::Read(values) => self.known(&values, &context)?,
            Observed::BeforeWrite(values) => {
                self.known(&values, &context)?;
                if let (Op::HostWrite(v) | Op::DeviceWrite(v), Some(first)) =
                    (op, self.model.data.first_mut())
                {
                    *first = Some(v);
                }
            }
        }
        self.compare(&context)
    }

    /// The real operation.
    fn run(&mut self, op: Op) -> lazybuf::Result<Observed> {
        let len = self.model.len;
        let buf = &mut self.buf;
        Ok(match op {
            Op::HostRead => Observed::Read(buf.host()?.to_vec()),
            Op::HostWrite(v) => {
                let host = buf.host_mut()?;
                let before = host.to_vec();
                if let Some(first) = host.first_mut() {
                    *first = v;
                }
                Observed::BeforeWrite(before)
            }
            Op::HostOverwrite(seed) => {
                buf.host_overwrite()?.copy_from_slice(&pattern(seed, len));
                Observed::Nothing
            }
            Op::DeviceRead => {
                let mut values = vec![0; len];
                buf.device()?.read_into(&mut values)?;
                Observed::Read(values)
            }
            Op::DeviceWrite(v) => {
                let mut view = buf.device_mut()?;
                let mut values = vec![0; len];
                view.read_into(&mut values)?;
                let before = values.clone();
                if let Some(first) = values.first_mut() {
                    *first = v;
                    view.write_from(&values)?;
                }
                Observed::BeforeWrite(before)
            }
            Op::DeviceOverwrite(seed) => {
                buf.device_overwrite()?.write_from(&pattern(seed, len))?;
                Observed::Nothing
            }
            Op::SyncToDevice => buf.sync_to_device().map(|()| Observed::Nothing)?,
            Op::SyncToHost => buf.sync_to_host().map(|()| Observed::Nothing)?,
            Op::SyncToDeviceAsync => {
                buf.sync_to_device_async()?.wait()?;
                buf.poll().map(|()| Observed::Nothing)?
            }
            Op::SyncToHostAsync => {
                buf.sync_to_host_async()?.wait()?;
                buf.poll().map(|()| Observed::Nothing)?
            }
            Op::MarkHostDirty => buf.mark_host_dirty().map(|()| Observed::Nothing)?,
            Op::MarkDeviceDirty => buf.mark_device_dirty().map(|()| Observed::Nothing)?,
            Op::Fill(v) => buf.fill(v).map(|()| Observed::Nothing)?,
            Op::CopyFrom(seed) => buf.copy_from(&pattern(seed, len)).map(|()| Observed::Nothing)?,
            Op::ToVec => Observed::Read(buf.to_vec()?),
            Op::Invalidate => {
                buf.invalidate();
                Observed::Nothing
            }
            Op::Release => {
                buf.release_memory();
                Observed::Nothing
            }
        })
    }

    fn known(&self, values: &[u32], context: &str) -> Checked {
        match self.model.first_difference(values) {
            None => Ok(()),
            Some((usize::MAX, expected, got)) => {
                diverged(format!("{context}: expected {expected} elements, got {got}"))
            }
            Some((i, expected, got)) => diverged(format!(
                "{context}: element {i} of {} is {got}, expected {expected} (stale or lost data)",
                values.len()
            )),
        }
    }

    /// Compares state, counters and business with the model.
    fn compare(&self, context: &str) -> Checked {
        let (state, expected) = (self.buf.state(), self.model.state());
        if state != expected {
            return diverged(format!("{context}: state {state}, expected {expected}"));
        }
        let counters = Counters::of(&self.buf.transfer_stats());
        if counters != self.model.counters {
            return diverged(format!(
                "{context}: counters {}, expected {}",
                describe(counters),
                describe(self.model.counters)
            ));
        }
        if self.buf.is_busy() {
            return diverged(format!(
                "{context}: a transfer is still in flight after it was waited for and settled"
            ));
        }
        Ok(())
    }

    /// Reads every element back (no fault armed) and compares with what the model knows.
    fn read_back(&mut self, context: &str) -> Checked {
        self.resource.disarm();
        self.apply(Op::ToVec).map_err(|d| Divergence(format!("{context}, reading back: {d}")))
    }
}

fn describe(c: Counters) -> String {
    format!(
        "{{to device {} B, to host {} B, zero-copy syncs {}, allocations {}}}",
        c.to_device, c.to_host, c.zero_copy_syncs, c.allocations
    )
}

/// `op` on the model.
fn model_apply(m: &mut Model, op: Op) {
    match op {
        Op::HostRead | Op::ToVec | Op::SyncToHost | Op::SyncToHostAsync => m.access(Loc::Host, Access::Read),
        Op::HostWrite(_) | Op::MarkHostDirty => m.access(Loc::Host, Access::Write),
        Op::HostOverwrite(seed) | Op::CopyFrom(seed) => {
            m.access(Loc::Host, Access::Overwrite);
            m.set_data(&pattern(seed, m.len));
        }
        Op::DeviceRead | Op::SyncToDevice | Op::SyncToDeviceAsync => m.access(Loc::Device, Access::Read),
        Op::DeviceWrite(_) | Op::MarkDeviceDirty => m.access(Loc::Device, Access::Write),
        Op::DeviceOverwrite(seed) => {
            m.access(Loc::Device, Access::Overwrite);
            m.set_data(&pattern(seed, m.len));
        }
        Op::Fill(v) => {
            let target = m.fill_target();
            m.access(target, Access::Overwrite);
            m.data = vec![Some(v); m.len];
        }
        Op::Invalidate => m.invalidate(),
        Op::Release => m.release(),
    }
}

/// The buffer lengths (elements) the transitions and faults parts use on `device`: a small
/// one, and one at the device's zero-copy threshold where it has one above that.
pub fn lengths(device: &Device) -> Vec<usize> {
    let mut lengths = vec![1000];
    if let Some(threshold) = zero_copy_threshold(device).filter(|&t| t > 4000 && t <= 256 << 20) {
        lengths.push((threshold as usize).div_ceil(4) + 3);
    }
    lengths
}

/// What one device's check did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Transitions checked.
    pub transitions: usize,
    /// Random sequences run, and their operations.
    pub sequences: usize,
    /// Operations of the random sequences.
    pub random_steps: u64,
    /// Allocations made to fail.
    pub injected: u64,
    /// Operations checked to allocate exactly what the contract needs.
    pub exact_allocations: u64,
}

/// Part 1: every operation from every state.
pub fn transitions(device: &Device, context: &Context) -> Result<Checked<usize>> {
    let mut count = 0;
    for len in lengths(device) {
        for (state, recipe) in STATES {
            for op in Op::ALL {
                if context.interrupted() {
                    return Err(CliError::interrupted());
                }
                let outcome = Subject::in_state(device, len, state, recipe).and_then(|mut s| s.apply(op));
                if let Err(d) = outcome {
                    return Ok(diverged(format!("{len} elements: {d}")));
                }
                count += 1;
            }
        }
    }
    Ok(Ok(count))
}

/// Part 2: random sequences, one per length, of `steps` operations each.
pub fn random(device: &Device, seed: u64, steps: u64, context: &Context) -> Result<Checked<usize>> {
    let mut lens = vec![0, 1, 7, 1000];
    lens.extend(lengths(device).into_iter().skip(1));
    for (i, &len) in lens.iter().enumerate() {
        let sequence_seed = seed.wrapping_add(i as u64);
        let mut rng = Rng(sequence_seed);
        let where_ = |step: u64, d: Divergence, recent: &[Op]| {
            let recent: Vec<String> = recent.iter().map(ToString::to_string).collect();
            Divergence(format!(
                "sequence {} ({len} elements, seed {sequence_seed}), step {step}: {d} (after: {})",
                i + 1,
                if recent.is_empty() { "a new buffer".into() } else { recent.join(", ") }
            ))
        };
        let mut subject = match Subject::new(device, len) {
            Ok(s) => s,
            Err(d) => return Ok(Err(where_(0, d, &[]))),
        };
        let mut recent: Vec<Op> = Vec::new();
        for step in 1..=steps {
            if context.interrupted() {
                return Err(CliError::interrupted());
            }
            let op = Op::random(&mut rng);
            if let Err(d) = subject.apply(op) {
                return Ok(Err(where_(step, d, &recent)));
            }
            recent.push(op);
            if recent.len() > 6 {
                recent.remove(0);
            }
        }
        if let Err(d) = subject.read_back("the end of the sequence") {
            return Ok(Err(where_(steps, d, &recent)));
        }
    }
    Ok(Ok(lens.len()))
}

/// Part 3: every allocation of every transition made to fail in turn; then one more run with
/// the allocation after the last one armed, which must not fire (no extra allocation).
/// Returns (allocations failed, operations checked for exact allocations).
pub fn fault_injection(device: &Device, context: &Context) -> Result<Checked<(u64, u64)>> {
    let (mut injected, mut exact) = (0, 0);
    // The small buffer only: the zero-copy path's allocation (the host block) is covered by
    // the host device, where every size is zero-copy.
    for len in lengths(device).into_iter().take(1) {
        for (state, recipe) in STATES {
            for op in Op::ALL {
                let needed = {
                    let mut m = Model::new(len, device.is_zero_copy(len * 4));
                    recipe.iter().for_each(|&r| model_apply(&mut m, r));
                    let before = m.counters.allocations;
                    model_apply(&mut m, op);
                    m.counters.allocations - before
                };
                for n in 1..=needed + 1 {
                    if context.interrupted() {
                        return Err(CliError::interrupted());
                    }
                    let outcome = one_fault(device, len, state, recipe, op, n, needed);
                    if let Err(d) = outcome {
                        return Ok(diverged(format!("from {state}, {len} elements: {d}")));
                    }
                    if n <= needed { injected += 1 } else { exact += 1 }
                }
            }
        }
    }
    Ok(Ok((injected, exact)))
}

/// `op` from `state` with the `n`-th allocation failing (of the `needed` the contract says it
/// makes; `n > needed`: must not fire).
fn one_fault(
    device: &Device,
    len: usize,
    state: BufferState,
    recipe: &[Op],
    op: Op,
    n: u64,
    needed: u64,
) -> Checked {
    let mut subject = Subject::in_state(device, len, state, recipe)?;
    let fired_before = subject.resource.fired();
    subject.resource.fail_in(n);
    let result = subject.run(op).map(drop);
    subject.resource.disarm();
    let fired = subject.resource.fired() > fired_before;
    let what = format!("{op} with allocation #{n} failing");
    match (n <= needed, result) {
        (true, Err(err)) if FailingResource::is_injected(&err) => {
            // The contract: an error, and nothing changed.
            subject.compare(&format!("{what} (after the error)"))?;
            subject.read_back(&what)
        }
        (true, Err(err)) => {
            diverged(format!("{what}: expected the injected out-of-memory error, got: {err}"))
        }
        (true, Ok(())) if fired => {
            diverged(format!("{what}: the allocation failed but the call succeeded (error swallowed)"))
        }
        (true, Ok(())) => diverged(format!(
            "{what}: the contract needs {needed} allocation(s), but allocation #{n} was never made"
        )),
        (false, Ok(())) if fired => {
            diverged(format!("{op}: made more than the {needed} allocation(s) the contract needs"))
        }
        (false, Err(err)) if FailingResource::is_injected(&err) => diverged(format!(
            "{op}: made more than the {needed} allocation(s) the contract needs, and failed on the extra one"
        )),
        (false, Err(err)) => diverged(format!("{op} from {state}: {err}")),
        (false, Ok(())) => {
            // No fault fired: the operation must have done what the model says.
            model_apply(&mut subject.model, op);
            subject.compare(&format!("{op} from {state}"))
        }
    }
}

/// Checks one device; prints its parts as they finish.
fn check_device(
    device: &Device,
    name: &str,
    args: &CheckArgs,
    seed: u64,
    context: &Context,
    terminal: Terminal,
) -> Result<Checked<Summary>> {
    let mut summary = Summary::default();
    let ok = terminal.good("ok");
    let fail = |part: &str, d: Divergence| {
        outln!("  {part:<12} {}", terminal.bad("FAIL"));
        outln!("    {d}");
        Ok(Err(Divergence(format!("{name}: {d}"))))
    };
    match transitions(device, context)? {
        Ok(n) => {
            let sizes = lengths(device).len();
            outln!(
                "  {:<12} {ok}  {n} ({} states x {} operations x {sizes} size{})",
                "transitions",
                STATES.len(),
                Op::ALL.len(),
                if sizes > 1 { "s" } else { "" }
            );
            summary.transitions = n;
        }
        Err(d) => return fail("transitions", d),
    }
    match random(device, seed, args.steps, context)? {
        Ok(n) => {
            outln!("  {:<12} {ok}  {n} sequences x {} operations (seed {seed})", "random", args.steps);
            summary.sequences = n;
            summary.random_steps = n as u64 * args.steps;
        }
        Err(d) => return fail("random", d),
    }
    match fault_injection(device, context)? {
        Ok((injected, exact)) => {
            outln!(
                "  {:<12} {ok}  {injected} allocations failed, state and data kept; {exact} operations allocated exactly what they need",
                "faults"
            );
            if injected == 0 {
                return fail("faults", Divergence("no allocation was ever made to fail".into()));
            }
            summary.injected = injected;
            summary.exact_allocations = exact;
        }
        Err(d) => return fail("faults", d),
    }
    Ok(Ok(summary))
}

/// Runs `lazybuf check`: 0 when every device passes, 1 otherwise.
pub fn run(args: &CheckArgs, context: &Context) -> Result<i32> {
    let devices = select_or_all(args.device.as_deref())?;
    let all = lazybuf::devices();
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64 % 1_000_000)
    });
    let terminal = Terminal::detect();
    #[cfg(feature = "testing")]
    let fault = args.inject_fault.as_deref().map(parse_fault).transpose()?;
    let mut failures = Vec::new();
    for device in &devices {
        let name = selector_of(device, &all);
        #[allow(unused_mut)]
        let (mut device, mut note) = (device.clone(), String::new());
        #[cfg(feature = "testing")]
        if let Some((kind, n)) = fault {
            let (faulty, plan) = lazybuf::testing::FaultyDevice::wrap(&device);
            match kind {
                FaultKind::Copy => plan.fail_copy_in(n),
                FaultKind::Allocation => plan.fail_allocation_in(n),
            }
            device = faulty;
            note = format!(", broken on purpose: its {} #{n} fails", kind.name());
        }
        outln!(
            "{}",
            terminal.bold(&format!("check {name} ({}, {}{note})", device.name(), device.backend_kind()))
        );
        match check_device(&device, &name, args, seed, context, terminal)? {
            Ok(_) => {}
            Err(d) => failures.push(d),
        }
    }
    if failures.is_empty() {
        outln!("{}: the coherence contract holds on {} device(s)", terminal.good("PASS"), devices.len());
        Ok(0)
    } else {
        for d in &failures {
            outln!("{}: {d}", terminal.bad("FAIL"));
        }
        Ok(1)
    }
}

/// What `--inject-fault` breaks.
#[cfg(feature = "testing")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FaultKind {
    Copy,
    Allocation,
}

#[cfg(feature = "testing")]
impl FaultKind {
    fn name(self) -> &'static str {
        match self {
            FaultKind::Copy => "copy",
            FaultKind::Allocation => "allocation",
        }
    }
}

#[cfg(feature = "testing")]
fn parse_fault(text: &str) -> Result<(FaultKind, u64)> {
    let bad =
        || CliError::new(format!("--inject-fault: expected copy:N or allocation:N (N from 1), got {text:?}"));
    let (kind, n) = text.split_once(':').ok_or_else(bad)?;
    let n: u64 = n.parse().ok().filter(|&n| n > 0).ok_or_else(bad)?;
    match kind {
        "copy" => Ok((FaultKind::Copy, n)),
        "allocation" => Ok((FaultKind::Allocation, n)),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_is_reached_and_every_transition_holds_on_the_host() {
        let n = transitions(&Device::host(), &Context::uninterruptible()).unwrap().unwrap();
        assert_eq!(n, 6 * 17);
    }

    #[test]
    fn random_sequences_hold_on_the_host() {
        assert_eq!(random(&Device::host(), 7, 100, &Context::uninterruptible()).unwrap(), Ok(4));
    }

    #[test]
    fn injected_allocation_failures_keep_state_and_data_on_the_host() {
        let (injected, exact) =
            fault_injection(&Device::host(), &Context::uninterruptible()).unwrap().unwrap();
        assert!(injected > 0);
        assert_eq!(exact, 6 * 17);
    }

    #[test]
    fn a_model_that_disagrees_is_a_divergence_naming_the_operation() {
        let mut subject = Subject::new(&Device::host(), 4).unwrap();
        subject.apply(Op::CopyFrom(1)).unwrap();
        // The model believes other data: the next read must be reported as a divergence.
        subject.model.set_data(&[9, 9, 9, 9]);
        let d = subject.apply(Op::HostRead).unwrap_err().to_string();
        assert!(d.contains("host() from HOST_ONLY") && d.contains("element 0"), "{d}");
        // And a model in another state is one too.
        subject.model.release();
        let d = subject.apply(Op::MarkHostDirty).unwrap_err().to_string();
        assert!(d.contains("mark_host_dirty() from HOST_ONLY: counters"), "{d}");
    }

    #[test]
    fn the_patterns_and_the_random_operations_are_reproducible() {
        assert_eq!(pattern(3, 4), pattern(3, 4));
        assert_ne!(pattern(3, 4), pattern(4, 4));
        let (mut a, mut b) = (Rng(5), Rng(5));
        let ops_a: Vec<Op> = (0..500).map(|_| Op::random(&mut a)).collect();
        let ops_b: Vec<Op> = (0..500).map(|_| Op::random(&mut b)).collect();
        assert_eq!(ops_a, ops_b);
        assert!(
            Op::ALL
                .iter()
                .all(|op| ops_a.iter().any(|o| std::mem::discriminant(o) == std::mem::discriminant(op)))
        );
    }
}
