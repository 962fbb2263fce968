//! What every Berm guest in this crate needs from the host side of ABI.md, shared by its images (`mod guest;`):
//! host-call numbers and the `ecall`, the tool's arguments and result, a bump allocator over the guest heap and a
//! panic handler that records its message with `berm.fail` before it traps, and `manifest_and_start!`. Each image
//! names itself in `NAME`.

use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::alloc::{GlobalAlloc, Layout};
use core::fmt::Write;
use core::sync::atomic::{AtomicUsize, Ordering};

// ------------------------------------------------------------------------------------------- host calls

/// FNV-1a 64 over the name's bytes (ABI.md §1): numbers are derived from names, never typed by hand.
const fn fnv1a64(name: &str) -> u64 {
    let bytes = name.as_bytes();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

const LOG: u64 = fnv1a64("berm.log");
const ARGS_LEN: u64 = fnv1a64("berm.args.len");
const ARGS_READ: u64 = fnv1a64("berm.args.read");
const FAIL: u64 = fnv1a64("berm.fail");
const HEAP_START: u64 = fnv1a64("berm.heap.start");
const HEAP_SIZE: u64 = fnv1a64("berm.heap.size");

fn host_call(number: u64, arg0: u64, arg1: u64) -> u64 {
    let result: u64;
    // SAFETY: ecall hands control to the host, which reads a7/a0/a1 and writes only a0 (ABI.md §1).
    unsafe {
        core::arch::asm!("ecall", inlateout("a0") arg0 => result, in("a1") arg1, in("a7") number,
                         options(nostack));
    }
    result
}

pub fn args() -> Vec<u8> {
    let len = host_call(ARGS_LEN, 0, 0) as usize;
    let mut buf = vec![0u8; len];
    host_call(ARGS_READ, buf.as_mut_ptr() as u64, len as u64);
    buf
}

pub fn log(text: &str) {
    host_call(LOG, text.as_ptr() as u64, text.len() as u64);
}

/// What a tool returns in a0/a1 (ABI.md §3).
#[repr(C)]
pub struct Pair {
    pub ptr: u64,
    pub len: u64,
}

pub fn ok(text: String) -> Pair {
    let text = text.leak(); // memory is fresh for every invocation: nothing outlives the call anyway
    Pair { ptr: text.as_ptr() as u64, len: text.len() as u64 }
}

pub fn fail(text: &str) -> Pair {
    host_call(FAIL, text.as_ptr() as u64, text.len() as u64);
    Pair { ptr: 0, len: 0 }
}

// ------------------------------------------------------------------------------------------- the heap

/// A bump allocator over [berm.heap.start, +berm.heap.size), asked for the bounds on first use (ABI.md §5).
struct Bump {
    next: AtomicUsize,
    end: AtomicUsize,
}

unsafe impl GlobalAlloc for Bump {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if self.end.load(Ordering::Relaxed) == 0 {
            let start = host_call(HEAP_START, 0, 0) as usize;
            self.next.store(start, Ordering::Relaxed);
            self.end.store(start + host_call(HEAP_SIZE, 0, 0) as usize, Ordering::Relaxed);
        }
        let start = (self.next.load(Ordering::Relaxed) + layout.align() - 1) & !(layout.align() - 1);
        match start.checked_add(layout.size()) {
            Some(end) if end <= self.end.load(Ordering::Relaxed) => {
                self.next.store(end, Ordering::Relaxed);
                start as *mut u8
            }
            _ => core::ptr::null_mut(),
        }
    }

    unsafe fn dealloc(&self, _ptr: *mut u8, _layout: Layout) {}
}

#[global_allocator]
static HEAP: Bump = Bump { next: AtomicUsize::new(0), end: AtomicUsize::new(0) };

/// Text formatted into a buffer on the stack, cut at the last whole character that fits: the panic handler must not
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

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    let mut text = StackText { bytes: [0; 256], len: 0 };
    let _ = write!(text, "{} panicked: {}", crate::NAME, info.message());
    host_call(FAIL, text.bytes.as_ptr() as u64, text.len as u64);
    // SAFETY: ebreak traps; the host ends the invocation there.
    unsafe { core::arch::asm!("ebreak", options(noreturn)) }
}

// ------------------------------------------------------------------------------------------- manifest, _start

/// The image's manifest (the bytes of its JSON, placed in `.berm.abi`) and its `_start`, which the host never runs
/// (ABI.md §3): it takes the address of the manifest and of every tool given, so the linker keeps them through
/// --gc-sections.
macro_rules! manifest_and_start {
    ($manifest:expr, $($tool:ident),+) => {
        #[used]
        #[link_section = ".berm.abi"]
        static MANIFEST: [u8; $manifest.len()] = *$manifest;

        #[no_mangle]
        pub extern "C" fn _start() -> ! {
            core::hint::black_box(&MANIFEST);
            core::hint::black_box([$($tool as extern "C" fn() -> guest::Pair),+]);
            loop {}
        }
    };
}
