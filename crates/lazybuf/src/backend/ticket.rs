//! Completion of enqueued work: [`Ticket`]s.
//!
//! Every backend operation is enqueued on a stream and returns a ticket that completes when
//! the operation has: a CUDA event, an OpenCL event, a worker thread's [`Signal`], or nothing
//! at all on the host, whose work is done before the call returns. A ticket can be polled,
//! waited on, cloned and shared; it keeps its outcome, so a failure is reported to everyone
//! who asks, as often as they ask.
//!
//! What does not live here: which work a buffer must wait for (the buffer engine), and the
//! runtime objects behind completions (each backend folder).

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use crate::error::{Error, Result};

/// Something that completes: the runtime side of a [`Ticket`].
pub trait Completion: Any + Send + Sync + fmt::Debug {
    /// `Ok(true)` once the work is done, `Ok(false)` while it runs, `Err` if it failed.
    fn poll(&self) -> Result<bool>;

    /// Blocks until the work is done; `Err` if it failed.
    fn wait(&self) -> Result<()>;

    /// Whether the work is a runtime command in its stream's order: work enqueued later on
    /// the same stream starts after it (a CUDA event recorded after a copy). Not so for work
    /// done elsewhere, such as a worker thread's [`Signal`] (staged copies), which later work
    /// on the stream must wait for explicitly.
    fn stream_ordered(&self) -> bool {
        false
    }
}

/// The completion of some enqueued work. `Ticket::default()` is complete.
#[derive(Clone, Default)]
#[must_use = "a ticket is the only way to learn whether enqueued work succeeded"]
pub struct Ticket {
    pending: Option<Arc<dyn Completion>>,
}

impl Ticket {
    /// A ticket for work that is already done.
    pub const fn done() -> Ticket {
        Ticket { pending: None }
    }

    /// A ticket that completes with `completion`.
    pub fn new(completion: Arc<dyn Completion>) -> Ticket {
        Ticket { pending: Some(completion) }
    }

    /// A ticket for work that has already finished with `outcome`.
    pub fn finished(outcome: Result<()>) -> Ticket {
        match outcome {
            Ok(()) => Ticket::done(),
            Err(err) => Ticket::new(Arc::new(Failed(err))),
        }
    }

    /// A ticket that completes when all of `tickets` have; it fails if any of them does.
    pub fn all(tickets: impl IntoIterator<Item = Ticket>) -> Ticket {
        let mut pending: Vec<Ticket> = tickets.into_iter().filter(|t| t.pending.is_some()).collect();
        match pending.len() {
            0 => Ticket::done(),
            1 => pending.pop().unwrap_or_default(),
            _ => Ticket::new(Arc::new(All(pending))),
        }
    }

    /// Whether the ticket was complete when it was made (no runtime object behind it).
    pub fn is_trivially_done(&self) -> bool {
        self.pending.is_none()
    }

    /// `Ok(true)` once the work is done, `Ok(false)` while it runs, `Err` if it failed.
    pub fn poll(&self) -> Result<bool> {
        self.pending.as_ref().map_or(Ok(true), |c| c.poll())
    }

    /// Blocks until the work is done; `Err` if it failed.
    pub fn wait(&self) -> Result<()> {
        self.pending.as_ref().map_or(Ok(()), |c| c.wait())
    }

    /// Whether every part of the ticket is in its stream's order ([`Completion::stream_ordered`]):
    /// work enqueued on that stream after it starts after it. A done ticket is.
    pub fn is_stream_ordered(&self) -> bool {
        self.parts().iter().all(|part| part.stream_ordered())
    }

    /// The runtime side, for backends that can order their streams after it.
    pub fn completion(&self) -> Option<&Arc<dyn Completion>> {
        self.pending.as_ref()
    }

    /// The completions behind this ticket: itself, or each part of a joint ticket.
    pub fn parts(&self) -> Vec<Arc<dyn Completion>> {
        match &self.pending {
            None => Vec::new(),
            Some(c) => match (&**c as &dyn Any).downcast_ref::<All>() {
                Some(all) => all.0.iter().flat_map(Ticket::parts).collect(),
                None => vec![c.clone()],
            },
        }
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.pending {
            None => f.write_str("Ticket(done)"),
            Some(c) => write!(f, "Ticket({c:?})"),
        }
    }
}

/// Work that has already failed.
#[derive(Debug)]
struct Failed(Error);

impl Completion for Failed {
    fn poll(&self) -> Result<bool> {
        Err(self.0.clone())
    }

    fn wait(&self) -> Result<()> {
        Err(self.0.clone())
    }
}

/// Several completions at once.
#[derive(Debug)]
struct All(Vec<Ticket>);

impl Completion for All {
    fn poll(&self) -> Result<bool> {
        let mut done = true;
        for ticket in &self.0 {
            done &= ticket.poll()?;
        }
        Ok(done)
    }

    fn wait(&self) -> Result<()> {
        // Wait for every part, even after a failure: the caller may free what they use.
        let mut outcome = Ok(());
        for ticket in &self.0 {
            let waited = ticket.wait();
            if outcome.is_ok() {
                outcome = waited;
            }
        }
        outcome
    }
}

/// A completion that a thread finishes: for work done by lazybuf's own worker threads.
#[derive(Default)]
pub struct Signal {
    outcome: Mutex<Option<Result<()>>>,
    finished: Condvar,
}

impl Signal {
    /// A signal that has not finished.
    pub fn new() -> Arc<Signal> {
        Arc::new(Signal::default())
    }

    /// Records the outcome and wakes every waiter. Only the first call counts.
    pub fn finish(&self, outcome: Result<()>) {
        let mut slot = self.outcome.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(outcome);
        }
        self.finished.notify_all();
    }
}

impl Completion for Signal {
    fn poll(&self) -> Result<bool> {
        match &*self.outcome.lock().unwrap_or_else(PoisonError::into_inner) {
            None => Ok(false),
            Some(outcome) => outcome.clone().map(|()| true),
        }
    }

    fn wait(&self) -> Result<()> {
        let mut slot = self.outcome.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(outcome) = &*slot {
                return outcome.clone();
            }
            slot = self.finished.wait(slot).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl fmt::Debug for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &*self.outcome.lock().unwrap_or_else(PoisonError::into_inner) {
            None => "running",
            Some(Ok(())) => "done",
            Some(Err(_)) => "failed",
        };
        write!(f, "Signal({state})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn done_and_failed_tickets() {
        assert!(Ticket::done().poll().unwrap());
        Ticket::default().wait().unwrap();
        let failed = Ticket::finished(Err(Error::invalid("x", "y")));
        assert!(failed.poll().is_err());
        assert!(failed.wait().is_err());
        assert!(failed.clone().wait().is_err(), "a failure is reported to every clone");
    }

    #[test]
    fn a_signal_completes_when_its_thread_says_so() {
        let signal = Signal::new();
        let ticket = Ticket::new(signal.clone());
        assert!(!ticket.poll().unwrap());
        let worker = std::thread::spawn(move || signal.finish(Ok(())));
        ticket.wait().unwrap();
        assert!(ticket.poll().unwrap());
        worker.join().unwrap();
    }

    #[test]
    fn a_joint_ticket_waits_for_all_and_reports_the_first_failure() {
        let (a, b) = (Signal::new(), Signal::new());
        let joint = Ticket::all([Ticket::new(a.clone()), Ticket::done(), Ticket::new(b.clone())]);
        assert_eq!(joint.parts().len(), 2);
        a.finish(Ok(()));
        assert!(!joint.poll().unwrap());
        b.finish(Err(Error::invalid("copy", "failed")));
        assert!(joint.poll().is_err());
        assert!(joint.wait().is_err());
        assert!(Ticket::all([Ticket::done(), Ticket::done()]).is_trivially_done());
    }
}
