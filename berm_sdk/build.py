"""``berm build``: a harness directory (harness.toml + C sources) → a checked harness ELF.

The SDK sources, the generated ``berm_calls.h`` and ``berm_entry.c`` and the author's ``*.c`` files (the
directory and its ``src/``) are compiled with the build profile (harnesses/sdk/profile.toml) in a temporary
directory and linked with the SDK's linker script. The result is then checked the way the host will read it:
the manifest parses and every declared tool is exported, relocations are present, and no F/D/CSR instruction is
reachable. Errors name the file, and the line when known.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
import tempfile
import tomllib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from berm_abi.errors import BermError
from berm_abi.text import escaped
from berm_aot.elf import read_elf
from berm_aot.image import ElfImage
from berm_aot.manifest import TOOL_PREFIX, Manifest, load_manifest, tool_exports
from berm_aot.program import Program

from .cache import SDK_DIR, cache_root, cached_dir
from .entry import ENTRY_NAME, entry_source
from .errors import BuildError
from .harness_toml import TOML_NAME, HarnessSpec, load_harness_toml, requests_problem
from .header import calls_header, write_calls_header
from .schemas import schema_problem
from .toolchain import GUEST_CFLAGS, Toolchain, ToolchainError, compile_object, guest_toolchain, link

#: Parallel compiler processes; the machines are small and shared.
JOBS = 2


@dataclass(frozen=True)
class Profile:
    opt: str
    cflags: tuple[str, ...]
    linker_script: Path


def load_profile(sdk: Path = SDK_DIR) -> Profile:
    path = sdk / "profile.toml"
    try:
        doc = tomllib.loads(path.read_text())
        return Profile(opt=doc["opt"], cflags=tuple(doc["cflags"]), linker_script=sdk / doc["linker_script"])
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise BuildError(f"{path}: the SDK's build profile is unreadable: {exc!r}") from None


#: Characters of a source file's name the guest compiler cannot write into its dependency file, and of the names of
#: the directories above it (a ``:`` or ``"`` there it takes).
_UNSPEAKABLE = (":", "\\", '"', "\n")
_UNSPEAKABLE_ABOVE = ("\\", "\n")
#: How the names of an author's sources end, C's and Rust's (harness.toml, Cargo.toml and .lock, manifest.json).
SOURCE_SUFFIXES = (".c", ".h", ".toml", ".lock", ".rs", ".json")


def sdk_sources(sdk: Path = SDK_DIR) -> list[Path]:
    return sorted((sdk / "src").glob("*.c"))


def sdk_headers(sdk: Path = SDK_DIR) -> list[Path]:
    """Every header an SDK source may include (berm.h, berm_recurring.h, its own): part of its objects' key."""
    return sorted([*sdk.glob("*.h"), *(sdk / "src").glob("*.h")])


def harness_sources(directory: Path) -> list[Path]:
    """The author's C files: ``*.c`` in the harness directory and under its ``src/``, each a regular file inside the
    directory. The walk follows no link to a directory but ``src`` itself, and that only to a place inside: a glob
    followed ``src`` anywhere (to / it walked the whole filesystem; into /proc it ended in an OSError traceback)."""
    root = directory.resolve()
    src = directory / "src"
    found = _c_names(directory, recurse=False)
    if os.path.lexists(src):
        _check_inside(root, src, "the directory of sources")
        if src.is_dir():
            found += _c_names(src, recurse=True)
    sources = sorted(set(found))
    for source in sources:
        _check_source(root, source)
    return sources


def _c_names(top: Path, *, recurse: bool) -> list[Path]:
    """Whatever under ``top`` is named ``*.c`` (a directory or a FIFO too: ``_check_source`` refuses those by name),
    descending into subdirectories when ``recurse``, never through a link. Hidden names are left out, as a shell's
    ``*.c`` leaves them: an editor's lock (Emacs's dangling link ``.#a.c``, there while a.c has unsaved edits)
    stopped the build (found by a review). A directory that cannot be listed is a BuildError naming it."""
    def refuse(exc: OSError) -> None:
        raise BuildError(f"{exc.filename or top}: cannot list the harness's sources: {exc.strerror or exc}")

    found: list[Path] = []
    for parent, dirs, files in os.walk(top, onerror=refuse):
        found += [Path(parent, name) for name in (*dirs, *files) if name.endswith(".c") and not name.startswith(".")]
        dirs[:] = [name for name in dirs if recurse and not name.startswith(".")]
    return found


def _resolved(path: Path) -> Path:
    try:
        return path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # RuntimeError: a loop of links
        raise BuildError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None


def _check_inside(root: Path, path: Path, what: str) -> Path:
    """``path`` with its links followed, which must lead inside the harness directory ``root``: the build reads the
    author's files, never what a link in a checked-out directory points at elsewhere."""
    resolved = _resolved(path)
    if not resolved.is_relative_to(root):
        raise BuildError(f"{path}: {what} leads outside the harness directory {root} (to {resolved})")
    return resolved


def _check_source(root: Path, source: Path) -> None:
    """A source is a regular file (after its links) inside the harness directory: the compiler reads a FIFO, a device
    or a link to /dev/zero until its timeout, stalling the build for minutes."""
    resolved = _check_inside(root, source, "the source")
    try:
        mode = resolved.stat().st_mode
    except OSError as exc:
        raise BuildError(f"{source}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise BuildError(f"{source}: not a regular file (a source is read from a regular file only)")


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a byte that is not UTF-8, read with surrogateescape
        return False
    return True


def check_output(out: Path, directory: Path) -> None:
    """Refuse to write the image of the harness in ``directory`` as one of its sources: a file inside it named like
    one (found by a review: ``-o h/tiny.c`` built, and tiny.c was the image; ``-o h/harness.toml`` too). ``out``'s
    own name is taken as given, its directories' links followed: install_image replaces a link, never writes
    through it."""
    where = out.absolute().parent.resolve() / out.name
    if where.is_relative_to(directory.resolve()) and where.name.endswith(SOURCE_SUFFIXES):
        raise BuildError(f"{out}: refusing to write the image over its own source (in the harness directory "
                         f"{directory}, a name ending {' '.join(SOURCE_SUFFIXES)} is a source's): name it .elf, or "
                         "write it elsewhere")


def _defined_tools(obj: Path) -> dict[str, bool]:
    """Tool names whose ``berm_tool_<name>`` a compiled object defines as a global or weak symbol, each with whether
    it is a function."""
    try:
        with obj.open("rb") as f:
            symtab = ELFFile(f).get_section_by_name(".symtab")
            if symtab is None:
                return {}
            return {s.name[len(TOOL_PREFIX):]: s["st_info"]["type"] == "STT_FUNC" for s in symtab.iter_symbols()
                    if s.name.startswith(TOOL_PREFIX) and s["st_shndx"] != "SHN_UNDEF"
                    and s["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK")}
    except (OSError, ELFError) as exc:
        raise BuildError(f"{obj}: cannot read the compiled object: {exc}") from None


def _line_in(source: Path, tool: str) -> str:
    text = source.read_text(errors="replace")
    match = re.search(rf"\b(BERM_TOOL\s*\(\s*{re.escape(tool)}\s*\)|{TOOL_PREFIX}{re.escape(tool)}\b)", text)
    return f"{source}:{text.count(chr(10), 0, match.start()) + 1}" if match else str(source)


def check_tools_defined(spec: HarnessSpec, objects: dict[Path, Path]) -> None:
    """Every declared tool has a function, and every tool function is declared. ``objects``: source → object."""
    defined: dict[str, Path] = {}
    for source, obj in objects.items():
        for tool, function in _defined_tools(obj).items():
            if not function:  # found by a review: "int berm_tool_t;" passed, and the image's check failed at the end
                raise BuildError(f"{_line_in(source, tool)}: {TOOL_PREFIX}{tool} is not a function (write "
                                 f"BERM_TOOL({tool}) {{ ... }})")
            if tool in defined:  # the linker would say only "duplicate symbol", of objects already deleted
                raise BuildError(f"{_line_in(source, tool)}: {TOOL_PREFIX}{tool} is defined twice: also at "
                                 f"{_line_in(defined[tool], tool)}")
            defined[tool] = source
    for tool in spec.tools:
        if tool.name not in defined:
            raise BuildError(f"{spec.where(tool.line)}: tool {tool.name!r} is declared but no source defines "
                             f"{TOOL_PREFIX}{tool.name} (write BERM_TOOL({tool.name}) {{ ... }})")
    declared = {t.name for t in spec.tools}
    for tool, source in sorted(defined.items()):
        if tool not in declared:
            raise BuildError(f"{_line_in(source, tool)}: {TOOL_PREFIX}{tool} is defined but {spec.path} "
                             f"declares no tool {tool!r}")


def _compile_all(sources: list[Path], work: Path, profile: Profile, include: tuple[Path, ...],
                 warnings: list[str] | None = None) -> dict[Path, Path]:
    tc = guest_toolchain()
    work.mkdir(exist_ok=True)
    jobs = {src: work / f"{i:03d}-{src.stem}.o" for i, src in enumerate(sources)}
    with ThreadPoolExecutor(max_workers=JOBS) as pool:
        futures = [pool.submit(compile_object, src, obj, opt=profile.opt, include=include, flags=profile.cflags,
                               toolchain=tc, warnings=warnings) for src, obj in jobs.items()]
        for future in futures:
            future.result()
    return jobs


def _sdk_objects(work: Path, profile: Profile) -> list[Path]:
    """The SDK compiled with ``profile``, from the cache when the same sources, header, flags and toolchain
    were compiled before. The SDK is most of every build, and it never depends on the harness."""
    sources = sdk_sources()

    def fill(staging: Path) -> None:
        for obj in _compile_all(sources, work / "sdk", profile, (SDK_DIR, work)).values():
            shutil.copyfile(obj, staging / obj.name)

    return sorted(cached_dir(cache_root() / "sdk-objects" / sdk_objects_key(guest_toolchain(), profile), fill)
                  .glob("*.o"))


def sdk_objects_key(tc: Toolchain, profile: Profile, sdk: Path = SDK_DIR) -> str:
    """What the SDK's objects are compiled from: the compiler (which one, not only its command: an upgrade keeps
    the command), flags, the generated host-call header, and every SDK source and header (berm_recurring.h was
    left out, and its objects outlived a change to it)."""
    digest = hashlib.sha256()
    for part in [*tc.cc, tc.identity(), *GUEST_CFLAGS, profile.opt, *profile.cflags, calls_header()]:
        digest.update(part.encode() + b"\0")
    for path in [*sdk_headers(sdk), *sdk_sources(sdk)]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:32]


def check_image(path: Path, harness: Path) -> tuple[ElfImage, Manifest]:
    """Read the built image as the host will: its manifest parses and names exported tools, it carries relocations,
    and its code decodes as RV64IMAC. A BuildError names ``harness`` (the directory built: ``path`` is in a build
    directory, gone or unfamiliar by the time the message prints) and says which check failed."""
    try:
        image = read_elf(path.read_bytes())
        manifest = load_manifest(image)
        # a C harness's were checked in harness.toml; a Rust crate writes its own manifest, and was taken with
        # capabilities = ["filesystem"], hosts = [""] or an undeclared berm_tool_ export (found by a review)
        for tool in manifest.tools:
            if problem := schema_problem(tool.parameters):
                raise BuildError(f"tool {tool.name!r}: parameters are not a JSON Schema: {problem}")
        if problem := requests_problem(manifest.requests):
            raise BuildError(problem)
        extra = sorted(set(tool_exports(image)) - {t.name for t in manifest.tools})
        if extra:  # the host would not offer it; in C, e.g. a library function whose name starts with berm_tool_
            raise BuildError(f"it exports {TOOL_PREFIX}{extra[0]}, which its manifest does not declare")
        if not image.relocations:
            raise BuildError("it carries no relocations (was it linked without --emit-relocs?)")
        Program.from_image(image)  # its functions and code, found as the host will
    except BermError as exc:
        raise BuildError(f"{harness}: the built image fails its own check: {exc}") from None
    return image, manifest


def verify_image(path: Path, spec: HarnessSpec) -> None:
    """``check_image``, and the image is the one harness.toml describes."""
    _, manifest = check_image(path, spec.path.parent)
    if [t.name for t in manifest.tools] != [t.name for t in spec.tools]:
        raise BuildError(f"{path}: the built manifest does not list the tools of {spec.path}")


def build_harness(directory: Path, out: Path | None = None, *, warn: Callable[[str], None] | None = None) -> Path:
    """Build the harness in ``directory`` into ``out`` (default ``./{name}.elf``); returns the path written.
    ``warn`` receives what a build that succeeds may still have to say: a tool with no description, and the
    compiler's warnings on the harness's own sources (an unused result, a sometimes-uninitialised variable)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise BuildError(f"{directory}: not a directory")
    toml = directory / TOML_NAME
    if os.path.lexists(toml):  # found by a review: a link to a file elsewhere was read (a source's was refused)
        _check_inside(directory.resolve(), toml, TOML_NAME)
    spec = load_harness_toml(toml)
    # Found by a review: a blank description was taken without a word. Said, not refused: a manifest's description
    # may be "" (the reader's default), and harness.toml has always taken one.
    for tool in spec.tools:
        if warn is not None and not tool.description.strip():
            warn(f"{spec.where(tool.line)}: tool {tool.name!r} has no description: an agent sees only its name")
    sources = harness_sources(directory.absolute())  # never a bare "-x.c": the compiler read that as a flag
    if not sources:
        raise BuildError(f"{directory}: no C sources (*.c in the directory or its src/)")
    for source in sources:  # zig cc then fails on its own dependency file, naming only that
        if any(c in source.name for c in _UNSPEAKABLE) or any(c in str(source.parent) for c in _UNSPEAKABLE_ABOVE):
            raise BuildError(f"{escaped(str(source), lines=False)}: the guest compiler cannot take a file name "
                             f"holding any of {' '.join(map(repr, _UNSPEAKABLE))}, or a directory name holding "
                             f"{' or '.join(map(repr, _UNSPEAKABLE_ABOVE))}: rename it")
        if not _utf8(source.name):  # the image's symbol table names it: its check failed, naming no file (a review)
            raise BuildError(f"{escaped(str(source), lines=False)}: a source's name must be UTF-8: rename it")
    out = Path(out) if out is not None else Path.cwd() / f"{spec.name}.elf"
    check_output(out, directory)
    profile = load_profile()
    with tempfile.TemporaryDirectory(prefix="berm-build-") as tmp:
        work = Path(tmp)
        write_calls_header(work)
        entry = work / ENTRY_NAME
        entry.write_text(entry_source(spec))
        include = (SDK_DIR, work, directory)
        warnings: list[str] = []
        own = _compile_all(sources, work / "own", profile, include, warnings)
        if warn is not None:
            for said in warnings:
                warn(said)
        check_tools_defined(spec, own)  # before compiling the SDK: a missing tool is the commonest mistake
        generated = _compile_all([entry], work / "entry", profile, include)
        objects = [*own.values(), *generated.values(), *_sdk_objects(work, profile)]
        try:
            linked = link(objects, work / "harness.elf", linker_script=profile.linker_script)
        except ToolchainError as exc:  # it named the objects, in a directory gone once the error shows (a review)
            said = str(exc)
            for source, obj in own.items():
                said = said.replace(str(obj), str(source))
            raise ToolchainError(said) from None
        verify_image(linked, spec)
        install_image(linked, out)
    return out


def install_image(built: Path, out: Path) -> None:
    """Put ``built`` at ``out`` whole or not at all (a copy beside it, renamed over it). What ``out`` names now
    must be a regular file, a symbolic link (replaced, never written through) or nothing: renaming over a FIFO or
    a device replaced it with the image. The copy is a new file of a name no one can guess (mkstemp: O_EXCL, mode
    0600 until it is whole): at a fixed name, another user who could write the directory planted a link there (the
    copy wrote through it, over a file of the builder's) or a file of their own (they edited the image after its
    checks)."""
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise _cannot_write(out, exc) from None
    else:
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            raise BuildError(f"cannot write {out}: it exists and is not a regular file")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # a prefix of its own, not out's name: a name of 242 to 255 bytes, legal itself, made the copy's too long
        fd, staged = tempfile.mkstemp(dir=out.parent, prefix=".berm-image-", suffix=".tmp")
    except OSError as exc:
        raise _cannot_write(out, exc) from None
    try:
        with os.fdopen(fd, "wb") as copy, built.open("rb") as image:
            shutil.copyfileobj(image, copy)
            os.fchmod(copy.fileno(), 0o666 & ~_umask())  # the mode a plain copy had
        os.replace(staged, out)
    except OSError as exc:
        raise _cannot_write(out, exc) from None
    finally:
        with contextlib.suppress(OSError):  # gone once renamed
            os.unlink(staged)


def _cannot_write(out: Path, exc: OSError) -> BuildError:
    return BuildError(f"cannot write {out}: {exc.strerror or exc}")


def _umask() -> int:
    """This process's umask, read without setting it (``os.umask`` changes it, for a moment, in every thread)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022
