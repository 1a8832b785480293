//! Pageable transfers pipelined through reusable pinned staging chunks, asynchronously.
//!
//! A DMA engine reads and writes only page-locked memory, so a copy from pageable memory
//! always passes through a pinned buffer; the driver's own path does so one piece at a time
//! on the calling thread. Here the transfer is cut into [`CHUNK`]-byte pieces spread over up
//! to [`MAX_LANES`] lanes, each a thread of its own that lives as long as the staging memory.
//! A lane owns two pinned slots with one event each: while the DMA of one slot runs, the
//! lane's CPU copy fills (upload) or drains (download) the other, and before reusing a slot it
//! waits on the slot's event, recorded after that slot's last DMA on the transfer's stream.
//! Several lanes keep the CPU side of the copy from being the bottleneck on fast links (one
//! core's memcpy is slower than a PCIe 5 x16 link).
//!
//! A transfer is handed to the lanes and returns at once with a ticket (a [`Signal`]) that
//! completes when every lane has finished its part and its DMAs are done: the copy overlaps
//! whatever the caller does next. The caller keeps the host memory and the device allocation
//! alive and untouched until then (the backend's `upload`/`download` contract).
//!
//! The sizes are starting points, to be tuned on a GPU with benches/cuda_bandwidth.rs: 4 MiB
//! pieces are large enough that a DMA's fixed cost is small against its transfer time, and
//! [`PIPELINE_MIN`] is two pieces, the least that can overlap anything; smaller transfers
//! take the driver's pageable path directly.
//!
//! What does not live here: deciding which memory needs staging (`device.rs` looks at the
//! host memory's [`crate::host_memory::Pinning`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use cudarc::driver::{result, sys};

use super::pinned::PinnedBlock;
use super::{Context, cuda_error, enqueue_lock};
use crate::backend::{HostSpan, Signal, Ticket};
use crate::error::{Error, Result};
use crate::host_memory::HostMemory;

/// Bytes per staged piece (and per slot).
pub const CHUNK: usize = 4 << 20;
/// Pageable transfers of at least this many bytes are staged; smaller ones use the driver.
pub const PIPELINE_MIN: usize = 2 * CHUNK;
/// The most lanes (threads) one transfer uses.
pub const MAX_LANES: usize = 4;

/// A stream handle that lane threads may use.
#[derive(Clone, Copy)]
struct RawStreamHandle(sys::CUstream);

// SAFETY: CUDA streams may be used from any thread; enqueueing is thread-safe. The transfer's
// caller keeps the stream alive until the transfer's ticket completes.
unsafe impl Send for RawStreamHandle {}

/// One lane's share of a transfer.
enum Part {
    Upload { src: HostSpan, dst: sys::CUdeviceptr },
    Download { src: sys::CUdeviceptr, dst: HostSpan },
}

struct Job {
    part: Part,
    stream: RawStreamHandle,
    done: Arc<Countdown>,
}

/// Completes a transfer's signal once all of its parts are done, with the first error.
struct Countdown {
    remaining: AtomicUsize,
    first_error: Mutex<Option<Error>>,
    signal: Arc<Signal>,
}

impl Countdown {
    fn finish_part(&self, outcome: Result<()>) {
        if let Err(err) = outcome {
            self.first_error.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(err);
        }
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let error = self.first_error.lock().unwrap_or_else(PoisonError::into_inner).take();
            self.signal.finish(error.map_or(Ok(()), Err));
        }
    }
}

/// One lane's two pinned slots and their events, owned by the lane's thread.
struct Lane {
    slots: [*mut u8; 2],
    events: [sys::CUevent; 2],
    /// Keeps the staging memory alive while the lane can touch its slots.
    _block: Arc<HostMemory>,
}

// SAFETY: the slots point into the staging block, disjoint per lane, and only the lane's own
// thread uses them; events are driver handles usable from any thread.
unsafe impl Send for Lane {}

struct Worker {
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

/// Pinned staging memory and lane threads for one device, reused by every staged transfer.
pub(super) struct Staging {
    workers: Vec<Worker>,
}

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging").field("lanes", &self.workers.len()).field("chunk", &CHUNK).finish()
    }
}

impl Staging {
    /// Allocates staging for up to [`MAX_LANES`] lanes (as many as there are CPUs) and starts
    /// their threads. `context` must be current.
    pub(super) fn new(context: &Arc<Context>, device_name: &str) -> Result<Staging> {
        let lanes = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, MAX_LANES);
        let mut block =
            PinnedBlock::allocate(context, lanes * 2 * CHUNK, sys::CU_MEMHOSTALLOC_PORTABLE, device_name)?;
        let base = block.as_mut_ptr();
        let block = Arc::new(block);
        let mut staging = Staging { workers: Vec::with_capacity(lanes) };
        for lane in 0..lanes {
            let first = new_event()?;
            let second = new_event().inspect_err(|_| {
                // SAFETY: `first` was just created and is destroyed once.
                let _ = unsafe { result::event::destroy(first) };
            })?;
            let events = [first, second];
            // SAFETY: the block holds lanes * 2 * CHUNK bytes; slot k of lane l starts at
            // (2l + k) * CHUNK, so both slots lie inside it.
            let slots = unsafe { [base.add(2 * lane * CHUNK), base.add((2 * lane + 1) * CHUNK)] };
            let lane = Lane { slots, events, _block: block.clone() };
            let (jobs, inbox) = channel();
            let context = context.clone();
            let thread = std::thread::Builder::new()
                .name("lazybuf-cuda-staging".into())
                .spawn(move || run_lane(&context, lane, inbox));
            match thread {
                Ok(thread) => staging.workers.push(Worker { jobs: Some(jobs), thread: Some(thread) }),
                Err(err) => {
                    return Err(Error::invalid(
                        "CUDA staging",
                        format!("could not start a lane thread: {err}"),
                    ));
                }
            }
        }
        Ok(staging)
    }

    /// Enqueues a copy of `src` to device address `dst` on `stream` through the slots.
    pub(super) fn upload(&self, stream: sys::CUstream, src: HostSpan, dst: sys::CUdeviceptr) -> Ticket {
        let region = self.region(src.len());
        self.submit(stream, src.len().div_ceil(region), |i| {
            let start = i * region;
            let n = region.min(src.len() - start);
            // SAFETY: [start, start + n) lies inside src.
            let part = unsafe { span_at(src, start, n) };
            Part::Upload { src: part, dst: dst + start as u64 }
        })
    }

    /// Enqueues a copy of device address `src` into `dst` on `stream` through the slots.
    pub(super) fn download(&self, stream: sys::CUstream, src: sys::CUdeviceptr, dst: HostSpan) -> Ticket {
        let region = self.region(dst.len());
        self.submit(stream, dst.len().div_ceil(region), |i| {
            let start = i * region;
            let n = region.min(dst.len() - start);
            // SAFETY: [start, start + n) lies inside dst.
            let part = unsafe { span_at(dst, start, n) };
            Part::Download { src: src + start as u64, dst: part }
        })
    }

    fn submit(&self, stream: sys::CUstream, parts: usize, part: impl Fn(usize) -> Part) -> Ticket {
        let signal = Signal::new();
        let done = Arc::new(Countdown {
            remaining: AtomicUsize::new(parts),
            first_error: Mutex::new(None),
            signal: signal.clone(),
        });
        for (i, worker) in self.workers.iter().take(parts).enumerate() {
            let job = Job { part: part(i), stream: RawStreamHandle(stream), done: done.clone() };
            let sent = worker.jobs.as_ref().map(|jobs| jobs.send(job));
            if !matches!(sent, Some(Ok(()))) {
                done.finish_part(Err(Error::invalid("CUDA staging", "a lane thread is gone")));
            }
        }
        Ticket::new(signal)
    }

    /// Bytes per lane: whole pieces, at least two per lane so each lane overlaps.
    fn region(&self, len: usize) -> usize {
        let pieces = len.div_ceil(CHUNK).max(1);
        let lanes = (pieces / 2).clamp(1, self.workers.len());
        pieces.div_ceil(lanes) * CHUNK
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // Closing the channels ends each lane after the jobs already queued; joining waits for
        // them, so no DMA uses a slot when the block goes. A lane that panicked is ignored:
        // drop must not panic.
        for worker in &mut self.workers {
            drop(worker.jobs.take());
        }
        for worker in &mut self.workers {
            if let Some(thread) = worker.thread.take() {
                if crate::backend::fork::in_forked_child() {
                    // The lane's thread was the parent's: it does not exist in a forked child.
                    std::mem::forget(thread);
                } else {
                    let _ = thread.join();
                }
            }
        }
    }
}

/// `n` bytes of `span` from `start`.
///
/// # Safety
/// `start + n <= span.len()`.
unsafe fn span_at(span: HostSpan, start: usize, n: usize) -> HostSpan {
    // SAFETY: the range lies inside span (the caller's promise), so the span's own validity
    // promise covers it.
    unsafe { HostSpan::from_raw(span.ptr().add(start), n, span.pinning()) }
}

fn new_event() -> Result<sys::CUevent> {
    result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
        .map_err(|err| cuda_error("cuEventCreate", err))
}

/// A lane's thread: runs jobs until the staging is dropped, then destroys its events.
fn run_lane(context: &Context, lane: Lane, inbox: Receiver<Job>) {
    for job in inbox {
        let outcome = match context.bind() {
            Ok(_bound) => match job.part {
                Part::Upload { src, dst } => upload_lane(&lane, job.stream.0, src, dst),
                Part::Download { src, dst } => download_lane(&lane, job.stream.0, src, dst),
            },
            Err(err) => Err(err),
        };
        job.done.finish_part(outcome);
    }
    let _bound = context.bind();
    for event in lane.events {
        // SAFETY: each event belongs to this lane alone, and no DMA waits on it any more (every
        // job waited for its events); destroyed once. Statuses ignored: this is teardown.
        let _ = unsafe { result::event::destroy(event) };
    }
}

fn wait(event: sys::CUevent) -> Result<()> {
    // SAFETY: the event belongs to a live lane.
    unsafe { result::event::synchronize(event) }.map_err(|err| cuda_error("cuEventSynchronize", err))
}

/// Waits for the slots' DMAs that are still in flight, keeping the first error.
fn drain(lane: &Lane, in_flight: [bool; 2], outcome: Result<()>) -> Result<()> {
    let mut outcome = outcome;
    for (event, busy) in lane.events.iter().zip(in_flight) {
        if busy {
            let waited = wait(*event);
            if outcome.is_ok() {
                outcome = waited;
            }
        }
    }
    outcome
}

fn upload_lane(lane: &Lane, stream: sys::CUstream, src: HostSpan, dst: sys::CUdeviceptr) -> Result<()> {
    let mut in_flight = [false; 2];
    let mut run = || -> Result<()> {
        // SAFETY: src is valid for reads and unwritten until the transfer's ticket completes,
        // which happens after this lane has finished (the upload contract).
        let src = unsafe { src.bytes() };
        for (i, piece) in src.chunks(CHUNK).enumerate() {
            let slot = i % 2;
            if in_flight[slot] {
                in_flight[slot] = false;
                wait(lane.events[slot])?;
            }
            // SAFETY: the slot holds CHUNK >= piece.len() bytes of pinned memory owned by this
            // lane, and the DMA that last read it is complete (its event was waited on above).
            unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), lane.slots[slot], piece.len()) };
            let at = dst + (i * CHUNK) as u64;
            // The copy and its event in one step on the stream (`enqueue_lock`).
            let _order = enqueue_lock(stream);
            // SAFETY: `at` lies in the destination allocation (the caller checked the length);
            // the slot stays untouched until its event, recorded next, has completed.
            unsafe { sys::cuMemcpyHtoDAsync_v2(at, lane.slots[slot].cast(), piece.len(), stream) }
                .result()
                .map_err(|err| cuda_error("cuMemcpyHtoDAsync", err))?;
            // SAFETY: live event and stream.
            unsafe { result::event::record(lane.events[slot], stream) }
                .map_err(|err| cuda_error("cuEventRecord", err))?;
            in_flight[slot] = true;
        }
        Ok(())
    };
    let outcome = run();
    drain(lane, in_flight, outcome)
}

fn download_lane(lane: &Lane, stream: sys::CUstream, src: sys::CUdeviceptr, dst: HostSpan) -> Result<()> {
    let len = dst.len();
    let pieces = len.div_ceil(CHUNK);
    let mut in_flight = [false; 2];
    let mut run = || -> Result<()> {
        let enqueue = |piece: usize, in_flight: &mut [bool; 2]| -> Result<()> {
            let slot = piece % 2;
            let n = CHUNK.min(len - piece * CHUNK);
            // The copy and its event in one step on the stream (`enqueue_lock`).
            let _order = enqueue_lock(stream);
            // SAFETY: the source range lies in the allocation (the caller checked the
            // length); the slot has CHUNK >= n bytes and its previous contents were drained.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(lane.slots[slot].cast(), src + (piece * CHUNK) as u64, n, stream)
            }
            .result()
            .map_err(|err| cuda_error("cuMemcpyDtoHAsync", err))?;
            // SAFETY: live event and stream.
            unsafe { result::event::record(lane.events[slot], stream) }
                .map_err(|err| cuda_error("cuEventRecord", err))?;
            in_flight[slot] = true;
            Ok(())
        };
        for piece in 0..pieces.min(2) {
            enqueue(piece, &mut in_flight)?;
        }
        // SAFETY: dst is valid for writes and untouched by others until the transfer's
        // ticket completes, which happens after this lane has finished (the download contract).
        let dst = unsafe { dst.bytes_mut() };
        for (i, out) in dst.chunks_mut(CHUNK).enumerate() {
            let slot = i % 2;
            in_flight[slot] = false;
            wait(lane.events[slot])?;
            // SAFETY: the DMA into the slot is complete (event waited on); the slot holds at
            // least out.len() bytes written by it.
            unsafe { std::ptr::copy_nonoverlapping(lane.slots[slot], out.as_mut_ptr(), out.len()) };
            if i + 2 < pieces {
                enqueue(i + 2, &mut in_flight)?;
            }
        }
        Ok(())
    };
    let outcome = run();
    drain(lane, in_flight, outcome)
}
