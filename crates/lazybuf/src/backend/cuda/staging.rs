//! Pageable transfers pipelined through reusable pinned staging chunks.
//!
//! A DMA engine reads and writes only page-locked memory, so a copy from pageable memory
//! always passes through a pinned buffer; the driver's own path does so one piece at a time
//! on one thread. Here the transfer is cut into [`CHUNK`]-byte pieces spread over up to
//! [`MAX_LANES`] lanes, one thread each. A lane owns two pinned slots with one event each:
//! while the DMA of one slot runs, the lane's CPU copy fills (upload) or drains (download) the
//! other, and before reusing a slot it waits on the slot's event, recorded after that slot's
//! last DMA on the device's stream. Several lanes keep the CPU side of the copy from being
//! the bottleneck on fast links (one core's memcpy is slower than a PCIe 5 x16 link).
//!
//! The sizes are starting points, to be tuned on a GPU with benches/cuda_bandwidth.rs: 4 MiB
//! pieces are large enough that a DMA's fixed cost is small against its transfer time, and
//! [`PIPELINE_MIN`] is two pieces, the least that can overlap anything; smaller transfers
//! take the driver's pageable path directly.
//!
//! What does not live here: deciding whether memory is pinned (`device.rs` asks the driver)
//! and direct copies of pinned memory.

use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::memory::PinnedBlock;
use super::{Context, cuda_error};
use crate::error::Result;
use crate::host_memory::HostMemory;

/// Bytes per staged piece (and per slot).
pub const CHUNK: usize = 4 << 20;
/// Pageable transfers of at least this many bytes are staged; smaller ones use the driver.
pub const PIPELINE_MIN: usize = 2 * CHUNK;
/// The most lanes (threads) one transfer uses.
pub const MAX_LANES: usize = 4;

/// A device stream handle that worker threads may use.
#[derive(Clone, Copy)]
pub(super) struct Stream(pub(super) sys::CUstream);

// SAFETY: CUDA streams may be used from any thread; enqueueing is thread-safe.
unsafe impl Send for Stream {}
// SAFETY: see Send.
unsafe impl Sync for Stream {}

/// One lane's two pinned slots and their events.
struct Lane {
    slots: [*mut u8; 2],
    events: [sys::CUevent; 2],
}

// SAFETY: the slots point into the staging block, disjoint per lane, and a lane is only used
// through `&mut` by one thread at a time; events are driver handles usable from any thread.
unsafe impl Send for Lane {}

/// Pinned staging memory and events for one device, reused by every staged transfer.
pub(super) struct Staging {
    context: Arc<Context>,
    lanes: Vec<Lane>,
    /// Owns the slots' memory; declared after `lanes` so it outlives their use.
    _block: HostMemory,
}

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging").field("lanes", &self.lanes.len()).field("chunk", &CHUNK).finish()
    }
}

impl Staging {
    /// Allocates staging for up to [`MAX_LANES`] lanes (as many as there are CPUs).
    /// `context` must be current.
    pub(super) fn new(context: &Arc<Context>, device_name: &str) -> Result<Staging> {
        let lanes = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, MAX_LANES);
        let mut block =
            PinnedBlock::allocate(context, lanes * 2 * CHUNK, sys::CU_MEMHOSTALLOC_PORTABLE, device_name)?;
        let base = block.as_mut_ptr();
        let mut staging =
            Staging { context: context.clone(), lanes: Vec::with_capacity(lanes), _block: block };
        for lane in 0..lanes {
            let first = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(|err| cuda_error("cuEventCreate", err))?;
            let second = match result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING) {
                Ok(event) => event,
                Err(err) => {
                    // SAFETY: `first` was just created and is destroyed once.
                    let _ = unsafe { result::event::destroy(first) };
                    return Err(cuda_error("cuEventCreate", err));
                }
            };
            // SAFETY: the block holds lanes * 2 * CHUNK bytes; slot k of lane l starts at
            // (2l + k) * CHUNK, so both slots lie inside it.
            let slots = unsafe { [base.add(2 * lane * CHUNK), base.add((2 * lane + 1) * CHUNK)] };
            staging.lanes.push(Lane { slots, events: [first, second] });
        }
        Ok(staging)
    }

    /// Copies `src` to device address `dst` through the slots, then waits for the stream.
    pub(super) fn upload(&mut self, stream: Stream, src: &[u8], dst: sys::CUdeviceptr) -> Result<()> {
        let region = self.region(src.len());
        let context = &*self.context;
        let results = std::thread::scope(|scope| {
            let mut parts = src.chunks(region).zip(&mut self.lanes).enumerate();
            let (_, (first, first_lane)) = parts.next().expect("a staged transfer is not empty");
            let workers: Vec<_> = parts
                .map(|(i, (part, lane))| {
                    let at = dst + (i * region) as u64;
                    scope.spawn(move || upload_lane(context, lane, stream, part, at))
                })
                .collect();
            let mut results = vec![upload_lane(context, first_lane, stream, first, dst)];
            results.extend(workers.into_iter().map(join));
            results
        });
        finish(stream, results)
    }

    /// Copies device address `src` into `dst` through the slots, then waits for the stream.
    pub(super) fn download(&mut self, stream: Stream, src: sys::CUdeviceptr, dst: &mut [u8]) -> Result<()> {
        let region = self.region(dst.len());
        let context = &*self.context;
        let results = std::thread::scope(|scope| {
            let mut parts = dst.chunks_mut(region).zip(&mut self.lanes).enumerate();
            let (_, (first, first_lane)) = parts.next().expect("a staged transfer is not empty");
            let workers: Vec<_> = parts
                .map(|(i, (part, lane))| {
                    let at = src + (i * region) as u64;
                    scope.spawn(move || download_lane(context, lane, stream, at, part))
                })
                .collect();
            let mut results = vec![download_lane(context, first_lane, stream, src, first)];
            results.extend(workers.into_iter().map(join));
            results
        });
        finish(stream, results)
    }

    /// Bytes per lane: whole pieces, at least two per lane so each lane overlaps.
    fn region(&self, len: usize) -> usize {
        let pieces = len.div_ceil(CHUNK);
        let lanes = (pieces / 2).clamp(1, self.lanes.len());
        pieces.div_ceil(lanes) * CHUNK
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // SAFETY: every transfer waited for its stream, so no DMA uses the slots or events;
        // each event is destroyed once. Statuses are ignored: drop must not panic.
        unsafe {
            let _bound = self.context.bind();
            for event in self.lanes.iter().flat_map(|lane| lane.events) {
                let _ = result::event::destroy(event);
            }
        }
    }
}

fn join(worker: std::thread::ScopedJoinHandle<'_, Result<()>>) -> Result<()> {
    worker
        .join()
        .unwrap_or_else(|_| Err(crate::Error::invalid("staged CUDA transfer", "a staging thread panicked")))
}

/// Waits for the stream whatever happened (no DMA may still use a slot when the staging is
/// handed to the next transfer), then reports the first error.
fn finish(stream: Stream, results: Vec<Result<()>>) -> Result<()> {
    // SAFETY: the stream is the device's live stream.
    let synced = unsafe { result::stream::synchronize(stream.0) }
        .map_err(|err| cuda_error("cuStreamSynchronize", err));
    results.into_iter().collect::<Result<()>>()?;
    synced
}

fn wait(event: sys::CUevent) -> Result<()> {
    // SAFETY: the event belongs to a live lane.
    unsafe { result::event::synchronize(event) }.map_err(|err| cuda_error("cuEventSynchronize", err))
}

fn upload_lane(
    context: &Context,
    lane: &mut Lane,
    stream: Stream,
    src: &[u8],
    dst: sys::CUdeviceptr,
) -> Result<()> {
    let _bound = context.bind()?;
    let mut in_flight = [false; 2];
    for (i, piece) in src.chunks(CHUNK).enumerate() {
        let slot = i % 2;
        if in_flight[slot] {
            wait(lane.events[slot])?;
        }
        // SAFETY: the slot holds CHUNK >= piece.len() bytes of pinned memory owned by this
        // lane, and the DMA that last read it is complete (its event was waited on above).
        unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), lane.slots[slot], piece.len()) };
        let at = dst + (i * CHUNK) as u64;
        // SAFETY: `at` lies in the destination allocation (the caller checked the length);
        // the slot stays untouched until its event, recorded next, has completed.
        unsafe { sys::cuMemcpyHtoDAsync_v2(at, lane.slots[slot].cast(), piece.len(), stream.0) }
            .result()
            .map_err(|err| cuda_error("cuMemcpyHtoDAsync", err))?;
        // SAFETY: live event and stream.
        unsafe { result::event::record(lane.events[slot], stream.0) }
            .map_err(|err| cuda_error("cuEventRecord", err))?;
        in_flight[slot] = true;
    }
    Ok(())
}

fn download_lane(
    context: &Context,
    lane: &mut Lane,
    stream: Stream,
    src: sys::CUdeviceptr,
    dst: &mut [u8],
) -> Result<()> {
    let _bound = context.bind()?;
    let len = dst.len();
    let pieces = len.div_ceil(CHUNK);
    let enqueue = |lane: &Lane, piece: usize| -> Result<()> {
        let slot = piece % 2;
        let n = CHUNK.min(len - piece * CHUNK);
        // SAFETY: the source range lies in the allocation (the caller checked the length);
        // the slot has CHUNK >= n bytes and its previous contents were already drained.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(lane.slots[slot].cast(), src + (piece * CHUNK) as u64, n, stream.0)
        }
        .result()
        .map_err(|err| cuda_error("cuMemcpyDtoHAsync", err))?;
        // SAFETY: live event and stream.
        unsafe { result::event::record(lane.events[slot], stream.0) }
            .map_err(|err| cuda_error("cuEventRecord", err))
    };
    for piece in 0..pieces.min(2) {
        enqueue(lane, piece)?;
    }
    for (i, out) in dst.chunks_mut(CHUNK).enumerate() {
        let slot = i % 2;
        wait(lane.events[slot])?;
        // SAFETY: the DMA into the slot is complete (event waited on); the slot holds at
        // least out.len() bytes written by it.
        unsafe { std::ptr::copy_nonoverlapping(lane.slots[slot], out.as_mut_ptr(), out.len()) };
        if i + 2 < pieces {
            enqueue(lane, i + 2)?;
        }
    }
    Ok(())
}
