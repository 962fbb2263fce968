"""``berm.http.fetch``: one HTTP(S) request to a host the declaration lists, through ``http.client``.

The host check is a comparison the guest cannot influence: the URL's host, lower-cased and without one trailing
dot, must equal an entry (normalised the same way) or, when it is a name and not an address, end in ``.suffix``
for an entry ``*.suffix`` (subdomains only, never the bare suffix). Only http and https; no credentials in the
URL; the guest may not set ``Host``, ``Content-Length`` or ``Transfer-Encoding`` (a forged Host would reach other
virtual hosts behind an allowed address). Redirects are returned as they are, never followed. A timer shuts the
socket down when the call's time is up, so neither a slow server nor a trickle of bytes outlasts the timeout, and
connecting happens in a helper thread the call stops waiting for, so neither does a hanging resolver. Bodies over
``BODY_CAP`` are refused. Header values travel as UTF-8 both ways (ABI.md: strings are UTF-8), and each pair the
guest gives is sent as given, a name given twice included.
"""

from __future__ import annotations

import http.client
import ipaddress
import os
import re
import socket
import ssl
import threading
from collections.abc import Iterable
from urllib.parse import quote, urlsplit

from berm_abi.errors import BermError
from berm_abi.frames import encode_frame
from berm_host.linker import CapabilityError, CapabilityFn

from ._request import Deadline, capability, fields, text

HTTP_TIMEOUT = 30.0
BODY_CAP = 16 * 1024 * 1024
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}")
_FORBIDDEN_HEADERS = {"host", "content-length", "transfer-encoding"}
#: A folded line of a header value (obsolete, RFC 9112 §5.2): http.client keeps its CR LF and spaces in the value.
_FOLD = re.compile(r"\r?\n[ \t]+")
_DIGITS = re.compile(r"[0-9]+")
_HEX = re.compile(rb"[0-9A-Fa-f]+")
#: What a header value may not hold (RFC 9110 §5.5: visible characters, spaces and tabs): CR, LF and NUL split
#: the request, and a vertical tab or form feed is a separator to some lenient servers and proxies (a review).
_CONTROL_IN_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_HOST_CHARS = re.compile(r"[a-z0-9.*:_-]+|\[[0-9a-f:.]+\]")
#: A host name as the resolver may be asked for it (an IPv6 address is checked apart).
_RESOLVER_NAME = re.compile(r"[a-z0-9._-]+")
#: Methods that carry a body, so that an empty one is sent as ``Content-Length: 0``: http.client's own
#: ``request()`` does so for these (its ``_METHODS_EXPECTING_BODY``, a private name, so not imported).
_BODY_METHODS = frozenset({"PATCH", "POST", "PUT"})


class HostListError(BermError):
    """A declared host entry is not a host name, an address, or ``*.`` followed by a host name."""


def normalize_host(host: str) -> str:
    host = host.strip().lower()
    return host[:-1] if host.endswith(".") else host


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


class HostList:
    """The hosts a declaration allows: exact names, and ``*.suffix`` for any subdomain of ``suffix``."""

    def __init__(self, hosts: Iterable[str]):
        self.exact: set[str] = set()
        self.suffixes: set[str] = set()
        for entry in hosts:
            host = normalize_host(entry)
            name = host.removeprefix("*.")
            if not host or not _HOST_CHARS.fullmatch(host) or "*" in name or (
                    not name.startswith("[") and "" in name.split(".")):  # an empty label: "*..", "a..b"
                raise HostListError(f"bad host entry {entry!r}{_why_not(host)}")
            if ":" in name and not _is_ipv6(name.strip("[]")):  # "host:port", never matched (found by a review)
                raise HostListError(f"bad host entry {entry!r}: not a host name or address (no port may be listed: "
                                    "a listed host is reached on any port)")
            if name.startswith("[") and not _is_ipv6(name[1:-1]):  # "[cafe]" granted the DNS name cafe (a review)
                raise HostListError(f"bad host entry {entry!r}: brackets hold an IPv6 address")
            if host.startswith("*."):
                self.suffixes.add(host[1:])  # ".example.org"
            else:
                self.exact.add(host.strip("[]"))
        self.entries = tuple(sorted(self.exact) + sorted("*" + s for s in self.suffixes))

    def allows(self, host: str) -> bool:
        """Whether ``host``, in the form the resolver is asked for it (``resolver_form``), is listed."""
        try:
            host = normalize_host(resolver_form(host))
        except UnicodeError:
            return False
        if host in self.exact:
            return True
        return not _is_address(host) and any(host.endswith(s) and len(host) > len(s) for s in self.suffixes)


def _why_not(host: str) -> str:
    """What a refused host entry is instead of a host, when that is plain (a review: only "bad host entry")."""
    if "/" in host:
        return ": a host name or address, not a URL"
    if not host.isascii():
        try:
            return f": a name that is not ASCII is listed in the form the resolver is asked for, " \
                   f"{resolver_form(host)!r}"
        except UnicodeError:
            return ": not a host name IDNA can write in ASCII"
    return ""


def _is_address(host: str) -> bool:
    """Whether the system's resolver reads ``host`` as an address: an address is matched exactly, never as a
    "subdomain" of a wildcard. That includes IPv4's short and numeric forms, which ``ipaddress`` calls names and
    glibc connects to: "127.1" is 127.0.0.1, so "*.1" let it through (found by a hostile review)."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    try:
        socket.inet_aton(host)
        return True
    except OSError:
        return False


def resolver_form(host: str) -> str:
    """``host`` as the resolver is asked for it: the ASCII form the IDNA codec makes of a name, which is what
    ``socket`` looks up (a UnicodeError when it makes none). Matched in any other form, "１２７.1" (fullwidth
    digits) was a name under "*.1", and the resolver connected it to 127.0.0.1 (found by a hostile review)."""
    return host.encode("idna").decode("ascii")


DEFAULT_PORTS = {"http": 80, "https": 443}


def _target(url: str, hosts: HostList) -> tuple[str, str, int, str]:
    """(scheme, host, port, request target) of an allowed URL, or a CapabilityError saying why not."""
    if any(ord(c) <= 0x20 or ord(c) == 0x7F or c == "\\" for c in url):
        raise CapabilityError("URL contains whitespace, control characters or a backslash")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise CapabilityError(f"bad URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise CapabilityError(f"only http and https URLs are allowed, not {scheme or 'no scheme'!r}")
    if parts.username is not None or parts.password is not None:
        raise CapabilityError("credentials in the URL are not allowed")
    if not parts.hostname:
        raise CapabilityError("URL has no host")
    try:
        host = resolver_form(parts.hostname)
    except UnicodeError as exc:
        raise CapabilityError(f"bad host name: {exc}") from None
    if not _RESOLVER_NAME.fullmatch(host) and not _is_ipv6(host):  # IDNA makes a space of U+00A0 and others, which
        raise CapabilityError(f"bad host name {host[:80]!r}")  # a wildcard let through to http.client (a review)
    if not hosts.allows(host):
        raise CapabilityError(f"host {host!r} is not in this harness's hosts")
    path = parts.path or "/"
    # Always an explicit port: given none, http.client splits one off the host itself, and the bare IPv6 address
    # "::1:8080" (listed as [::1:8080]) would become the unlisted address ::1, port 8080.
    port = port if port is not None else DEFAULT_PORTS[scheme]
    target = path + (f"?{parts.query}" if parts.query else "")
    # As browsers send it: a character past ASCII as its UTF-8 bytes, percent-encoded (http.client raised a codec
    # error, and only once connected: found by a review).
    return scheme, normalize_host(host), port, "".join(c if c.isascii() else quote(c) for c in target)


class _HeaderLines:
    """A response's stream, noting a line that holds a carriage return other than its end's: the header parser
    takes one for a line break, so a value holding one became two headers, the second of the server's making, a
    Content-Length that framed the body included (found by a review). Everything else goes to the stream."""

    def __init__(self, fp):
        self._fp = fp
        self.bare_cr = False

    def readline(self, limit: int = -1) -> bytes:
        line = self._fp.readline(limit)
        if b"\r" in line.rstrip(b"\r\n"):
            self.bare_cr = True
        return line

    def __getattr__(self, name: str):
        return getattr(self._fp, name)


class _Response(http.client.HTTPResponse):
    """http.client's response, with the interim (1xx) responses before the final one read past, as RFC 9110 §15.2
    says a client must: http.client reads past 100 Continue only, and took a 103 Early Hints for the final response,
    its status and headers returned and the real response lost (found by a review). 101 ends the exchange. Chunk
    sizes are read strictly. (Both override methods of http.client's own, CPython 3.11's, that it does not document.)"""

    def __init__(self, sock, *args, **kwargs):
        super().__init__(sock, *args, **kwargs)
        self.fp = _HeaderLines(self.fp)

    def _read_status(self):
        while True:
            version, status, reason = super()._read_status()
            if not 102 <= status < 200:  # 100: begin() reads past it itself
                return version, status, reason
            http.client.parse_headers(self.fp)  # the interim response's headers, dropped

    def _read_next_chunk_size(self) -> int:
        """A chunk's size, hex digits only: http.client read it with int(x, 16), which took "0x5", "+5" and "1_0"
        (found by a review)."""
        line = self.fp.readline(http.client._MAXLINE + 1)
        size = line.split(b";", 1)[0].strip(b" \t\r\n")
        if len(line) > http.client._MAXLINE or not _HEX.fullmatch(size):
            self._close_conn()
            raise CapabilityError(f"malformed response framing: a chunk size of {size[:20]!r}")
        return int(size, 16)


def _abort(watch: socket.socket) -> None:
    try:
        watch.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _watch(conn: http.client.HTTPConnection) -> socket.socket:
    """A descriptor of the connection's socket that only the deadline's timer uses, and that is closed only once the
    timer has ended. The timer shut the connection's own descriptor down, which http.client closes itself when a
    read fails (as the shutdown makes it): its number could be reused by then, and the shutdown reach another
    socket (found by a review)."""
    return socket.socket(fileno=os.dup(conn.sock.fileno()))


def _connect(conn: http.client.HTTPConnection, deadline: Deadline) -> None:
    """Resolve, connect (and for https, shake hands) in a helper thread, so that a resolver that hangs cannot hold
    the call past its deadline. A connection that completes after the call gave up is closed by the helper."""
    done = threading.Event()
    lock = threading.Lock()
    state: dict = {}

    def work() -> None:
        try:
            conn.connect()
        except BaseException as exc:  # handed to the caller
            state["error"] = exc
        with lock:
            if state.get("abandoned"):
                conn.close()
        done.set()

    threading.Thread(target=work, name="berm-http-connect", daemon=True).start()
    if not done.wait(max(deadline.remaining(), 0.0)):
        with lock:
            state["abandoned"] = True
        raise TimeoutError(f"took longer than {deadline.seconds:g} s to connect")
    if "error" in state:
        raise state["error"]


def _unfolded(value: str) -> str:
    """A header value on one line: an obsolete folded continuation (CR LF then spaces) is one space (RFC 9112
    §5.2), so every rendered line stays ``name: value``."""
    return _FOLD.sub(" ", value)


def _received(value: str) -> str:
    """A received header value as text: http.client reads header bytes as Latin-1, which made a UTF-8 value two
    characters per byte, encoded twice on its way to the guest (found by a review). Bytes that are UTF-8 are read as
    such; others stay Latin-1, so what the guest gets is always UTF-8."""
    raw = value.encode("latin-1", "replace")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return value


def _send_request(conn: http.client.HTTPConnection, method: str, target: str, body: bytes,
                  headers: list[tuple[str, str]]) -> None:
    """The request, each header pair sent as given: a name given twice is sent twice (a dict kept its last value
    only: found by a review), and a value goes out as its UTF-8 bytes (http.client sent Latin-1)."""
    conn.putrequest(method, target, skip_accept_encoding=any(n.lower() == "accept-encoding" for n, _ in headers))
    for name, value in headers:
        conn.putheader(name, value.encode("utf-8"))
    if body or method.upper() in _BODY_METHODS:
        conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body or None)


def fetch(hosts: HostList, method: str, url: str, body: bytes, headers: list[tuple[str, str]], *,
          timeout: float = HTTP_TIMEOUT, cap: int = BODY_CAP) -> tuple[int, str, bytes]:
    if not _TOKEN.fullmatch(method):
        raise CapabilityError(f"bad method {method[:20]!r}")
    for name, value in headers:
        if not _TOKEN.fullmatch(name) or _CONTROL_IN_VALUE.search(value):
            raise CapabilityError(f"bad header {name[:40]!r}")
        if name.lower() in _FORBIDDEN_HEADERS:
            raise CapabilityError(f"the {name} header is set by the host")
    scheme, host, port, target = _target(url, hosts)
    deadline = Deadline.within_invocation(timeout)
    seconds = max(deadline.seconds, 0.001)  # a socket timeout of 0 would make it non-blocking
    conn = timer = watch = None
    try:
        if scheme == "https":
            conn = http.client.HTTPSConnection(host, port, timeout=seconds, context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(host, port, timeout=seconds)
        conn.response_class = _Response
        _connect(conn, deadline)
        watch = _watch(conn)
        timer = threading.Timer(deadline.check(), _abort, (watch,))
        timer.daemon = True
        timer.start()
        _send_request(conn, method, target, body, headers)
        resp = conn.getresponse()
        # a line that is no header ended them, and what followed (framing included) was dropped without a word
        if resp.msg.defects or resp.msg.get_payload() or resp.fp.bare_cr:
            raise CapabilityError("malformed response headers")
        _check_length(resp)
        data = bytearray()
        while chunk := resp.read1(65536):
            deadline.check()
            data += chunk
            if len(data) > cap:
                raise CapabilityError(f"response body is larger than the {cap // (1024 * 1024)} MiB cap")
        deadline.check()
        if resp.length:  # read1 ends quietly where the connection did, short of the Content-Length
            raise CapabilityError(f"the connection closed with {resp.length} bytes of the body missing")
        rendered = "".join(f"{_received(k)}: {_received(_unfolded(v))}\n" for k, v in resp.getheaders())
        return resp.status, rendered, bytes(data)
    except CapabilityError:  # what the timer's shutdown cut short may look malformed: a timeout is said as one
        deadline.check()
        raise
    except (http.client.HTTPException, ssl.SSLError, OSError, ValueError) as exc:
        deadline.check()
        if isinstance(exc, socket.gaierror):
            raise CapabilityError(f"cannot resolve {host}") from None
        raise CapabilityError(f"{type(exc).__name__}: {exc}") from None
    finally:
        if timer is not None:
            timer.cancel()
            timer.join()  # an _abort already running ends before its descriptor is closed
        if watch is not None:
            watch.close()
        if conn is not None:
            conn.close()


def _check_length(resp: http.client.HTTPResponse) -> None:
    """A CapabilityError for a Content-Length that does not say one length: http.client reads a body it cannot
    parse ("-1", 5,000 digits) to the connection's end, and the first of two differing ones only, so a body cut
    short came back as whole (found by a hostile review). RFC 9112 §6.3: both are unrecoverable errors. Nor is
    anything but digits one: http.client read "1_0" as 10 and "+3" as 3 (found by another). Nor is a
    Transfer-Encoding other than chunked understood."""
    codings = resp.msg.get_all("transfer-encoding")
    if codings and (len(codings) > 1 or codings[0].strip(" \t").lower() != "chunked"):
        # http.client framed "chunked, identity" by a Content-Length given with it, where RFC 9112 §6.3 reads to
        # the connection's end (found by a review); a coding it does not undo, it passed on encoded
        raise CapabilityError(f"malformed response framing: Transfer-Encoding {', '.join(codings)[:60]!r} (Berm "
                              "reads chunked only)")
    lengths = resp.msg.get_all("content-length")
    if lengths and not resp.chunked and (resp.length is None or len({v.strip(" \t") for v in lengths}) > 1
                                         or not all(_DIGITS.fullmatch(v.strip(" \t")) for v in lengths)):
        raise CapabilityError(f"malformed response framing: Content-Length {', '.join(lengths)[:60]!r}")


def capabilities(hosts: HostList, *, timeout: float = HTTP_TIMEOUT) -> dict[str, CapabilityFn]:
    """``berm.http.fetch`` limited to ``hosts``."""

    @capability("berm.http.fetch")
    def http_fetch(request: bytes) -> bytes:
        (method, url, body), pairs = fields(request, ("method", "url", "body"), pairs=True)
        headers = [(text(k, "header name"), text(v, "header value")) for k, v in pairs]
        status, rendered, data = fetch(hosts, text(method, "method"), text(url, "url"), body, headers,
                                       timeout=timeout)
        return encode_frame([status, rendered, data])

    return {"berm.http.fetch": http_fetch}
