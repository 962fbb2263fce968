//! The tool boundary (ABI.md §3): the arguments a tool pulls, the result it returns, failures and log lines.

use crate::calls::{host_call, ARGS_LEN, ARGS_READ, FAIL, LOG};
use alloc::string::String;
use alloc::vec::Vec;

/// The invocation's arguments: the JSON text the caller sent, as it is (a string argument keeps its quotes). Panics
/// (a trap) when the heap cannot hold them; `args::object` says so as an error instead.
pub fn args() -> Vec<u8> {
    read_args().unwrap_or_else(|len| panic!("out of memory reading {len} bytes of arguments"))
}

/// The arguments, or their length when the heap cannot hold them.
pub(crate) fn read_args() -> Result<Vec<u8>, usize> {
    // SAFETY: both calls only read the argument blob; the second writes at most `len` bytes into `buf`.
    let len = unsafe { host_call(ARGS_LEN, 0, 0) } as usize;
    let mut buf = Vec::new();
    buf.try_reserve_exact(len).map_err(|_| len)?;
    buf.resize(len, 0);
    unsafe { host_call(ARGS_READ, buf.as_mut_ptr() as u64, len as u64) };
    Ok(buf)
}

/// A host-side log line, tagged with the harness.
pub fn log(text: &str) {
    // SAFETY: the host reads `text`'s bytes.
    unsafe { host_call(LOG, text.as_ptr() as u64, text.len() as u64) };
}

/// What a tool returns in a0/a1: its result's address and length.
#[repr(C)]
pub struct Pair {
    pub ptr: u64,
    pub len: u64,
}

/// The tool's result. The text is leaked: guest memory is fresh for every invocation, so nothing outlives the call.
pub fn ok(text: String) -> Pair {
    let text = text.leak();
    Pair { ptr: text.as_ptr() as u64, len: text.len() as u64 }
}

/// The tool fails with `text` (the caller sees a tool failure carrying it, whatever the tool returns after).
pub fn fail(text: &str) -> Pair {
    // SAFETY: the host reads `text`'s bytes.
    unsafe { host_call(FAIL, text.as_ptr() as u64, text.len() as u64) };
    Pair { ptr: 0, len: 0 }
}

/// `ok` for a result, `fail` with the message for an error: `berm::outcome(run())` ends most tools.
pub fn outcome(result: Result<String, String>) -> Pair {
    match result {
        Ok(text) => ok(text),
        Err(message) => fail(&message),
    }
}
