//! Host-call numbers and the `ecall` (ABI.md §1). Numbers are derived from names, never typed by hand; the names
//! are berm_abi/names.py's (tests/test_rust_sdk.py checks that both list the same ones).

/// FNV-1a 64 over the name's UTF-8 bytes. `fnv1a64("foobar") == 0x85944171f73967e8`.
pub const fn fnv1a64(name: &str) -> u64 {
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

/// Bit 63 of a capability's return value: the staged bytes are an error message, not a reply.
pub const ERROR: u64 = 1 << 63;

// Always present (never granted).
pub const LOG: u64 = fnv1a64("berm.log");
pub const ARGS_LEN: u64 = fnv1a64("berm.args.len");
pub const ARGS_READ: u64 = fnv1a64("berm.args.read");
pub const FAIL: u64 = fnv1a64("berm.fail");
pub const RESULT_READ: u64 = fnv1a64("berm.result.read");
pub const HEAP_START: u64 = fnv1a64("berm.heap.start");
pub const HEAP_SIZE: u64 = fnv1a64("berm.heap.size");

// Capabilities: present only when the declaration grants them (crate::caps wraps each).
pub const FS_READ: u64 = fnv1a64("berm.fs.read");
pub const FS_WRITE: u64 = fnv1a64("berm.fs.write");
pub const FS_GLOB: u64 = fnv1a64("berm.fs.glob");
pub const FS_GREP: u64 = fnv1a64("berm.fs.grep");
pub const EXEC_RUN: u64 = fnv1a64("berm.exec.run");
pub const HTTP_FETCH: u64 = fnv1a64("berm.http.fetch");
pub const CLOCK_NOW: u64 = fnv1a64("berm.clock.now");
pub const KV_GET: u64 = fnv1a64("berm.kv.get");
pub const KV_SET: u64 = fnv1a64("berm.kv.set");
pub const KV_DELETE: u64 = fnv1a64("berm.kv.delete");
pub const KV_LIST: u64 = fnv1a64("berm.kv.list");
pub const SCHEDULE_AT: u64 = fnv1a64("berm.schedule.at");
pub const SCHEDULE_CANCEL: u64 = fnv1a64("berm.schedule.cancel");
pub const CALL: u64 = fnv1a64("berm.call");

/// One host call: the number in a7, two arguments in a0/a1, the result from a0. Built for the host, the call goes to
/// `testing::Host` instead.
///
/// # Safety
/// The host reads or writes guest memory as the call's contract says (`berm.args.read` writes `arg1` bytes at
/// `arg0`, for one): the caller must pass pointers and lengths that are valid for that.
#[cfg(target_os = "none")]
pub unsafe fn host_call(number: u64, arg0: u64, arg1: u64) -> u64 {
    let result: u64;
    core::arch::asm!("ecall", inlateout("a0") arg0 => result, in("a1") arg1, in("a7") number, options(nostack));
    result
}

/// `host_call` on the host: `testing::Host` serves it.
///
/// # Safety
/// As for the guest's: pointers and lengths valid for what the call reads or writes.
#[cfg(not(target_os = "none"))]
pub unsafe fn host_call(number: u64, arg0: u64, arg1: u64) -> u64 {
    crate::testing::serve(number, arg0, arg1)
}
