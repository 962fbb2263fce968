"""What an embedder may legally do, met with the same answer on both engines and never a hang: fork while another
thread makes the first load, capabilities that run harnesses (nested runs end by their caller's deadline), a
linker that revokes a capability at run time, host exceptions that cannot be printed, small thread stacks, and
tool arguments that are not bytes. Each was found by a review of the embedding API."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from berm_host.backend import RunRequest
from berm_host.declaration import MAX_TIMEOUT
from berm_host.engine import Engine
from berm_host.linker import Capability, CapabilityError, Linker
from berm_host.running import MAX_NESTED_RUNS, NESTED_DETAIL
from berm_host.traps import HostError, Trap, TrapKind
from tests.bounded import GRACE, ends_within
from tests.guests import capability_relay_elf, raw_harness_elf

KINDS = ("aot", "interp")
#: A deadline no test waits for (the longest an Engine takes): a run that ends at all under it ended by another's.
NEVER = MAX_TIMEOUT


@pytest.fixture(scope="module")
def elf() -> bytes:
    return capability_relay_elf()


def harness(elf: bytes, kind: str, tmp_path, linker: Linker | None = None, deadline: float = 10.0):
    return Engine(kind=kind, cache_dir=tmp_path, deadline=deadline).load(elf).harness(linker)


def test_a_fork_while_another_thread_makes_the_first_load_leaves_the_child_working(tmp_path, elf):
    """The core held its watchdog's start lock across pthread_create, and its fork handlers did not cover it: a
    child forked meanwhile inherited the lock held and hung at its first load (5 of 10 trials of this script). A
    child forked while another thread was inside dlopen inherited the dynamic loader's lock held, and hung in its
    own dlopen (1 of 6 trials in a CI run): the fork handlers also wait for the core's loads and unloads."""
    (tmp_path / "guest.elf").write_bytes(elf)
    script = textwrap.dedent(f"""
        import os, threading, time
        import berm_host.aot.backend  # imported first: a fork during an import leaves the child's import stuck
        from berm_host.engine import Engine
        from berm_host.traps import Trap
        ELF, CACHE = {str(tmp_path / "guest.elf")!r}, {str(tmp_path / "cache")!r}
        Engine(kind="interp").load(ELF)  # imports done; the watchdog is not started yet
        stop, children = [], []
        def forker():
            while not stop:
                pid = os.fork()
                if pid == 0:  # the child's first translated run starts its own watchdog
                    try:
                        Engine(cache_dir=CACHE, deadline=0.2).load(ELF).harness().call("spin")
                    except Trap:
                        os._exit(0)
                    os._exit(2)
                children.append(pid)
        for trial in range(10):
            if (pid := os.fork()) == 0:  # each trial in a process whose watchdog has not started
                thread = threading.Thread(target=forker)
                thread.start()
                time.sleep(0.002)
                Engine(cache_dir=CACHE).load(ELF)  # starts the watchdog while the other thread forks
                stop.append(1)
                thread.join()
                hung = 0
                for child in children:
                    end = time.monotonic() + 10
                    while not os.waitpid(child, os.WNOHANG)[0]:
                        if time.monotonic() > end:
                            os.kill(child, 9)
                            os.waitpid(child, 0)
                            hung += 1
                            break
                        time.sleep(0.01)
                os._exit(min(hung, 100))
            assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, f"trial {{trial}}: a child hung"
        print("no child hung")
    """)
    Engine(cache_dir=tmp_path / "cache").load(elf)  # compiled here, once
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "no child hung" in proc.stdout, proc.stderr[-2000:]


#: The end of a script whose main thread forks while another thread is inside a load (``hold``: it set ``held`` and
#: waits for ``release``): the child loads the image itself and calls it; the parent lets the load finish, then
#: waits a minute at most for the child.
_FORK_DURING_A_LOAD = """
thread = threading.Thread(target=hold)
thread.start()
assert held.wait(60)
if (pid := os.fork()) == 0:
    try:
        os._exit(0 if child_engine().load(ELF).harness().call("ok") == "ok" else 2)
    except BaseException:
        os._exit(3)
release.set()
thread.join()
end = time.monotonic() + 60
while not (done := os.waitpid(pid, os.WNOHANG))[0]:
    if time.monotonic() > end:
        os.kill(pid, 9)
        raise SystemExit("the child hung")
    time.sleep(0.01)
print("child exit status", os.waitstatus_to_exitcode(done[1]))
"""


def _fork_during_a_load(tmp_path, elf: bytes, setup: str) -> None:
    (tmp_path / "guest.elf").write_bytes(elf)
    script = textwrap.dedent(f"""
        import os, threading, time
        import berm_host.aot.backend
        from berm_host.engine import Engine
        ELF, CACHE = {str(tmp_path / "guest.elf")!r}, {str(tmp_path / "cache")!r}
        held, release = threading.Event(), threading.Event()
    """) + textwrap.dedent(setup) + _FORK_DURING_A_LOAD
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "child exit status 0" in proc.stdout, (proc.stdout + proc.stderr)[-2000:]


def test_a_child_forked_while_another_thread_compiles_does_not_wait_on_the_cache_lock(tmp_path, elf):
    """A flock belongs to the open file, which a forked child shares: the lock of the entry another thread was
    compiling outlived that compile while the child lived, and the child's own load of the image waited for it
    for ever (3 of 3 trials in a review's script). The child closes its copies of the cache's lock files."""
    _fork_during_a_load(tmp_path, elf, """
        def hold():  # a compile, paused as it starts: the entry's lock is held
            Engine(cache_dir=CACHE, on_compile=lambda line: held.set() or release.wait()).load(ELF)
        child_engine = lambda: Engine(cache_dir=CACHE)
    """)


def test_a_child_forked_while_another_thread_loads_on_the_same_engine_can_load(tmp_path, elf):
    """Engine.load holds the image's gate for the whole load: a child forked meanwhile inherited it held by a
    thread it does not have, and its own load of the image on that Engine waited for ever (83 of 100 children in
    a review's script). A child starts its Engines with fresh locks."""
    Engine(cache_dir=tmp_path / "cache").load(elf)  # compiled: the load below holds no cache lock
    _fork_during_a_load(tmp_path, elf, """
        engine = Engine(cache_dir=CACHE)
        facts = engine._facts
        def paused(data, digest):  # the load, paused inside its gate
            held.set()
            release.wait()
            return facts(data, digest)
        engine._facts = paused
        def hold():
            engine.load(ELF)
        def child_engine():
            engine._facts = facts
            return engine
    """)


def test_interrupts_landing_anywhere_in_loads_and_calls_leak_no_guest_memory_and_no_object(tmp_path, elf):
    """A KeyboardInterrupt is raised as soon as a C call returns: when one came as the core handed back a new
    region, image or object handle, nothing owned it yet, and it stayed for good (a 64 MiB region on the
    watchdog's list, a dlopen reference: 2,000 mappings in 15 s of interrupts every millisecond, in a review's
    script). The core now fills an owner the caller made first. Descriptors opened by the cache's Python code
    still can leak this way, as in any Python code (not counted here)."""
    (tmp_path / "guest.elf").write_bytes(elf)
    script = textwrap.dedent(f"""
        import gc, os, signal, threading, time
        from berm_host.engine import Engine
        ELF, CACHE = {str(tmp_path / "guest.elf")!r}, {str(tmp_path / "cache")!r}
        Engine(cache_dir=CACHE).load(ELF).harness().call("ok")
        inside, interrupts, stop = [], [0], []
        def on_sigint(signum, frame):  # raises only inside the try below (the test's own lines must go on)
            if inside:
                raise KeyboardInterrupt
        signal.signal(signal.SIGINT, on_sigint)
        def pester():
            while not stop:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.001)
        def mappings():
            with open("/proc/self/maps") as f:
                return sum(1 for _ in f)
        gc.collect()
        before = mappings()
        threading.Thread(target=pester, daemon=True).start()
        end = time.monotonic() + 4
        while time.monotonic() < end:
            try:
                inside.append(1)
                Engine(cache_dir=CACHE).load(ELF).harness().call("ok")
                inside.clear()
            except KeyboardInterrupt:
                inside.clear()
                interrupts[0] += 1
        stop.append(1)
        gc.collect()
        print("interrupts", interrupts[0], "mappings grew by", mappings() - before)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    words = proc.stdout.split()
    assert int(words[1]) > 100 and int(words[-1]) < 20, proc.stdout


def test_the_translated_engine_is_imported_when_an_engine_is_made_not_at_its_first_load():
    """A child forked while another thread was importing the translated engine at its first load waited for ever
    to import it itself (6 of 6 trials of a review's script): Python's lock on a module being imported stays held in
    the child. An Engine is usually made before threads start; an interpreting one imports none of it."""
    script = textwrap.dedent("""
        import sys
        from berm_host.engine import Engine
        Engine(kind="interp")
        assert "berm_host.aot.backend" not in sys.modules
        Engine(kind="aot")
        assert "berm_host.aot.backend" in sys.modules
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("outer", KINDS)
@pytest.mark.parametrize("inner", KINDS)
def test_a_run_started_by_a_capability_ends_by_its_callers_deadline(tmp_path, elf, outer, inner):
    """A 0.3 s invocation whose capability ran a harness of a 5 s engine took 5 s, on both engines: the nested run
    kept only its own deadline (the watchdog's, on translated code). Across engines too. The nested run's own
    deadline is one it would never reach: ending at all is ending by its caller's."""
    spinner = harness(elf, inner, tmp_path, deadline=NEVER)
    seen = []

    def cap(request: bytes) -> bytes:
        try:
            spinner.call("spin")
        except Trap as exc:
            seen.append(exc.kind)
        return b"back"

    linker = Linker()
    linker.define("x.cap", cap)
    caller = harness(elf, outer, tmp_path, linker, deadline=0.3)
    with pytest.raises(Trap) as info:  # back in the caller after its deadline: interrupted at the ecall
        ends_within(GRACE, lambda: caller.call("cap"))
    assert seen == [TrapKind.INTERRUPTED] and info.value.kind is TrapKind.INTERRUPTED


def test_the_first_translated_engine_made_by_an_interpreted_runs_capability_keeps_its_deadline(tmp_path, elf):
    """The interpreter handed its deadline to the translated core only when the core was already imported: a
    capability that made the process's first translated engine ran it to that engine's own deadline."""
    (tmp_path / "guest.elf").write_bytes(elf)
    Engine(cache_dir=tmp_path / "cache").load(elf)  # compiled here, once
    script = textwrap.dedent(f"""
        import sys, time
        from berm_host.engine import Engine
        from berm_host.linker import Linker
        from berm_host.traps import Trap
        assert "berm_host.aot._core" not in sys.modules
        ELF, CACHE = {str(tmp_path / "guest.elf")!r}, {str(tmp_path / "cache")!r}
        def cap(request):
            try:
                Engine(cache_dir=CACHE, deadline={NEVER}).load(ELF).harness().call("spin")
            except Trap:
                pass
            return b"back"
        linker = Linker()
        linker.define("x.cap", cap)
        try:
            Engine(kind="interp", deadline=0.3).load(ELF).harness(linker).call("cap")
        except Trap:
            print("ended")
    """)
    # the nested run's own deadline is never reached: a run that kept only that one spins until this timeout
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60 + GRACE)
    assert proc.returncode == 0 and proc.stdout.strip() == "ended", proc.stderr[-2000:]


def _calling_itself(elf: bytes, kind: str, tmp_path):
    """A harness whose capability x.cap calls its tool cap again, and the list each capability call appends to."""
    entered: list[int] = []

    def again(request):
        entered.append(len(entered))
        return h.call("cap").encode()

    linker = Linker()
    linker.define("x.cap", again)
    h = harness(elf, kind, tmp_path, linker)
    return h, entered


@pytest.mark.parametrize("kind", KINDS)
def test_runs_nested_in_host_calls_stop_at_the_same_depth_on_either_engine(tmp_path, elf, kind):
    """Found by a review: a capability that calls its harness again recursed until Python's recursion limit, which
    came at 166 runs interpreted and 245 translated. Both engines now refuse the run past MAX_NESTED_RUNS alike:
    it traps before running, as the host thread's stack exhausted."""
    h, entered = _calling_itself(elf, kind, tmp_path)
    with pytest.raises(Trap) as info:
        h.call("cap")
    text = str(info.value)  # each capability's run ended in the trap of the run it started
    assert len(entered) == text.count("x.cap: Trap: ") == MAX_NESTED_RUNS
    assert info.value.kind is TrapKind.HOST_CALL_FAILED
    assert f"x.cap: Trap: harness trapped in cap: guest stack exhausted ({NESTED_DETAIL}) in berm_tool_cap" in text


def test_a_nested_run_interrupted_fails_its_callers_host_call_with_the_same_text_on_either_engine(tmp_path, elf):
    """Found by a review: a capability whose nested run was interrupted, letting its Trap through, failed the
    caller's host call with a text that held where the interrupt struck, which differs by engine (``spin+0xa``
    translated, ``+0x8`` interpreted), though a failed host call is a trap the engines agree on."""
    texts = {}
    for kind in KINDS:
        inner = Engine(kind=kind, cache_dir=tmp_path, deadline=30.0).load(elf).harness(Linker())
        linker = Linker()
        linker.define("x.cap", lambda request, inner=inner: inner.call("spin").encode())
        with pytest.raises(Trap) as info:
            harness(elf, kind, tmp_path, linker, deadline=0.2).call("cap")
        assert info.value.kind is TrapKind.HOST_CALL_FAILED
        texts[kind] = str(info.value)
    assert texts["aot"] == texts["interp"]
    assert "x.cap: Trap: harness trapped in spin: guest was interrupted (deadline passed)" in texts["aot"]


@pytest.mark.parametrize("kind", KINDS)
def test_on_a_small_thread_stack_a_nested_run_is_refused_on_either_engine(tmp_path, elf, kind):
    """Found by a review: only translated runs were held to the host stack's floor, so on a thread of 64 KiB a
    capability calling its harness again ran 64 levels deep interpreted and none translated. Both engines now
    apply the core's one rule: on such a thread, all of it below the floor's margin, the first run runs and a run
    nested in its host call traps. (How deep larger stacks allow still depends on the engine's own use of them.)"""
    h, entered = _calling_itself(elf, kind, tmp_path)
    outcome = []

    def run():
        try:
            h.call("cap")
        except Trap as trap:
            outcome.append(trap)

    old = threading.stack_size(64 << 10)
    try:
        thread = threading.Thread(target=run)
        thread.start()
    finally:
        threading.stack_size(old)
    thread.join()
    assert len(entered) == 1 and len(outcome) == 1
    assert f"guest stack exhausted ({NESTED_DETAIL})" in str(outcome[0])


@pytest.mark.parametrize("kind", KINDS)
def test_more_integer_arguments_than_a0_to_a7_hold_is_a_host_error_on_either_engine(tmp_path, elf, kind):
    """Found by a review: translated code raised a ValueError, the interpreter a HostError."""
    backend = Engine(kind=kind, cache_dir=tmp_path).load(elf).backend
    with pytest.raises(HostError, match="at most 8 integer arguments fit a0..a7, not 9"):
        backend.run(RunRequest(entry=0, int_args=tuple(range(9))))


@pytest.mark.parametrize("fields, message", [
    ({"entry": 1 << 64}, r"the entry must be a guest address, an int in \[0, 2\*\*64\), not 18446744073709551616"),
    ({"entry": -4}, "the entry must be a guest address"), ({"entry": 4.0}, "the entry must be a guest address"),
    ({"args": "text"}, "the arguments must be bytes, not str"),
    ({"int_args": (1, "2")}, "the integer arguments must be ints, not str"),
    ({"int_args": (0.0,)}, "the integer arguments must be ints, not float"),
    # found by a review: an OverflowError, or a ValueError once the guest had run (its capabilities called)
    ({"deadline": 10 ** 400}, "the deadline must be a time.monotonic"), ({"deadline": "5"}, "the deadline must be"),
    ({"deadline": float("nan")}, "the deadline must be"), ({"max_result": -1}, "the most result bytes must be"),
    ({"snapshot": ((0, -1),)}, "a snapshot range must be"), ({"snapshot": ((0, 1 << 40),)}, "a snapshot range"),
    ({"snapshot": ((1 << 64, 1),)}, "a snapshot range must be"), ({"snapshot": ((0, 1, 2),)}, "a snapshot range")])
def test_a_request_no_guest_could_run_with_is_a_host_error(fields, message):
    """Found by a review: translated code raised cffi's OverflowError or a TypeError (a region taken and not given
    back), where the interpreter trapped at the entry, or ran with text for arguments."""
    with pytest.raises(HostError, match=message):
        RunRequest(**{"entry": 0x10000, **fields})


def test_a_requests_arguments_are_its_own_bytes():
    """Found by a review: a strided memoryview the request took broke the interpreter's copy into guest memory (a
    BufferError where translated code ran), and a bytearray could change while a guest read it."""
    given = bytearray(b"abcdef")
    request = RunRequest(entry=0x10000, args=memoryview(given)[::2])
    given[0] = ord("z")
    assert type(request.args) is bytes and request.args == b"ace"


@pytest.mark.parametrize("kind", KINDS)
def test_a_linker_that_is_not_a_linker_is_refused_before_any_call(tmp_path, elf, kind):
    """Found by a review: translated code raised an AttributeError at every call, the interpreter only at a
    capability call; an empty Linker given was swapped for another, so capabilities defined on it later were lost."""
    image = Engine(kind=kind, cache_dir=tmp_path).load(elf)
    for wrong in (5, "linker", object()):
        with pytest.raises(HostError, match="the linker must be a berm_host.Linker, not"):
            image.harness(wrong)
    linker = Linker()
    h = image.harness(linker)
    linker.define("x.cap", lambda request: b"late")
    assert h.call("cap") == "late"


class Revocable(Linker):
    revoked = False

    def lookup(self, number):
        return None if self.revoked else super().lookup(number)


@pytest.mark.parametrize("kind", KINDS)
def test_a_linker_that_overrides_lookup_is_obeyed(tmp_path, elf, kind):
    """Translated code looked capabilities up in the linker's table behind its back: one revoked at run time was
    still served (the interpreter refused it)."""
    linker = Revocable()
    linker.define("x.cap", lambda request: b"secret")
    h = harness(elf, kind, tmp_path, linker)
    assert h.call("cap") == "secret"
    linker.revoked = True
    with pytest.raises(Trap) as info:
        h.call("cap")
    assert info.value.kind is TrapKind.UNKNOWN_HOST_CALL


class AnswersEverything(Linker):
    """Answers every number it does not define with an error reply, instead of leaving it to trap."""

    def lookup(self, number):
        return super().lookup(number) or Capability("denied", self.deny)

    @staticmethod
    def deny(request):
        raise CapabilityError("not granted")


@pytest.mark.parametrize("kind", KINDS)
def test_a_linker_that_answers_every_number_is_never_asked_for_a_core_call(tmp_path, kind):
    """Found by a review: translated code asked the linker for berm.log's number before serving it as a log line,
    so a linker that answered every number took the line (an error reply, nothing logged); the interpreter serves
    core calls before asking any linker."""
    elf = raw_harness_elf(r"""
        static char line[] = "from the guest";
        Pair berm_tool_log(void) { ecall2(LOG, (u64)line, sizeof line - 1); Pair p = {(u64)line, 4}; return p; }
        """, ("log",))
    lines = []
    h = Engine(kind=kind, cache_dir=tmp_path, log=lambda name, line: lines.append(line)).load(elf).harness(
        AnswersEverything())
    assert h.call("log") == "from" and lines == [b"from the guest"]


class Unprintable(CapabilityError):
    def __str__(self):
        raise RuntimeError("str boom")


class UnprintableBug(Exception):
    def __str__(self):
        raise RuntimeError("str boom")


def _raise(exc_type):
    def cap(request: bytes) -> bytes:
        raise exc_type()
    return cap


class UndecodableBug(Exception):
    def __str__(self):
        return "no file b\udcff"  # a name read with surrogateescape


class _EncodeRaises(str):
    def encode(self, *args, **kwargs):
        raise ValueError("encode boom")


class TextOfItsOwnBug(Exception):
    def __str__(self):
        return _EncodeRaises("a text of its own")  # whose encode raised: escaped the interpreter (found by a review)


class TextOfItsOwn(CapabilityError):
    def __str__(self):
        return _EncodeRaises("a text of its own")


@pytest.mark.parametrize("raised, outcome", [
    (Unprintable, "E:(its message could not be read)"),
    (UnprintableBug, "host call failed: x.cap: UnprintableBug: (its message could not be read)"),
    (UndecodableBug, "host call failed: x.cap: UndecodableBug: no file b\\udcff"),  # the message encodes as UTF-8
    (TextOfItsOwn, "E:a text of its own"),
    (TextOfItsOwnBug, "host call failed: x.cap: TextOfItsOwnBug: a text of its own"),
])
def test_an_exception_that_cannot_be_printed_is_described_alike(tmp_path, elf, raised, outcome):
    """Its __str__'s own RuntimeError escaped the interpreter, and translated code made a trap of another text
    (a CapabilityError's error reply became a trap on both)."""
    answers = set()
    for kind in KINDS:
        linker = Linker()
        linker.define("x.cap", _raise(raised))
        try:
            answers.add(harness(elf, kind, tmp_path, linker).call("cap"))
        except Trap as exc:
            answers.add(str(exc.info).split(" in ")[0])
    assert answers == {outcome}


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_on_a_small_thread_stack(tmp_path, elf, kind):
    """On a 64 KiB thread (legal: threading.stack_size's minimum is 32 KiB) every translated run trapped "the host
    thread's stack is exhausted (runs nested in host calls)": no run was nested, and a first run does not grow
    the thread's stack (translated code has a stack of its own)."""
    h = harness(elf, kind, tmp_path)
    out = []
    previous = threading.stack_size(64 << 10)
    try:
        thread = threading.Thread(target=lambda: out.append(h.call("ok")))
        thread.start()
        thread.join(30)
    finally:
        threading.stack_size(previous)
    assert out == ["ok"]


@pytest.mark.parametrize("kind", KINDS)
def test_tool_arguments_must_be_text_or_bytes(tmp_path, elf, kind):
    """``bytes(5)`` is five zero bytes: an int passed as arguments reached the guest as NULs."""
    h = harness(elf, kind, tmp_path)
    with pytest.raises(HostError, match="not valid UTF-8 text or bytes"):
        h.call("ok", 5)
    assert h.call("ok", memoryview(b"abc")) == "ok" and h.call("ok", bytearray(b"x")) == "ok"


def test_a_run_past_the_nesting_limit_entered_off_a_function_is_described_alike(tmp_path, elf):
    """Found by a review: a run past MAX_NESTED_RUNS entered where no function starts was, translated, the nesting
    trap, and interpreted, the bad entry's. Both check the depth first (nothing runs either way)."""
    seen = {}
    for kind in KINDS:
        traps: list = []

        def again(request):
            entered.append(len(entered))
            if len(entered) < MAX_NESTED_RUNS:
                return h.call("cap").encode()
            backend = h.image.backend
            traps.append(backend.run(RunRequest(entry=h.image.program.symbol("berm_tool_cap") + 2)).trap)
            return b""

        entered: list[int] = []
        linker = Linker()
        linker.define("x.cap", again)
        h = harness(elf, kind, tmp_path, linker)
        h.call("cap")
        (trap,) = traps
        seen[kind] = (trap.kind, trap.pc, trap.addr, trap.detail)
    assert seen["aot"] == seen["interp"]
    assert seen["aot"][0] is TrapKind.STACK_EXHAUSTED and seen["aot"][3] == NESTED_DETAIL
