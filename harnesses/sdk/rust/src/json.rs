//! JSON for tool arguments and results: a parser into `Value` (at most `MAX_DEPTH` levels of nesting, numbers
//! kept as their text) and a string writer. Errors say at which byte the text went wrong, for a model to act on,
//! at the byte the C SDK's parser names, but for a malformed number: the C SDK names its first byte (a leading zero:
//! the byte after the zero, as text after a value), this parser the byte where it stopped reading it. A heap too
//! small for the value is an error too, never the allocator's panic (a trap): each string takes one exact
//! allocation, as in the C SDK.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

/// How deeply arrays and objects may nest: deeper text is an error, not a stack overflow.
pub const MAX_DEPTH: usize = 64;

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    /// The number's text as written (it is valid JSON): `as_i64` reads an integer from it.
    Number(String),
    String(String),
    Array(Vec<Value>),
    /// The members in the order written; a repeated key is an error.
    Object(Vec<(String, Value)>),
}

impl Value {
    /// A member of an object (None for a missing key or a value that is not an object).
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// An integer written without fraction or exponent that fits an i64.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Number(text) => text.parse().ok(),
            _ => None,
        }
    }

    /// The value's type for messages ("'path' must be a string, not array"), as the C SDK names them: a number
    /// written without fraction or exponent is an "integer".
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(text) if !text.contains(['.', 'e', 'E']) => "integer",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        }
    }
}

/// Why a text was not parsed.
pub(crate) enum Error {
    /// What is wrong with the text, and at which byte.
    Invalid(String),
    /// The heap cannot hold the value.
    OutOfMemory,
}

/// The JSON value of `text` (surrounding whitespace allowed), or what is wrong with it and at which byte.
pub fn parse(text: &[u8]) -> Result<Value, String> {
    parse_value(text).map_err(|e| match e {
        Error::Invalid(message) => message,
        Error::OutOfMemory => format!("out of memory parsing {} bytes of JSON", text.len()),
    })
}

pub(crate) fn parse_value(text: &[u8]) -> Result<Value, Error> {
    let mut parser = Parser { text, at: 0 };
    let value = parser.value(0)?;
    parser.space();
    if parser.at != text.len() {
        return Err(parser.error("text after the value"));
    }
    Ok(value)
}

/// Room for `n` more items in `v`, or `Error::OutOfMemory`.
fn room<T>(v: &mut Vec<T>, n: usize) -> Result<(), Error> {
    v.try_reserve(n).map_err(|_| Error::OutOfMemory)
}

/// Appends `s` to `out` as a JSON string, quotes included.
pub fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Appends `value` to `out` as JSON text without spaces, members in their order.
pub fn write(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(text) => out.push_str(text),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(out, item);
            }
            out.push(']');
        }
        Value::Object(members) => {
            out.push('{');
            for (i, (key, item)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, key);
                out.push(':');
                write(out, item);
            }
            out.push('}');
        }
    }
}

struct Parser<'a> {
    text: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn error(&self, what: &str) -> Error {
        Error::Invalid(format!("invalid JSON at byte {}: {what}", self.at))
    }

    fn space(&mut self) {
        while matches!(self.text.get(self.at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        self.at += usize::from(found);
        found
    }

    fn expect(&mut self, byte: u8) -> Result<(), Error> {
        if self.eat(byte) {
            return Ok(());
        }
        Err(self.error(&format!("expected '{}'", byte as char)))
    }

    fn value(&mut self, depth: usize) -> Result<Value, Error> {
        self.space();
        match self.peek() {
            Some(b'{' | b'[') if depth == MAX_DEPTH => Err(self.error("nested too deeply")),
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => {
                let words = [("null", Value::Null), ("true", Value::Bool(true)), ("false", Value::Bool(false))];
                for (word, value) in words {
                    if self.text[self.at..].starts_with(word.as_bytes()) {
                        self.at += word.len();
                        return Ok(value);
                    }
                }
                Err(self.error("expected a value"))
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, Error> {
        self.at += 1;
        let mut items = Vec::new();
        self.space();
        if self.eat(b']') {
            return Ok(Value::Array(items));
        }
        loop {
            let item = self.value(depth)?;
            room(&mut items, 1)?;
            items.push(item);
            self.space();
            if self.eat(b']') {
                return Ok(Value::Array(items));
            }
            self.expect(b',')?;
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, Error> {
        self.at += 1;
        let mut members: Vec<(String, Value)> = Vec::new();
        self.space();
        if self.eat(b'}') {
            return Ok(Value::Object(members));
        }
        loop {
            self.space();
            if self.peek() != Some(b'"') {
                return Err(self.error("expected a key"));
            }
            let key = self.string()?;
            self.space();
            self.expect(b':')?;
            let value = self.value(depth)?;
            room(&mut members, 1)?;
            members.push((key, value));
            self.space();
            if self.eat(b'}') {
                return self.unique(members);
            }
            self.expect(b',')?;
        }
    }

    /// The object of `members`, or an error naming a key it repeats. Sorted, not compared pairwise: an object of
    /// 40,000 keys took 13 s to check key by key, past a tool's deadline (found by a review).
    fn unique(&self, members: Vec<(String, Value)>) -> Result<Value, Error> {
        let mut keys: Vec<&str> = Vec::new();
        room(&mut keys, members.len())?;
        keys.extend(members.iter().map(|(k, _)| k.as_str()));
        keys.sort_unstable();
        if let Some(pair) = keys.windows(2).find(|pair| pair[0] == pair[1]) {
            // at most 32 bytes of it, as the C SDK shows it: a key of megabytes made a message the heap could not
            // hold beside the value, and the tool trapped (found by a review)
            let key = pair[0];
            let mut end = key.len().min(32);
            while !key.is_char_boundary(end) {
                end -= 1;
            }
            let more = if end < key.len() { "..." } else { "" };
            return Err(self.error(&format!("key \"{}{more}\" repeated", &key[..end])));
        }
        Ok(Value::Object(members))
    }

    fn digits(&mut self) -> usize {
        let start = self.at;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
        self.at - start
    }

    fn number(&mut self) -> Result<Value, Error> {
        let start = self.at;
        self.eat(b'-');
        let leading_zero = self.peek() == Some(b'0');
        match self.digits() {
            0 => return Err(self.error("expected a digit")),
            n if leading_zero && n > 1 => return Err(self.error("a number with a leading zero")),
            _ => {}
        }
        if self.eat(b'.') && self.digits() == 0 {
            return Err(self.error("expected a digit after '.'"));
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            let _ = self.eat(b'+') || self.eat(b'-');
            if self.digits() == 0 {
                return Err(self.error("expected a digit in the exponent"));
            }
        }
        let mut text = String::new();
        text.try_reserve_exact(self.at - start).map_err(|_| Error::OutOfMemory)?;
        // the bytes are ASCII digits and signs, so this cannot fail
        text.push_str(core::str::from_utf8(&self.text[start..self.at]).unwrap_or_default());
        Ok(Value::Number(text))
    }

    /// The four hex digits here, read; what is wrong with them (the caller places it).
    fn hex4(&mut self) -> Result<u32, &'static str> {
        let digits = self.text.get(self.at..self.at + 4).ok_or("a short \\u escape")?;
        let value = core::str::from_utf8(digits).ok().and_then(|d| u32::from_str_radix(d, 16).ok());
        let value = value.filter(|_| digits.iter().all(u8::is_ascii_hexdigit));
        let value = value.ok_or("a \\u escape that is not four hex digits")?;
        self.at += 4;
        Ok(value)
    }

    /// A string's text, from its opening quote: one allocation of the bytes to its closing quote (which its
    /// escapes only shorten), each run of plain bytes checked as UTF-8 where it stands. An error names the byte at
    /// fault: the opening quote of a string that never closes, the backslash of a bad escape, the first byte of a
    /// run that is not UTF-8, a control character.
    fn string(&mut self) -> Result<String, Error> {
        let Some(span) = self.span() else { return Err(self.error("a string with no closing quote")) };
        self.at += 1;
        let mut out = Vec::new();
        room(&mut out, span)?;
        loop {
            let run = self.at;
            while matches!(self.peek(), Some(b) if b != b'"' && b != b'\\' && b >= 0x20) {
                self.at += 1;
            }
            if let Err(e) = core::str::from_utf8(&self.text[run..self.at]) {
                self.at = run + e.valid_up_to(); // a run ends at an ASCII byte: cut short is as bad as wrong
                return Err(self.error("a string that is not UTF-8"));
            }
            out.extend_from_slice(&self.text[run..self.at]);
            match self.peek() {
                Some(b'"') => {
                    self.at += 1;
                    break;
                }
                Some(b'\\') => {
                    let c = self.escape()?;
                    let mut utf8 = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
                }
                _ => return Err(self.error("a control character in a string")), // (span saw the closing quote)
            }
        }
        // every run was UTF-8, and every escape a character
        Ok(String::from_utf8(out).unwrap_or_default())
    }

    /// How many bytes lie between the opening quote here and its closing quote, None when it has none.
    fn span(&self) -> Option<usize> {
        let mut i = self.at + 1;
        loop {
            match self.text.get(i)? {
                b'"' => return Some(i - self.at - 1),
                b'\\' => i += 2,
                _ => i += 1,
            }
        }
    }

    /// The character of the escape at the backslash here; an error names the backslash.
    fn escape(&mut self) -> Result<char, Error> {
        let at = self.at;
        self.at += 2;
        let c = match self.text[at + 1] {
            b'"' => Ok('"'),
            b'\\' => Ok('\\'),
            b'/' => Ok('/'),
            b'b' => Ok('\u{8}'),
            b'f' => Ok('\u{c}'),
            b'n' => Ok('\n'),
            b'r' => Ok('\r'),
            b't' => Ok('\t'),
            b'u' => self.unicode_escape(),
            _ => Err("an unknown escape"),
        };
        c.map_err(|what| {
            self.at = at;
            self.error(what)
        })
    }

    /// The character of a `\u` escape whose `\u` was just read (a surrogate pair is one character); what is wrong
    /// with it (the caller places it).
    fn unicode_escape(&mut self) -> Result<char, &'static str> {
        let first = self.hex4()?;
        let code = if (0xd800..0xdc00).contains(&first) {
            if !self.text[self.at..].starts_with(b"\\u") {
                return Err("a high surrogate without its low one");
            }
            self.at += 2;
            let second = self.hex4()?;
            if !(0xdc00..0xe000).contains(&second) {
                return Err("a high surrogate without its low one");
            }
            0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00)
        } else {
            first
        };
        char::from_u32(code).ok_or("a lone low surrogate")
    }
}
