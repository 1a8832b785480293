//! Completion made explicit: asynchronous syncs, streams and tickets, on every device.
//!
//! - While a transfer is in flight the buffer reports the state it will have when the transfer
//!   completes; a transfer that fails puts the buffer back as it was before it, and its error
//!   is reported by its handle and by the first call that waits for it (docs/CONTRACT.md,
//!   "Completion"). Shown on every device with `FaultyDevice` holding completions until released.
//! - The double-buffering pattern overlaps for real: on PoCL the transfer of one buffer is
//!   still in flight, held back by an OpenCL user event, while the host fills the other
//!   (`cuda_async.rs` shows the same through the CUDA driver test double).
//! - The caller's work on its own queue is ordered before lazybuf's through tickets.
//! - Several threads move several buffers on several streams at once.
//!
//! The CUDA double's streams run on worker threads, so under `scripts/test-cuda-double.sh`
//! every test here also runs against truly asynchronous (fake) CUDA devices.

use crate::common;

use common::pattern;
use lazybuf::testing::FaultyDevice;
use lazybuf::{BufferOptions, BufferState, Device, DirectResource, Error, UnifiedBuffer};

#[test]
fn a_transfer_in_flight_reports_the_final_state_and_completes_in_any_order() {
    for base in common::devices() {
        let (device, plan) = FaultyDevice::wrap(&base);
        plan.hold_completions(true);
        let mut a = common::direct(&device, 1000);
        let mut b = common::direct(&device, 1000);
        a.copy_from(&pattern(1, 1000)).unwrap();
        b.copy_from(&pattern(2, 1000)).unwrap();
        let ta = a.sync_to_device_async().unwrap();
        let tb = b.sync_to_device_async().unwrap();
        assert_eq!((a.state(), b.state()), (BufferState::Synchronized, BufferState::Synchronized));
        assert!(a.is_busy() && b.is_busy(), "{device}");
        assert!(!ta.is_complete().unwrap());
        // Complete them in the other order.
        let held = plan.held();
        assert_eq!(held.len(), 2, "one held copy per transfer on {device}");
        plan.release(held[1]);
        assert!(tb.is_complete().unwrap() && !ta.is_complete().unwrap());
        b.poll().unwrap();
        assert!(!b.is_busy() && a.is_busy());
        plan.release(held[0]);
        ta.wait().unwrap();
        a.finish().unwrap();
        assert!(!a.is_busy());
        // Blocking calls still work while completions are held: waiting releases them.
        a.mark_device_dirty().unwrap();
        assert_eq!(a.to_vec().unwrap(), pattern(1, 1000), "{device}");
        assert_eq!(b.to_vec().unwrap(), pattern(2, 1000));
    }
}

/// A transfer that fails while nobody waits for it, and whose buffer is dropped before any call
/// settles it: the failure cannot be returned (a drop returns nothing), so it is recorded on
/// the buffer's device and taken once with `Device::take_deferred_errors`, never lost.
#[test]
fn a_failure_nobody_waited_for_is_recorded_on_the_device_when_the_buffer_goes() {
    for base in common::devices() {
        let (device, plan) = FaultyDevice::wrap(&base);
        plan.defer_copy_faults(true);
        let mut buf = common::direct(&device, 1000);
        buf.copy_from(&pattern(3, 1000)).unwrap();
        assert_eq!(device.take_deferred_errors().0.len(), 0, "nothing failed yet, on {device}");
        plan.fail_copy_in(1);
        drop(buf.sync_to_device_async().unwrap()); // the handle is dropped unobserved
        drop(buf);
        let (errors, dropped) = device.take_deferred_errors();
        assert_eq!(dropped, 0);
        assert!(
            errors.iter().any(|err| matches!(err, Error::InjectedFault { .. })),
            "the transfer's failure is recorded on {device}: {errors:?}"
        );
        assert!(device.take_deferred_errors().0.is_empty(), "taken once, on {device}");
    }
}

#[test]
fn a_transfer_that_fails_puts_the_buffer_back_and_reports_its_error_once_settled() {
    for base in common::devices() {
        let (device, plan) = FaultyDevice::wrap(&base);
        plan.hold_completions(true);
        plan.defer_copy_faults(true);
        let mut buf = common::direct(&device, 1000);
        buf.copy_from(&pattern(3, 1000)).unwrap();
        let stats = buf.transfer_stats();
        plan.fail_copy_in(1);
        let transfer = buf.sync_to_device_async().unwrap();
        // In flight: the state it will have.
        assert_eq!(buf.state(), BufferState::Synchronized, "{device}");
        // Done, failed: the buffer reports the state it had before, and the handle the error.
        plan.release_all();
        assert!(matches!(transfer.wait(), Err(Error::InjectedFault { .. })));
        assert_eq!(buf.state(), BufferState::HostOnly, "{device}");
        assert_eq!(buf.transfer_stats(), stats, "a failed transfer moved nothing");
        assert!(buf.is_busy(), "not settled yet");
        // The first call that waits for it reports it too, and does nothing else.
        let err = buf.sync_to_device().unwrap_err();
        assert!(matches!(err, Error::InjectedFault { .. }), "{err}");
        assert!(!buf.is_busy());
        assert_eq!(buf.state(), BufferState::HostOnly);
        // Nothing was lost; the next try succeeds.
        buf.sync_to_device().unwrap();
        buf.mark_device_dirty().unwrap();
        assert_eq!(buf.to_vec().unwrap(), pattern(3, 1000));
    }
}

#[test]
fn an_access_waits_only_for_the_transfers_it_depends_on() {
    for base in common::devices() {
        let (device, plan) = FaultyDevice::wrap(&base);
        plan.hold_completions(true);
        let mut buf = common::direct(&device, 64);
        buf.copy_from(&pattern(4, 64)).unwrap();
        let upload = buf.sync_to_device_async().unwrap();
        // Reading the host copy the upload reads from does not wait for it (unless the device
        // copy is the host memory itself, which the upload then writes)...
        assert_eq!(buf.host().unwrap(), &pattern(4, 64)[..]);
        let aliased = device.is_zero_copy(64 * 4);
        assert_eq!(upload.is_complete().unwrap(), aliased, "{device}: a host read and an upload");
        // ...writing it does (the upload may still be reading those bytes).
        buf.host_mut().unwrap()[0] = 99;
        assert!(upload.is_complete().unwrap());
        assert!(!buf.is_busy());
        assert_eq!(buf.state(), BufferState::HostDirty);
    }
}

#[test]
fn a_buffer_can_run_on_a_stream_of_its_own() {
    for device in common::devices() {
        let stream = device.create_stream().unwrap();
        let options = BufferOptions {
            device: Some(device.clone()),
            stream: Some(stream.clone()),
            ..Default::default()
        };
        let mut buf = UnifiedBuffer::<u32>::with_options(&[500], options).unwrap();
        assert_eq!(buf.stream(), &stream);
        buf.copy_from(&pattern(5, 500)).unwrap();
        buf.sync_to_device_async().unwrap().wait().unwrap();
        assert_eq!(buf.device().unwrap().stream(), &stream);
        buf.mark_device_dirty().unwrap();
        buf.sync_to_host_async().unwrap().wait().unwrap();
        assert_eq!(buf.host().unwrap(), &pattern(5, 500)[..]);
        stream.synchronize().unwrap();

        // A stream of another device, or one chosen after the device copy exists, is refused.
        let other = Device::host().create_stream().unwrap();
        let mut raw = common::direct(&device, 4).into_raw();
        if device != Device::host() {
            let err = raw.set_stream(other).unwrap_err();
            assert!(err.to_string().contains("expected a stream of the buffer's device"), "{err}");
        }
        raw.sync(Some(&device)).unwrap();
        let err = raw.set_stream(device.stream()).unwrap_err();
        assert!(err.to_string().contains("before its first device use"), "{err}");
    }
}

#[test]
fn several_threads_move_several_buffers_on_several_streams() {
    for device in common::devices() {
        std::thread::scope(|scope| {
            for t in 0..4u32 {
                let device = device.clone();
                scope.spawn(move || {
                    let stream = device.create_stream().unwrap();
                    let mut buffers: Vec<UnifiedBuffer<u32>> = (0..3)
                        .map(|i| {
                            let options = BufferOptions {
                                device: Some(device.clone()),
                                stream: Some(stream.clone()),
                                ..Default::default()
                            };
                            let mut buf = UnifiedBuffer::with_options(&[257 * (i + 1)], options).unwrap();
                            buf.copy_from(&pattern(t * 10 + i as u32, buf.len())).unwrap();
                            buf
                        })
                        .collect();
                    for round in 0..20u32 {
                        let transfers: Vec<_> =
                            buffers.iter_mut().map(|b| b.sync_to_device_async().unwrap()).collect();
                        for transfer in transfers {
                            transfer.wait().unwrap();
                        }
                        for (i, buf) in buffers.iter_mut().enumerate() {
                            let seed = t * 1000 + round * 10 + i as u32;
                            let data = pattern(seed, buf.len());
                            buf.device_mut().unwrap().write_from(&data).unwrap();
                            let back = buf.sync_to_host_async().unwrap();
                            back.wait().unwrap();
                            assert_eq!(buf.host().unwrap(), &data[..], "{device}");
                            buf.host_mut().unwrap()[0] = seed;
                        }
                    }
                });
            }
        });
    }
}

/// The double-buffering pattern of the seeds' memory guide, on PoCL: the transfer of one
/// buffer is still in flight (held back by an OpenCL user event its queue waits for) while the
/// host fills the other, and both arrive intact.
#[cfg(feature = "opencl")]
#[test]
fn double_buffering_overlaps_the_transfer_of_one_buffer_with_the_fill_of_the_other_on_pocl() {
    use lazybuf::backend::RawDevice;
    for device in common::devices_of(lazybuf::BackendKind::OPENCL) {
        // SAFETY: (test) the context is used while `device` lives.
        let RawDevice::OpenCl { context, .. } = (unsafe { device.raw() }) else { panic!("an OpenCL device") };
        let gate = cl3::event::create_user_event(context).unwrap();
        // SAFETY: the event is a live user event of this device's context; the ticket takes
        // over this reference.
        let gate_ticket = unsafe { lazybuf::backend::opencl::ticket_from_event(gate, context) }.unwrap();
        let n = 256 * 1024; // 1 MiB: copied, not aliased, on PoCL
        let (mut a, mut b) = (common::direct(&device, n), common::direct(&device, n));
        a.copy_from(&pattern(7, n)).unwrap();
        a.stream().wait_for(&gate_ticket).unwrap();
        let transfer = a.sync_to_device_async().unwrap();
        // The host fills the other buffer while the transfer waits on the device's queue.
        b.host_overwrite().unwrap().copy_from_slice(&pattern(8, n));
        assert!(!transfer.is_complete().unwrap(), "the transfer of `a` finished before the fill of `b`");
        cl3::event::set_user_event_status(gate, cl3::event::CL_COMPLETE).unwrap();
        transfer.wait().unwrap();
        a.mark_device_dirty().unwrap();
        assert_eq!(a.to_vec().unwrap(), pattern(7, n));
        b.sync_to_device().unwrap();
        b.mark_device_dirty().unwrap();
        assert_eq!(b.to_vec().unwrap(), pattern(8, n));
    }
}

/// Work the caller enqueues on its own queue is ordered before lazybuf's through a ticket:
/// a fill on the caller's queue, held back by a user event, is what lazybuf's download reads.
#[cfg(feature = "opencl")]
/// How a test tells lazybuf that the caller's queue uses a device copy.
#[derive(Clone, Copy, Debug)]
enum Tell {
    /// `DeviceViewMut::used_until` on the typed buffer's view.
    View,
    /// `RawBuffer::used_until` after a device access (what the Python binding does).
    Raw,
}

/// The caller enqueues a fill of the buffer's device copy on a queue of its own, held back by
/// a user event that another thread completes later; lazybuf is told through a marker of
/// that queue. Returns what a download then reads.
fn callers_fill_then_download(device: &Device, tell: Tell) -> Vec<u32> {
    use lazybuf::RawBuffer;
    use lazybuf::backend::{RawDevice, RawMemory, RawStream};
    use lazybuf::coherence::Access;

    // SAFETY: (test) the context is used while `device` lives.
    let RawDevice::OpenCl { context, .. } = (unsafe { device.raw() }) else { panic!("an OpenCL device") };
    let callers = device.create_stream().unwrap();
    // SAFETY: (test) the queue is used while `callers` lives.
    let RawStream::OpenCl(queue) = (unsafe { callers.raw() }) else { panic!("an OpenCL queue") };
    // SAFETY: `queue` is a live queue of this device's context (made just above).
    let wrapped = unsafe { device.wrap_stream(RawStream::OpenCl(queue)) }.unwrap();
    let gate = cl3::event::create_user_event(context).unwrap();
    let value = 0x0bad_f00du32;
    // The caller's "kernel": a fill of `mem` on the caller's queue, after the user event.
    let callers_fill = |mem: RawMemory| {
        let RawMemory::OpenCl(mem) = mem else { panic!("a cl_mem") };
        // SAFETY: `mem` is the buffer's live device copy (the buffer keeps it alive) of 4096
        // bytes; the pattern is read at the call.
        let event = unsafe {
            cl3::command_queue::enqueue_fill_buffer(
                queue,
                mem,
                (&value as *const u32).cast(),
                4,
                0,
                4096,
                1,
                &gate,
            )
        }
        .unwrap();
        // SAFETY: releases the fill's event, which nothing waits on.
        unsafe { cl3::event::release_event(event) }.unwrap();
        cl3::command_queue::flush(queue).unwrap();
    };
    let release_gate_later = || {
        let gate_address = gate as usize;
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            cl3::event::set_user_event_status(gate_address as cl3::types::cl_event, cl3::event::CL_COMPLETE)
                .unwrap();
        })
    };
    let initial: Vec<u8> = pattern(9, 1024).iter().flat_map(|v: &u32| v.to_ne_bytes()).collect();
    let (bytes, release) = match tell {
        Tell::View => {
            let mut buf = common::direct(device, 1024);
            buf.copy_from(&pattern(9, 1024)).unwrap();
            {
                let mut view = buf.device_mut().unwrap();
                // SAFETY: (test) the caller's fill uses the memory while the view lives, and
                // declares its use with used_until.
                callers_fill(unsafe { view.raw() });
                view.used_until(wrapped.marker().unwrap());
            }
            let release = release_gate_later();
            (buf.to_vec().unwrap().iter().flat_map(|v| v.to_ne_bytes()).collect::<Vec<u8>>(), release)
        }
        Tell::Raw => {
            let mut raw = RawBuffer::with_resource(4096, device.clone(), false, DirectResource::shared());
            raw.host_access(Access::Overwrite).unwrap()[..4096].copy_from_slice(&initial);
            // SAFETY: the handle is used while `raw` keeps the copy alive.
            callers_fill(unsafe { raw.device_access(device, Access::Write).unwrap().raw() });
            raw.used_until(device, wrapped.marker().unwrap());
            let release = release_gate_later();
            (raw.host_access(Access::Read).unwrap()[..4096].to_vec(), release)
        }
    };
    release.join().unwrap();
    bytes.chunks_exact(4).map(|c| u32::from_ne_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn the_callers_own_queue_is_ordered_before_lazybuf_through_a_ticket() {
    for device in common::devices_of(lazybuf::BackendKind::OPENCL) {
        for tell in [Tell::View, Tell::Raw] {
            // The download must come after the caller's fill, which waits on the user event.
            assert_eq!(
                callers_fill_then_download(&device, tell),
                vec![0x0bad_f00d; 1024],
                "{device} {tell:?}"
            );
        }
    }
}

#[test]
fn streams_of_the_wrong_kind_are_refused() {
    use lazybuf::backend::RawStream;
    let host = Device::host();
    // SAFETY: refused before anything is used.
    let err = unsafe { host.wrap_stream(RawStream::Cuda(std::ptr::null_mut())) }.unwrap_err();
    assert!(err.to_string().contains("expected the host's stream"), "{err}");
    for device in common::devices_of(lazybuf::BackendKind::OPENCL) {
        // SAFETY: refused before anything is used.
        let err = unsafe { device.wrap_stream(RawStream::Host) }.unwrap_err();
        assert!(err.to_string().contains("expected an OpenCL queue"), "{err}");
    }
}

/// `RawBuffer::access_is_immediate` (the Python binding's fast path for `.host` and `.device`,
/// taken with the GIL held) says yes exactly when an access is bookkeeping only, and such an
/// access then moves no byte and allocates nothing.
#[test]
fn an_access_is_immediate_only_when_it_moves_and_waits_for_nothing() {
    use lazybuf::RawBuffer;
    use lazybuf::coherence::Access::{Overwrite, Read, Write};

    for base in common::devices() {
        let (device, plan) = FaultyDevice::wrap(&base);
        let mut raw = RawBuffer::with_resource(4096, device.clone(), false, DirectResource::shared());
        for access in [Read, Write, Overwrite] {
            assert!(!raw.access_is_immediate(None, access), "no host copy yet, on {device}");
            assert!(!raw.access_is_immediate(Some(&device), access), "no device copy yet, on {device}");
        }
        raw.host_access(Overwrite).unwrap().fill(7);
        let immediate = |raw: &RawBuffer| [Read, Write, Overwrite].map(|a| raw.access_is_immediate(None, a));
        let on_device =
            |raw: &RawBuffer| [Read, Write, Overwrite].map(|a| raw.access_is_immediate(Some(&device), a));
        assert_eq!(immediate(&raw), [true; 3], "the host is current, on {device}");

        // Each immediate access moves nothing and allocates nothing.
        let before = raw.transfer_stats();
        for access in [Read, Write, Overwrite] {
            raw.host_access(access).unwrap();
        }
        assert_eq!(raw.transfer_stats(), before, "on {device}");

        assert_eq!(on_device(&raw), [false; 3], "no device copy yet, on {device}");
        raw.device_access(&device, Read).unwrap();
        assert_eq!(on_device(&raw), [true; 3], "the device copy is current, on {device}");
        let before = raw.transfer_stats();
        raw.device_access(&device, Read).unwrap();
        assert_eq!(raw.transfer_stats(), before, "on {device}");

        // A device write makes the host stale: the next host access copies.
        raw.device_access(&device, Write).unwrap();
        assert_eq!(immediate(&raw), [false; 3], "the host is stale, on {device}");
        assert_eq!(on_device(&raw), [true; 3], "on {device}");
        raw.host_access(Read).unwrap();
        assert_eq!(immediate(&raw), [true; 3], "after the read synced (and waited), on {device}");
        // The device copy handed out (for reading): where it aliases the host block, every host
        // access, a read too, must first wait for the caller's use of it (a kernel may still
        // write it), so none is immediate there.
        raw.device_access(&device, Read).unwrap();
        let aliased = device.is_zero_copy(4096);
        assert_eq!(immediate(&raw), [!aliased; 3], "aliased: {aliased}, on {device}");
        raw.host_access(Read).unwrap();
        assert_eq!(immediate(&raw), [true; 3], "after the read waited, on {device}");
        raw.device_access(&device, Read).unwrap();
        assert_eq!(immediate(&raw), [!aliased; 3], "aliased: {aliased}, on {device}");
        raw.host_access(Write).unwrap();
        assert_eq!(immediate(&raw), [true; 3], "after the write waited, on {device}");

        // A transfer in flight: nothing is immediate until it is settled.
        plan.hold_completions(true);
        let transfer = raw.sync_async(Some(&device)).unwrap();
        assert!(raw.is_busy(), "the held copy is in flight, on {device}");
        assert_eq!(immediate(&raw), [false; 3], "a transfer in flight, on {device}");
        assert_eq!(on_device(&raw), [false; 3], "a transfer in flight, on {device}");
        plan.hold_completions(false);
        for held in plan.held() {
            plan.release(held);
        }
        transfer.wait().unwrap();
        raw.finish().unwrap();
        assert_eq!(immediate(&raw), [true; 3], "settled, on {device}");
        assert!(raw.host_access(Read).unwrap().iter().all(|&b| b == 7), "on {device}");
    }
}
