//! The coherence checker's comparison (see [`crate::checking`]): before a host read, a valid
//! host copy must equal every valid device copy handed out for reading on a device that does
//! not alias it; a difference means a kernel wrote the copy without `mark_device_dirty()`.
//!
//! What does not live here: the switch ([`crate::checking`]) and when the check runs
//! ([`RawBuffer::host_access`]).

use super::RawBuffer;
use crate::backend::HostSpan;
use crate::coherence::{Location, Residency};
use crate::error::{Error, Result};

impl RawBuffer {
    /// The checker (see [`crate::checking`]): a valid host copy must equal every valid device
    /// copy handed out for reading on a device that does not alias it.
    pub(super) fn check_coherence(&mut self) -> Result<()> {
        let n = self.nbytes;
        let Some(host) = self.host.as_ref() else { return Ok(()) };
        let mut scratch = Vec::new();
        for copy in &mut self.copies {
            let at = Location::Device(copy.device.id());
            if !copy.handed_out_for_reading()
                || copy.memory.is_host_alias()
                || self.coherence.residency(at) != Residency::Valid
            {
                continue;
            }
            copy.last_use()?.wait()?;
            if scratch.is_empty() {
                // Sized by the user's buffer: a failed allocation is an error, never an abort.
                scratch.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
                    device: "the host (the coherence checker's copy of the device data)".into(),
                    requested: n,
                    code: None,
                })?;
                scratch.resize(n, 0);
            }
            // SAFETY: scratch lives and is untouched until the ticket is waited for, here.
            unsafe { copy.stream.download(&copy.memory, HostSpan::of_mut_slice(&mut scratch))? }.wait()?;
            if let Some(first_difference) =
                scratch.iter().zip(&host.as_slice()[..n]).position(|(d, h)| d != h)
            {
                return Err(Error::Coherence {
                    device: copy.device.to_string(),
                    first_difference,
                    nbytes: n,
                });
            }
        }
        Ok(())
    }
}
