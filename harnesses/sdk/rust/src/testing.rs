//! Native tests of a harness's tools (built for the host, not the guest): `Host` calls a tool as Berm's host does
//! (the arguments pulled with `berm.args.*`, failures through `berm.fail`, log lines, capabilities answering framed
//! requests with staged replies), with stand-in capabilities. The allocator and panics are `std`'s; a tool's result
//! text is leaked, as in the guest, where memory is fresh for every call.
//!
//! ```ignore
//! let host = berm::testing::Host::new().capability("berm.fs.read", |fields| Ok(b"hello".to_vec()));
//! assert_eq!(host.call(berm_tool_greet, br#"{"path": "a.txt"}"#).result, Ok("a.txt: 5 bytes".into()));
//! ```

use crate::calls::{fnv1a64, ARGS_LEN, ARGS_READ, ERROR, FAIL, HEAP_SIZE, HEAP_START, LOG, RESULT_READ};
use crate::frame;
use crate::Pair;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// A stand-in capability: the request's fields, to the reply or the error message.
pub type Capability = dyn Fn(Vec<Vec<u8>>) -> Result<Vec<u8>, String>;

/// What a tool did: its result text or its failure's text, and the lines it logged.
#[derive(Debug, PartialEq)]
pub struct Call {
    pub result: Result<String, String>,
    pub logs: Vec<String>,
}

/// The host a tool is called on: stand-in capabilities by name (a capability it lacks is a panic naming the call,
/// as a guest's call of one not granted is a trap).
#[derive(Clone, Default)]
pub struct Host {
    capabilities: HashMap<u64, (String, Rc<Capability>)>,
}

/// One call's state, which the host calls read and write.
struct Invocation {
    host: Host,
    args: Vec<u8>,
    failure: Option<String>,
    logs: Vec<String>,
    staged: Vec<u8>,
}

std::thread_local! {
    static CURRENT: RefCell<Option<Invocation>> = const { RefCell::new(None) };
}

impl Host {
    pub fn new() -> Host {
        Host::default()
    }

    /// The host with capability `name` (e.g. "berm.fs.read") served by `serve`.
    pub fn capability(mut self, name: &str, serve: impl Fn(Vec<Vec<u8>>) -> Result<Vec<u8>, String> + 'static) -> Host {
        self.capabilities.insert(fnv1a64(name), (name.to_string(), Rc::new(serve)));
        self
    }

    /// Calls `tool` with the argument bytes `args`.
    pub fn call(&self, tool: extern "C" fn() -> Pair, args: &[u8]) -> Call {
        let invocation = Invocation { host: self.clone(), args: args.to_vec(), failure: None, logs: Vec::new(),
                                      staged: Vec::new() };
        CURRENT.with(|current| *current.borrow_mut() = Some(invocation));
        let pair = tool();
        let done = CURRENT.with(|current| current.borrow_mut().take()).expect("the call's state");
        let result = match done.failure {
            Some(failure) => Err(failure),
            None if pair.len == 0 => Ok(String::new()),
            None => {
                // SAFETY: the tool returned the address and length of its result, which it leaked.
                let bytes = unsafe { std::slice::from_raw_parts(pair.ptr as *const u8, pair.len as usize) };
                Ok(String::from_utf8(bytes.to_vec()).expect("a tool's result must be UTF-8"))
            }
        };
        Call { result, logs: done.logs }
    }
}

/// The bytes at (ptr, len).
///
/// # Safety
/// The caller's host call passed a pointer and length valid for reading.
unsafe fn bytes<'a>(ptr: u64, len: u64) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    std::slice::from_raw_parts(ptr as *const u8, len as usize)
}

/// Copies `from` into the caller's buffer of `cap` bytes at `ptr`, as much as fits; returns `from`'s length.
///
/// # Safety
/// The caller's host call passed a buffer valid for writing `cap` bytes.
unsafe fn copy_out(from: &[u8], ptr: u64, cap: u64) -> u64 {
    let n = from.len().min(cap as usize);
    if n > 0 {
        std::ptr::copy_nonoverlapping(from.as_ptr(), ptr as *mut u8, n);
    }
    from.len() as u64
}

/// Serves a host call made while `Host::call` runs a tool.
///
/// # Safety
/// As `calls::host_call`'s.
pub(crate) unsafe fn serve(number: u64, arg0: u64, arg1: u64) -> u64 {
    CURRENT.with(|current| {
        let mut current = current.borrow_mut();
        let call = current.as_mut().expect("a host call outside berm::testing::Host::call");
        match number {
            ARGS_LEN => call.args.len() as u64,
            ARGS_READ => copy_out(&call.args, arg0, arg1),
            LOG => {
                call.logs.push(String::from_utf8_lossy(bytes(arg0, arg1)).into_owned());
                0
            }
            FAIL => {
                call.failure = Some(String::from_utf8_lossy(bytes(arg0, arg1)).into_owned());
                0
            }
            RESULT_READ => copy_out(&call.staged, arg0, arg1),
            HEAP_START | HEAP_SIZE => panic!("natively, the heap is std's: berm::Heap is for the guest"),
            _ => {
                let Some((_, serve)) = call.host.capabilities.get(&number).cloned() else {
                    panic!("no host function for call {number} (no stand-in capability for it)");
                };
                let request = bytes(arg0, arg1);
                let fields = frame::decode(request).expect("a request frame the SDK wrote");
                let reply = serve(fields.into_iter().map(<[u8]>::to_vec).collect());
                let (staged, error) = match reply {
                    Ok(reply) => (reply, 0),
                    Err(message) => (message.into_bytes(), ERROR),
                };
                call.staged = staged;
                call.staged.len() as u64 | error
            }
        }
    })
}
