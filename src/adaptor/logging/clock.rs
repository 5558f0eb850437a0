//! `Clock`, what records are stamped with: the time-stamp counter where the kernel keeps time
//! with it, else `Instant`.

use std::time::Instant;

/// The clock records are stamped with: the processor's time-stamp counter where the kernel
/// itself keeps time with it (x86-64 Linux, clocksource `tsc`: then the counter is invariant and
/// synchronized across cores, and an ordered read of it is what `clock_gettime` does, without
/// the seqlock and the scaling), else [`Instant`]. Stamps are ticks, compared as they are and
/// turned into time only by the writer.
#[derive(Debug)]
pub(super) struct Clock {
    epoch: Instant,
    /// The counter at `epoch`, when the counter is the clock.
    tsc: Option<u64>,
}

impl Clock {
    pub(super) fn new() -> Self {
        let tsc = tsc::usable().then(tsc::read);
        Clock {
            epoch: Instant::now(),
            tsc,
        }
    }

    /// Ticks since the clock was made. An ordered read: it happens after every earlier
    /// instruction of this thread completed (a lock taken before it included), as
    /// `clock_gettime`'s does, so that a stamp read after taking a lock is later than any read
    /// before that lock was last released.
    #[inline]
    pub(super) fn now(&self) -> u64 {
        match self.tsc {
            // A counter behind its start (it never is where the kernel keeps time with it) reads
            // as the start, rather than as a stamp no sweep would ever reach.
            Some(start) => tsc::read().saturating_sub(start),
            None => u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// Nanoseconds per tick, measured now over the clock's whole life (exact for `Instant`;
    /// for the counter, within ~25 ns over however long the log has run).
    pub(super) fn nanos_per_tick(&self) -> f64 {
        if self.tsc.is_none() {
            return 1.0;
        }
        let (ticks, nanos) = (self.now(), self.epoch.elapsed().as_nanos());
        if ticks == 0 {
            return 1.0;
        }
        nanos as f64 / ticks as f64
    }
}

/// The time-stamp counter, where it keeps time.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod tsc {
    /// True when the kernel keeps time with the counter: it checked at boot that the counter
    /// is invariant and synchronized across cores, and would have switched away otherwise.
    pub(super) fn usable() -> bool {
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .is_ok_and(|s| s.trim() == "tsc")
    }

    /// The counter, read after every earlier instruction completed (`lfence; rdtsc`, the
    /// kernel's `rdtsc_ordered`).
    #[inline]
    pub(super) fn read() -> u64 {
        use std::arch::x86_64::{_mm_lfence, _rdtsc};
        // SAFETY: `lfence` (SSE2) and `rdtsc` are in every x86-64 processor, touch no memory and
        // only read the counter. A process that made `rdtsc` fault (`prctl(PR_SET_TSC,
        // PR_TSC_SIGSEGV)`, as rr and some sandboxes do) gets a SIGSEGV here, not undefined
        // behaviour.
        unsafe {
            _mm_lfence();
            _rdtsc()
        }
    }
}

/// No counter elsewhere: [`Instant`] it is.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod tsc {
    pub(super) fn usable() -> bool {
        false
    }
    pub(super) fn read() -> u64 {
        0
    }
}
