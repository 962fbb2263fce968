//! Native tests of a harness's tools (built for the host, not the guest): `Host` calls a tool as Berm's host does
//! (the arguments pulled with `berm.args.*`, failures through `berm.fail`, log lines, capabilities answering framed
//! requests with staged replies), with stand-in capabilities. The allocator and panics are `std`'s; a tool's result
//! text is leaked, as in the guest, where memory is fresh for every call.
//!
//! A tool is an `extern "C"` function, which a panic cannot unwind through: it aborts the whole test binary. So a
//! host call that goes wrong (a capability with no stand-in, a stand-in that panics, as a failed `assert!` in it
//! does) answers the tool with an error reply and is raised as a panic once the tool has returned, failing that
//! test alone. A panic in the tool's own code still aborts (its message is printed first). A stand-in may call
//! tools in turn: each `Host::call` keeps the state of the one it is nested in.
//!
//! ```ignore
//! let host = berm::testing::Host::new().capability("berm.fs.read", |fields| Ok(b"hello".to_vec()));
//! assert_eq!(host.call(berm_tool_greet, br#"{"path": "a.txt"}"#).result, Ok("a.txt: 5 bytes".into()));
//! ```

use crate::calls::{fnv1a64, ARGS_LEN, ARGS_READ, ERROR, FAIL, HEAP_SIZE, HEAP_START, LOG, NAMES, RESULT_READ};
use crate::frame;
use crate::Pair;
use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::panic::{self, AssertUnwindSafe};
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
/// raised once the tool returns, as a guest's call of one not granted is a trap).
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
    /// The first host call that went wrong, raised as a panic once the tool has returned (see the module's docs).
    fault: Option<Fault>,
}

/// What went wrong in a host call.
enum Fault {
    /// A stand-in panicked (its message printed then): its panic goes on.
    Panicked(Box<dyn Any + Send>),
    /// The host could not serve the call: a panic with this text.
    Refused(String),
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
                                      staged: Vec::new(), fault: None };
        let outer = CURRENT.with(|current| current.replace(Some(invocation)));
        let pair = tool();
        let done = CURRENT.with(|current| current.replace(outer)).expect("the call's state");
        match done.fault {
            Some(Fault::Panicked(payload)) => panic::resume_unwind(payload),
            Some(Fault::Refused(why)) => panic!("{why}"),
            None => {}
        }
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
    let (stand_in, request) = match with_call(|call| serve_core(call, number, arg0, arg1)) {
        Ok(answer) => return answer,
        Err(capability) => capability,
    };
    // Not borrowed while the stand-in runs: it may call a tool in turn.
    let reply = panic::catch_unwind(AssertUnwindSafe(|| stand_in(request)));
    with_call(|call| match reply {
        Ok(Ok(reply)) => stage(call, reply, 0),
        Ok(Err(message)) => stage(call, message.into_bytes(), ERROR),
        Err(payload) => fault(call, Fault::Panicked(payload)),
    })
}

/// A capability's stand-in and the fields of its request.
type Request = (Rc<Capability>, Vec<Vec<u8>>);

fn with_call<T>(f: impl FnOnce(&mut Invocation) -> T) -> T {
    CURRENT.with(|current| f(current.borrow_mut().as_mut().expect("a host call outside berm::testing::Host::call")))
}

/// The answer to a call the host serves itself, or the stand-in that answers a capability.
///
/// # Safety
/// As `calls::host_call`'s.
unsafe fn serve_core(call: &mut Invocation, number: u64, arg0: u64, arg1: u64) -> Result<u64, Request> {
    Ok(match number {
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
        HEAP_START | HEAP_SIZE => {
            fault(call, Fault::Refused("natively, the heap is std's: berm::Heap is for the guest".into()));
            0
        }
        _ => {
            let Some((_, stand_in)) = call.host.capabilities.get(&number).cloned() else {
                let name = NAMES.iter().find(|name| fnv1a64(name) == number).copied().unwrap_or("a name Berm lacks");
                let why = format!("no host function for call {number} ({name}): no stand-in capability for it");
                return Ok(fault(call, Fault::Refused(why)));
            };
            let Some(fields) = frame::decode(bytes(arg0, arg1)) else {
                return Ok(fault(call, Fault::Refused("a request frame runs past its end".into())));
            };
            return Err((stand_in, fields.into_iter().map(<[u8]>::to_vec).collect()));
        }
    })
}

/// Stages `reply` for `berm.result.read`; the capability's return value.
fn stage(call: &mut Invocation, reply: Vec<u8>, error: u64) -> u64 {
    call.staged = reply;
    call.staged.len() as u64 | error
}

/// Keeps the call's first fault, to raise once the tool returns; the tool gets an error reply saying what it was.
fn fault(call: &mut Invocation, fault: Fault) -> u64 {
    let message = match &fault {
        Fault::Refused(why) => why.clone(),
        Fault::Panicked(payload) => {
            let text = payload.downcast_ref::<String>().map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied());
            format!("the stand-in panicked: {}", text.unwrap_or("(no message)"))
        }
    };
    call.fault.get_or_insert(fault);
    stage(call, message.into_bytes(), ERROR)
}
