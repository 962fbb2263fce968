//! What `berm::harness!`'s panic handler does: record "{harness} panicked: {message}" with `berm.fail`, then trap
//! with `ebreak`, so the caller sees the trap and the message.

use crate::calls::{host_call, FAIL};
use core::fmt::Write;

/// Text formatted into a buffer on the stack, cut at the last whole character that fits: the handler must not
/// allocate, or a panic because the heap is full ("memory allocation of … bytes failed") would panic again from
/// inside the handler, and again, until the guest's stack ran out.
struct StackText {
    bytes: [u8; 256],
    len: usize,
}

impl Write for StackText {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let mut take = s.len().min(self.bytes.len() - self.len);
        while !s.is_char_boundary(take) {
            take -= 1;
        }
        self.bytes[self.len..self.len + take].copy_from_slice(&s.as_bytes()[..take]);
        self.len += take;
        Ok(())
    }
}

pub fn report(harness: &str, info: &core::panic::PanicInfo) -> ! {
    let mut text = StackText { bytes: [0; 256], len: 0 };
    let _ = write!(text, "{harness} panicked: {}", info.message());
    // SAFETY: the host reads the message's bytes; ebreak traps and the host ends the invocation there.
    unsafe {
        host_call(FAIL, text.bytes.as_ptr() as u64, text.len as u64);
        core::arch::asm!("ebreak", options(noreturn))
    }
}
