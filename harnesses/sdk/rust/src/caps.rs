//! One function per capability (ABI.md §1, "Capabilities"). Each frames its request, makes the host call and pulls
//! the staged reply. Errors are values: a capability's own failure (no such file, a host not granted, a timeout)
//! comes back as `Err` with the host's message and never traps. Calling a capability the declaration did not grant
//! traps ("no host function for call …"): a harness can only ask for it, in its manifest.

use crate::calls::*;
use crate::frame;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

/// The reply bytes of capability `number` to the request `fields`, or the host's error message. A request or a
/// reply the heap cannot hold is an error too, never the allocator's panic.
pub fn capability(number: u64, fields: &[&[u8]]) -> Result<Vec<u8>, String> {
    let mut request = buffer(frame::encoded_len(fields), "request")?;
    frame::encode_into(&mut request, fields);
    // SAFETY: the host reads the request's bytes, then writes at most `len` bytes of the staged reply into `reply`.
    let returned = unsafe { host_call(number, request.as_ptr() as u64, request.len() as u64) };
    drop(request);
    let len = (returned & !ERROR) as usize;
    let mut reply = buffer(len, "reply")?;
    reply.resize(len, 0);
    unsafe { host_call(RESULT_READ, reply.as_mut_ptr() as u64, len as u64) };
    if returned & ERROR != 0 {
        return Err(String::from_utf8_lossy(&reply).into_owned());
    }
    Ok(reply)
}

/// An empty vector with room for `len` bytes, or an error saying the `what` does not fit in guest memory.
fn buffer(len: usize, what: &str) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(len).map_err(|_| format!("a {what} of {len} bytes does not fit in guest memory"))?;
    Ok(bytes)
}

/// `bytes` copied into a vector of their own, or an error when the heap cannot hold them.
fn owned(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut copy = buffer(bytes.len(), "reply")?;
    copy.extend_from_slice(bytes);
    Ok(copy)
}

/// A reply that is text (paths, JSON), or an error naming the capability when it is not UTF-8.
fn text(name: &str, reply: Vec<u8>) -> Result<String, String> {
    String::from_utf8(reply).map_err(|_| format!("the reply of {name} is not UTF-8"))
}

/// The fields of a framed reply of `count` values, or an error naming the capability.
fn fields<'a>(name: &str, reply: &'a [u8], count: usize) -> Result<Vec<&'a [u8]>, String> {
    match frame::decode(reply) {
        Some(fields) if fields.len() == count => Ok(fields),
        Some(fields) => Err(format!("malformed reply from {name}: expected {count} fields, got {}", fields.len())),
        None => Err(format!("malformed reply from {name}: a field runs past its end")),
    }
}

/// A request's fields followed by a list of pairs, flattened in place (ABI.md §2).
fn with_pairs<'a>(fields: &[&'a [u8]], pairs: &[(&'a str, &'a str)]) -> Vec<&'a [u8]> {
    let mut all = fields.to_vec();
    for (key, value) in pairs {
        all.push(key.as_bytes());
        all.push(value.as_bytes());
    }
    all
}

fn done(reply: Result<Vec<u8>, String>) -> Result<(), String> {
    reply.map(|_| ())
}

/// The bytes of a file under the declaration's root (`path` relative to it).
pub fn fs_read(path: &str) -> Result<Vec<u8>, String> {
    capability(FS_READ, &[path.as_bytes()])
}

/// Writes a file atomically; a missing parent directory is an error unless `parents`.
pub fn fs_write(path: &str, content: &[u8], parents: bool) -> Result<(), String> {
    let pairs: &[(&str, &str)] = if parents { &[("parents", "1")] } else { &[] };
    done(capability(FS_WRITE, &with_pairs(&[path.as_bytes(), content], pairs)))
}

/// Root-relative paths of the files under `path` matching `pattern`, newest first, one per line.
pub fn fs_glob(pattern: &str, path: &str) -> Result<String, String> {
    text("berm.fs.glob", capability(FS_GLOB, &[pattern.as_bytes(), path.as_bytes()])?)
}

/// Lines matching the regular expression `pattern` in files under `path` whose names match `include` (empty: all),
/// by `mode`: "files" or "" (matching paths), "content" ("path:line:text"), "count" ("path:N").
pub fn fs_grep(pattern: &str, path: &str, include: &str, mode: &str) -> Result<String, String> {
    let request = [pattern.as_bytes(), path.as_bytes(), include.as_bytes(), mode.as_bytes()];
    text("berm.fs.grep", capability(FS_GREP, &request)?)
}

/// Runs `command` in `cwd` (relative to the root) with `env` added: the JSON text
/// `{"exit_code":N,"stderr":"…","stdout":"…"}` (exit_code -1 when killed by a signal or the timeout).
pub fn exec_run(command: &str, cwd: &str, env: &[(&str, &str)]) -> Result<String, String> {
    text("berm.exec.run", capability(EXEC_RUN, &with_pairs(&[command.as_bytes(), cwd.as_bytes()], env))?)
}

/// An HTTP response: the status, the headers rendered `name: value\n` each, and the body.
pub struct Response {
    pub status: i64,
    pub headers: String,
    pub body: Vec<u8>,
}

/// An HTTP request to a host the declaration lists. The body is the reply's own buffer, its head cut off (a
/// body close to the heap's size is not copied).
pub fn http_fetch(method: &str, url: &str, body: &[u8], headers: &[(&str, &str)]) -> Result<Response, String> {
    let mut reply = capability(HTTP_FETCH, &with_pairs(&[method.as_bytes(), url.as_bytes(), body], headers))?;
    let parts = fields("berm.http.fetch", &reply, 3)?;
    let status = frame::integer(parts[0]).ok_or_else(|| {
        format!("malformed reply from berm.http.fetch: status {} is not a number", String::from_utf8_lossy(parts[0]))
    })?;
    let headers = text("berm.http.fetch", owned(parts[1])?)?;
    let body_at = parts[2].as_ptr() as usize - reply.as_ptr() as usize;
    reply.drain(..body_at); // the body is the frame's last field: it runs to the end
    Ok(Response { status, headers, body: reply })
}

/// The time: milliseconds since the Unix epoch (UTC), and the host's local offset from UTC in seconds.
pub struct Clock {
    pub utc_millis: i64,
    pub local_offset_seconds: i64,
}

pub fn clock_now() -> Result<Clock, String> {
    let reply = capability(CLOCK_NOW, &[])?;
    let parts = fields("berm.clock.now", &reply, 2)?;
    match (frame::integer(parts[0]), frame::integer(parts[1])) {
        (Some(utc_millis), Some(local_offset_seconds)) => Ok(Clock { utc_millis, local_offset_seconds }),
        _ => Err(String::from("malformed reply from berm.clock.now: a field is not a number")),
    }
}

/// The harness's own stored value for `key`; a missing key is an error ("no value for key …": `kv_lookup` tells it
/// apart).
pub fn kv_get(key: &str) -> Result<Vec<u8>, String> {
    capability(KV_GET, &[key.as_bytes()])
}

/// What berm.kv.get says of a key it does not hold (berm_abi/names.py), after the capability's name.
const KV_MISSING: &str = "berm.kv.get: no value for key";

/// The harness's own stored value for `key`, `None` when the store does not hold it; an error when the store failed
/// (busy, unreadable), which says nothing of whether the key exists.
pub fn kv_lookup(key: &str) -> Result<Option<Vec<u8>>, String> {
    match kv_get(key) {
        Ok(value) => Ok(Some(value)),
        Err(error) if error.starts_with(KV_MISSING) => Ok(None),
        Err(error) => Err(error),
    }
}

pub fn kv_set(key: &str, value: &[u8]) -> Result<(), String> {
    done(capability(KV_SET, &[key.as_bytes(), value]))
}

pub fn kv_delete(key: &str) -> Result<(), String> {
    done(capability(KV_DELETE, &[key.as_bytes()]))
}

/// The stored keys starting with `prefix`, sorted; with `after`, one page of them: those greater than `after`.
pub fn kv_list(prefix: &[u8], after: Option<&[u8]>) -> Result<Vec<Vec<u8>>, String> {
    let reply = match after {
        Some(after) => capability(KV_LIST, &[prefix, after])?,
        None => capability(KV_LIST, &[prefix])?,
    };
    let keys = frame::decode(&reply).ok_or("malformed reply from berm.kv.list: a field runs past its end")?;
    keys.into_iter().map(owned).collect()
}

/// Asks the scheduler to wake this harness at `when_utc_millis` with `payload` (its `on_wake` export), under `id`.
pub fn schedule_at(when_utc_millis: i64, id: &str, payload: &str) -> Result<(), String> {
    let when = format!("{when_utc_millis}");
    done(capability(SCHEDULE_AT, &[when.as_bytes(), id.as_bytes(), payload.as_bytes()]))
}

pub fn schedule_cancel(id: &str) -> Result<(), String> {
    done(capability(SCHEDULE_CANCEL, &[id.as_bytes()]))
}

/// Calls `tool` of another harness with the JSON text `args`: its result text.
pub fn call(harness: &str, tool: &str, args: &str) -> Result<String, String> {
    text("berm.call", capability(CALL, &[harness.as_bytes(), tool.as_bytes(), args.as_bytes()])?)
}
