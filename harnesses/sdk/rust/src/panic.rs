//! What `berm::harness!`'s panic handler does: record "{harness} panicked: {message}" with `berm.fail`, then trap
//! with `ebreak`, so the caller sees the trap and the message.

use crate::calls::{host_call, FAIL};
use core::fmt::{self, Write};

/// The most bytes of a panic's text recorded, "…" included when it is cut.
const KEEP: usize = 256;
const CUT: &str = "…";

/// Text formatted into a buffer on the stack: the handler must not allocate, or a panic because the heap is full
/// ("memory allocation of … bytes failed") would panic again from inside the handler, and again, until the guest's
/// stack ran out. A text longer than the buffer keeps its start, cut at a whole character and ended with "…", and
/// nothing written after (found by a review: the pieces after a cut filled the bytes a cut character left, so the
/// text recorded joined parts of the message that were not next to each other).
struct StackText {
    bytes: [u8; KEEP],
    len: usize,
    cut: bool,
}

impl Write for StackText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.cut {
            return Err(fmt::Error);
        }
        if s.len() <= KEEP - self.len {
            self.bytes[self.len..self.len + s.len()].copy_from_slice(s.as_bytes());
            self.len += s.len();
            return Ok(());
        }
        let mut take = (KEEP - CUT.len()).saturating_sub(self.len).min(s.len());
        while !s.is_char_boundary(take) {
            take -= 1;
        }
        self.bytes[self.len..self.len + take].copy_from_slice(&s.as_bytes()[..take]);
        self.len += take;
        // the text before this piece may reach past the room left for "…": back to a whole character
        while self.len > KEEP - CUT.len() || (self.len > 0 && self.bytes[self.len] & 0xC0 == 0x80) {
            self.len -= 1;
        }
        self.bytes[self.len..self.len + CUT.len()].copy_from_slice(CUT.as_bytes());
        self.len += CUT.len();
        self.cut = true;
        Err(fmt::Error)
    }
}

pub fn report(harness: &str, info: &core::panic::PanicInfo) -> ! {
    let mut text = StackText { bytes: [0; KEEP], len: 0, cut: false };
    let _ = write!(text, "{harness} panicked: {}", info.message());
    // SAFETY: the host reads the message's bytes; ebreak traps and the host ends the invocation there.
    unsafe {
        host_call(FAIL, text.bytes.as_ptr() as u64, text.len as u64);
        core::arch::asm!("ebreak", options(noreturn))
    }
}
