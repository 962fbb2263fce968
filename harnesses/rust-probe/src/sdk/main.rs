//! rust-sdk: a `no_std` Rust harness for Berm that exercises the Rust SDK (harnesses/sdk/rust): one tool per
//! capability, each taking its request as a checked JSON object (`berm::args`) and answering with the reply or the
//! host's error; `echo`, the JSON parser and writer; `heap`, the allocator. tests/test_rust_sdk.py runs it against
//! stand-in capabilities and real grants on both engines. It is also the example of a Rust harness that reaches
//! the world.

#![cfg_attr(target_os = "none", no_std, no_main)] // built for the host, `cargo test` runs the tests at the end

extern crate alloc;

use alloc::alloc::{alloc, dealloc, realloc, Layout};
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use berm::json::{self, Value};
use berm::{args, caps, outcome, Pair};

/// Reply bytes as the tool's text, or an error saying they are not UTF-8.
fn text(what: &str, bytes: Vec<u8>) -> Result<String, String> {
    String::from_utf8(bytes).map_err(|_| format!("{what} is not UTF-8"))
}

fn read() -> Result<String, String> {
    let a = args::object(&["path"])?;
    let path = a.string("path", true)?.unwrap_or_default();
    text(path, caps::fs_read(path)?)
}

fn write() -> Result<String, String> {
    let a = args::object(&["path", "content", "parents"])?;
    let path = a.string("path", true)?.unwrap_or_default();
    let content = a.string("content", true)?.unwrap_or_default();
    caps::fs_write(path, content.as_bytes(), a.boolean("parents", false)?.unwrap_or(false))?;
    Ok(format!("wrote {} bytes to {path}", content.len()))
}

fn glob() -> Result<String, String> {
    let a = args::object(&["pattern", "path"])?;
    caps::fs_glob(a.string("pattern", true)?.unwrap_or_default(), a.string_or("path", ".")?)
}

fn grep() -> Result<String, String> {
    let a = args::object(&["pattern", "path", "include", "mode"])?;
    let mode = a.choice("mode", false, &["files", "content", "count"])?.unwrap_or("files");
    caps::fs_grep(a.string("pattern", true)?.unwrap_or_default(), a.string_or("path", ".")?,
                  a.string_or("include", "")?, mode)
}

fn run() -> Result<String, String> {
    let a = args::object(&["command", "cwd", "env"])?;
    caps::exec_run(a.string("command", true)?.unwrap_or_default(), a.string_or("cwd", ".")?,
                   &a.string_map("env", false)?)
}

/// The response as `{"status":N,"headers":"…","body":"…"}` (the body as UTF-8, lossily), or with `body_only` its
/// body alone, as it came (no copy: a body of most of the heap still fits).
fn fetch() -> Result<String, String> {
    let a = args::object(&["method", "url", "body", "headers", "body_only"])?;
    let response = caps::http_fetch(a.string_or("method", "GET")?, a.string("url", true)?.unwrap_or_default(),
                                    a.string_or("body", "")?.as_bytes(), &a.string_map("headers", false)?)?;
    if a.boolean("body_only", false)?.unwrap_or(false) {
        return text("the body", response.body);
    }
    let mut out = format!("{{\"status\":{},\"headers\":", response.status);
    json::write_string(&mut out, &response.headers);
    out.push_str(",\"body\":");
    json::write_string(&mut out, &String::from_utf8_lossy(&response.body));
    out.push('}');
    Ok(out)
}

fn now() -> Result<String, String> {
    args::object(&[])?;
    let clock = caps::clock_now()?;
    Ok(format!("{{\"utc_millis\":{},\"local_offset_seconds\":{}}}", clock.utc_millis, clock.local_offset_seconds))
}

/// get (the value), lookup ("value:" and the value, or "missing"), set, delete ("done") and list (the keys as a
/// JSON array) on the harness's own storage.
fn kv() -> Result<String, String> {
    let a = args::object(&["op", "key", "value", "after"])?;
    let op = a.choice("op", true, &["get", "lookup", "set", "delete", "list"])?.unwrap_or_default();
    let key = a.string("key", op != "list")?.unwrap_or_default();
    match op {
        "get" => text(key, caps::kv_get(key)?),
        "lookup" => match caps::kv_lookup(key)? {
            Some(value) => text(key, value).map(|value| format!("value:{value}")),
            None => Ok("missing".into()),
        },
        "set" => caps::kv_set(key, a.string("value", true)?.unwrap_or_default().as_bytes()).map(|()| "done".into()),
        "delete" => caps::kv_delete(key).map(|()| "done".into()),
        _ => {
            let keys = caps::kv_list(key.as_bytes(), a.string("after", false)?.map(str::as_bytes))?;
            let keys: Result<Vec<Value>, String> =
                keys.into_iter().map(|k| text("a key", k).map(Value::String)).collect();
            let mut out = String::new();
            json::write(&mut out, &Value::Array(keys?));
            Ok(out)
        }
    }
}

fn schedule() -> Result<String, String> {
    let a = args::object(&["op", "id", "when", "payload"])?;
    let id = a.string("id", true)?.unwrap_or_default();
    match a.choice("op", true, &["at", "cancel"])?.unwrap_or_default() {
        "at" => caps::schedule_at(a.int("when", true, i64::MIN, i64::MAX)?.unwrap_or_default(), id,
                                  a.string_or("payload", "")?),
        _ => caps::schedule_cancel(id),
    }
    .map(|()| "done".into())
}

fn call() -> Result<String, String> {
    let a = args::object(&["harness", "tool", "args"])?;
    caps::call(a.string("harness", true)?.unwrap_or_default(), a.string("tool", true)?.unwrap_or_default(),
               a.string_or("args", "{}")?)
}

/// The arguments parsed by `berm::json` and written back without spaces: what the parser understood.
fn echo() -> Result<String, String> {
    let value = json::parse(&berm::args())?;
    let mut out = String::new();
    json::write(&mut out, &value);
    Ok(out)
}

/// `rounds` rounds, each allocating a block of `size` bytes and a list of small strings of every size up to 300
/// bytes, checking their contents and dropping them; the blocks alternate between two sizes so that freed ones
/// are reused, not grown in place. Done in more bytes than the heap holds, it shows that freed memory comes back.
fn heap() -> Result<String, String> {
    let a = args::object(&["rounds", "size"])?;
    let rounds = a.int("rounds", true, 0, 1 << 20)?.unwrap_or_default() as usize;
    let size = a.int("size", true, 1, 1 << 26)?.unwrap_or_default() as usize;
    let (mut allocated, mut sum) = (0usize, 0u64);
    for round in 0..rounds {
        let len = if round % 2 == 0 { size } else { size / 2 + 1 };
        let block: Vec<u8> = (0..len).map(|i| (i + round) as u8).collect();
        let small: Vec<String> = (0..300).map(|n| String::from("x").repeat(n)).collect();
        if block.iter().enumerate().any(|(i, &b)| b != (i + round) as u8)
            || small.iter().enumerate().any(|(n, s)| s.len() != n || s.bytes().any(|b| b != b'x'))
        {
            return Err(format!("round {round}: a block's contents changed"));
        }
        allocated += len + small.iter().map(String::len).sum::<usize>();
        sum = sum.wrapping_mul(31).wrapping_add(block[len - 1] as u64);
    }
    Ok(format!("{rounds} rounds, {allocated} bytes allocated, checksum {sum}"))
}

/// A live block of `allocate`: where it is, its layout, and the byte it is filled with.
struct Block {
    ptr: *mut u8,
    layout: Layout,
    fill: u8,
}

/// "op N: out of memory", every slot's block freed first so that the message itself finds memory.
unsafe fn out_of_memory(step: usize, slots: &mut [Option<Block>; 16]) -> String {
    for block in slots.iter_mut().filter_map(Option::take) {
        dealloc(block.ptr, block.layout);
    }
    format!("op {step}: out of memory")
}

/// Runs `ops`, each `[op, slot, size, align]` on one of 16 slots: 0 allocates `size` bytes aligned to `align` into
/// the slot (freeing what was there), 1 reallocates the slot's block to `size` bytes, 2 frees it, 3 fills the heap
/// with blocks of that layout until one fails (kept to the call's end; the slot is left as it is). Every block is
/// filled with its own byte; after each operation every live block must still hold it and be aligned, or the tool
/// fails naming the step. The answer: the live blocks' sizes in slot order.
fn allocate() -> Result<String, String> {
    let a = args::object(&["ops"])?;
    let Some(Value::Array(ops)) = a.field("ops", true)? else {
        return Err("invalid arguments: 'ops' must be an array".into());
    };
    let mut slots: [Option<Block>; 16] = Default::default();
    for (step, op) in ops.iter().enumerate() {
        let Value::Array(fields) = op else { return Err(format!("op {step} is not an array")) };
        let numbers: Option<Vec<i64>> = fields.iter().map(Value::as_i64).collect();
        let Some(&[op, slot, size, align]) = numbers.as_deref() else {
            return Err(format!("op {step} is not [op, slot, size, align]"));
        };
        let slot = usize::try_from(slot).ok().filter(|&s| s < 16).ok_or_else(|| format!("op {step}: no slot {slot}"))?;
        let layout = Layout::from_size_align(size.max(1) as usize, align as usize)
            .map_err(|_| format!("op {step}: no layout of {size} bytes aligned to {align}"))?;
        let fill = step as u8 ^ 0x5a;
        // SAFETY: every block was allocated by the global allocator with the layout kept beside it.
        unsafe {
            match (op, slots[slot].take()) {
                (0, old) => {
                    if let Some(old) = old {
                        dealloc(old.ptr, old.layout);
                    }
                    let ptr = alloc(layout);
                    if ptr.is_null() {
                        return Err(out_of_memory(step, &mut slots));
                    }
                    ptr.write_bytes(fill, layout.size());
                    slots[slot] = Some(Block { ptr, layout, fill });
                }
                (1, Some(old)) => {
                    let ptr = realloc(old.ptr, old.layout, layout.size());
                    if ptr.is_null() {
                        return Err(out_of_memory(step, &mut slots));
                    }
                    let layout = Layout::from_size_align_unchecked(layout.size(), old.layout.align());
                    let kept = old.layout.size().min(layout.size());
                    if (0..kept).any(|i| *ptr.add(i) != old.fill) {
                        return Err(format!("op {step}: realloc lost the block's bytes"));
                    }
                    ptr.write_bytes(fill, layout.size());
                    slots[slot] = Some(Block { ptr, layout, fill });
                }
                (2, Some(old)) => dealloc(old.ptr, old.layout),
                (3, old) => {
                    slots[slot] = old;
                    // black_box: an allocation only tested for null and leaked is one LLVM may take as made
                    while !core::hint::black_box(alloc(layout)).is_null() {}
                }
                (_, old) => slots[slot] = old,
            }
            for block in slots.iter().flatten() {
                if block.ptr as usize % block.layout.align() != 0 {
                    return Err(format!("op {step}: a block at {:#x} is not aligned to {}", block.ptr as usize,
                                       block.layout.align()));
                }
                if (0..block.layout.size()).any(|i| *block.ptr.add(i) != block.fill) {
                    return Err(format!("op {step}: a block's bytes changed"));
                }
            }
        }
    }
    let sizes: Vec<String> = slots.iter().map(|b| b.as_ref().map_or(0, |b| b.layout.size()).to_string()).collect();
    Ok(sizes.join(" "))
}

macro_rules! tools {
    ($($name:ident => $body:ident),+ $(,)?) => {
        $(
            #[no_mangle]
            pub extern "C" fn $name() -> Pair {
                outcome($body())
            }
        )+
        berm::harness! {
            name: "rust-sdk",
            manifest: include_bytes!("manifest.json"),
            tools: [$($name),+],
        }
    };
}

tools! {
    berm_tool_read => read,
    berm_tool_write => write,
    berm_tool_glob => glob,
    berm_tool_grep => grep,
    berm_tool_run => run,
    berm_tool_fetch => fetch,
    berm_tool_now => now,
    berm_tool_kv => kv,
    berm_tool_schedule => schedule,
    berm_tool_call => call,
    berm_tool_echo => echo,
    berm_tool_heap => heap,
    berm_tool_allocate => allocate,
}

/// The tools called natively by `berm::testing::Host`, with stand-in capabilities (`cargo test --bin rust-sdk` on
/// the host; tests/test_rust_build.py runs it).
#[cfg(test)]
mod tests {
    use super::*;
    use berm::testing::{Call, Host};

    fn result(call: Call) -> Result<String, String> {
        call.result
    }

    #[test]
    fn read_answers_the_file_or_the_hosts_error() {
        let host = Host::new().capability("berm.fs.read", |fields| match fields[0].as_slice() {
            b"a.txt" => Ok(b"hello".to_vec()),
            other => Err(format!("{}: no such file", String::from_utf8_lossy(other))),
        });
        assert_eq!(result(host.call(berm_tool_read, br#"{"path": "a.txt"}"#)), Ok("hello".into()));
        assert_eq!(result(host.call(berm_tool_read, br#"{"path": "b.txt"}"#)), Err("b.txt: no such file".into()));
        let missing = Err("invalid arguments: missing required field 'path'".into());
        assert_eq!(result(host.call(berm_tool_read, b"{}")), missing);
    }

    #[test]
    fn kv_list_frames_its_request_and_reads_a_framed_reply() {
        let host = Host::new().capability("berm.kv.list", |fields| {
            assert_eq!(fields, [b"p".to_vec(), b"pa".to_vec()]);
            Ok(frame_of(&[b"pb", b"pc"]))
        });
        let call = host.call(berm_tool_kv, br#"{"op": "list", "key": "p", "after": "pa"}"#);
        assert_eq!(call.result, Ok(r#"["pb","pc"]"#.into()));
    }

    #[test]
    fn json_echo_and_the_heap_tool_run_natively_too() {
        let host = Host::new();
        assert_eq!(result(host.call(berm_tool_echo, b" [1, {\"a\": null}] ")), Ok(r#"[1,{"a":null}]"#.into()));
        let call = host.call(berm_tool_heap, br#"{"rounds": 3, "size": 1000}"#);
        assert!(call.result.unwrap().starts_with("3 rounds, "));
    }

    #[test]
    #[should_panic(expected = "no host function for call 6966279491837799356 (berm.fs.read): no stand-in capability")]
    fn a_capability_with_no_stand_in_fails_its_test_alone() {
        // A panic inside the tool's host call aborted the whole test binary (extern "C" cannot unwind).
        Host::new().call(berm_tool_read, br#"{"path": "a.txt"}"#);
    }

    #[test]
    #[should_panic(expected = "the stand-in's own assertion")]
    fn a_stand_in_that_panics_fails_its_test_with_its_own_panic() {
        let host = Host::new().capability("berm.fs.read", |_| panic!("the stand-in's own assertion"));
        host.call(berm_tool_read, br#"{"path": "a.txt"}"#);
    }

    #[test]
    fn a_stand_in_may_call_a_tool_in_turn() {
        // berm.call served by calling echo natively: the nested Host::call keeps the outer call's state (it took it,
        // and the outer tool's berm.result.read found no call in progress).
        let host = Host::new().capability("berm.call", |fields| {
            assert_eq!(fields[..2], [b"self".to_vec(), b"echo".to_vec()]);
            Host::new().call(berm_tool_echo, &fields[2]).result.map(String::into_bytes)
        });
        let call = host.call(berm_tool_call, br#"{"harness": "self", "tool": "echo", "args": "[1, 2]"}"#);
        assert_eq!(call.result, Ok("[1,2]".into()));
    }

    fn frame_of(fields: &[&[u8]]) -> Vec<u8> {
        berm::frame::encode(fields)
    }
}
