/* berm_aot._checksum: the integrity check of code cache entries (berm_aot/cache.py), fast enough for every load.
 *
 * A cached load checks the whole translated object (about 1.2 MB for a 100 KB guest) against the checksum recorded
 * when it was built, to find an entry damaged on disk. SHA-256 took 0.7 ms of a 1.5 ms load on this machine
 * (1.7 GB/s with the SHA extensions); the check is about damage, not about an attacker (who could write the record
 * too: berm_aot/trust.py keeps everyone else out of the cache), so it is CRC-32C, the checksum storage formats use
 * for the same job, computed by the CPU's crc32 instruction where there is one.
 *
 * The instruction takes 3 cycles and can start one per cycle, so one running CRC would use a third of it: the data
 * is dealt into three lanes, each its own CRC-32C, whose chains run side by side. Byte j belongs to lane
 * (j / 8) % 3 (8-byte words dealt in turn), and the checksum is the three CRCs, lane 0 first, as 24 hex digits.
 * tests/test_checksum.py checks both paths against a Python implementation of that definition. Without the
 * instruction, a word at a time through eight tables ("slicing by 8"): twice SHA-256's speed here.
 *
 *   file(fd) -> str     the checksum of a regular file's bytes from offset 0 to the size fstat gives (pread: the
 *                       descriptor's offset is untouched; a file that shrinks meanwhile is read to its end)
 *   data(buffer) -> str the checksum of a bytes-like object
 *   portable(buffer) -> str  data() without the crc32 instruction, for the tests
 *
 * The GIL is released while a checksum runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h> /* first, as it asks */

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LANES 3
#define WORD 8
#define GROUP (LANES * WORD)
/* bytes read at a time: a whole number of groups, so every read starts at lane 0; small enough to stay in cache */
#define CHUNK (GROUP * 8192)
#define CRC32C_REFLECTED 0x82F63B78u /* the Castagnoli polynomial, bit-reversed */

/* table[0] advances a CRC by one byte; table[k][b] is the CRC of byte b followed by k zero bytes */
static uint32_t table[WORD][256];

static void make_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (c & 1 ? CRC32C_REFLECTED : 0);
        table[0][i] = c;
    }
    for (int k = 1; k < WORD; k++)
        for (int i = 0; i < 256; i++) table[k][i] = (table[k - 1][i] >> 8) ^ table[0][table[k - 1][i] & 0xff];
}

static uint32_t crc_byte(uint32_t crc, uint8_t b) { return (crc >> 8) ^ table[0][(crc ^ b) & 0xff]; }

/* The CRC after the 8 bytes at p, in one step. */
static uint32_t crc_word(uint32_t crc, const uint8_t *p) {
    uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
    return table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^ table[4][lo >> 24] ^
           table[3][p[4]] ^ table[2][p[5]] ^ table[1][p[6]] ^ table[0][p[7]];
}

/* The lanes' running CRCs (not yet complemented) after `n` more bytes of `p`, which starts at a group's start:
 * whole groups a word per lane, the rest a byte at a time. */
static void lanes_portable(uint32_t crc[LANES], const uint8_t *p, size_t n) {
    size_t whole = n - n % GROUP;
    for (size_t j = 0; j < whole; j += GROUP)
        for (int k = 0; k < LANES; k++) crc[k] = crc_word(crc[k], p + j + (size_t)k * WORD);
    for (size_t j = whole; j < n; j++) crc[(j / WORD) % LANES] = crc_byte(crc[(j / WORD) % LANES], p[j]);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_CRC_INSTRUCTION 1
__attribute__((target("sse4.2"))) static void lanes_instruction(uint32_t crc[LANES], const uint8_t *p, size_t n) {
    uint64_t a = crc[0], b = crc[1], c = crc[2];
    size_t whole = n - n % GROUP;
    for (size_t j = 0; j < whole; j += GROUP) {
        uint64_t w0, w1, w2;
        memcpy(&w0, p + j, WORD); /* the file's bytes in order: x86 is little-endian, as the instruction reads */
        memcpy(&w1, p + j + WORD, WORD);
        memcpy(&w2, p + j + 2 * WORD, WORD);
        a = __builtin_ia32_crc32di(a, w0);
        b = __builtin_ia32_crc32di(b, w1);
        c = __builtin_ia32_crc32di(c, w2);
    }
    crc[0] = (uint32_t)a, crc[1] = (uint32_t)b, crc[2] = (uint32_t)c;
    lanes_portable(crc, p + whole, n - whole); /* fewer than a group: byte by byte */
}
#else
#define HAVE_CRC_INSTRUCTION 0
#endif

static int use_instruction;

static void lanes(uint32_t crc[LANES], const uint8_t *p, size_t n, int portable) {
#if HAVE_CRC_INSTRUCTION
    if (use_instruction && !portable) {
        lanes_instruction(crc, p, n);
        return;
    }
#endif
    (void)portable;
    lanes_portable(crc, p, n);
}

static void start(uint32_t crc[LANES]) {
    for (int k = 0; k < LANES; k++) crc[k] = 0xFFFFFFFFu;
}

static PyObject *finish(const uint32_t crc[LANES]) {
    char hex[LANES * 8 + 1];
    for (int k = 0; k < LANES; k++) snprintf(hex + 8 * k, 9, "%08x", crc[k] ^ 0xFFFFFFFFu);
    return PyUnicode_FromStringAndSize(hex, LANES * 8);
}

static PyObject *checksum_of(PyObject *arg, int portable) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t crc[LANES];
    start(crc);
    Py_BEGIN_ALLOW_THREADS
    lanes(crc, view.buf, (size_t)view.len, portable);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return finish(crc);
}

static PyObject *data(PyObject *self, PyObject *arg) {
    (void)self;
    return checksum_of(arg, 0);
}

static PyObject *portable(PyObject *self, PyObject *arg) {
    (void)self;
    return checksum_of(arg, 1);
}

/* Reads stop at the size fstat gave: a file that grew without end (or /dev/zero) held the thread, deaf to
 * signals with the GIL released, for ever (found by a review). */
static PyObject *file(PyObject *self, PyObject *arg) {
    (void)self;
    int fd = PyObject_AsFileDescriptor(arg);
    if (fd < 0) return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    if (!S_ISREG(st.st_mode)) {
        errno = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    uint8_t *buf = malloc(CHUNK);
    if (!buf) return PyErr_NoMemory();
    uint32_t crc[LANES];
    start(crc);
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    off_t at = 0;
    size_t have = 0; /* bytes in buf, read from offset at - have: a chunk is hashed only once whole (or at the end) */
    for (;;) {
        size_t want = CHUNK - have;
        if ((uint64_t)(st.st_size - at) < want) want = (size_t)(st.st_size - at);
        ssize_t got = want ? pread(fd, buf + have, want, at) : 0;
        if (got < 0) {
            if (errno == EINTR) continue;
            err = errno;
            break;
        }
        at += got, have += (size_t)got;
        if (have == CHUNK || got == 0) {
            lanes(crc, buf, have, 0);
            have = 0;
        }
        if (got == 0) break;
    }
    Py_END_ALLOW_THREADS
    free(buf);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return finish(crc);
}

static PyMethodDef methods[] = {
    {"file", file, METH_O, "file(fd) -> the checksum of the file's bytes from offset 0 to its end"},
    {"data", data, METH_O, "data(bytes) -> the checksum of the bytes"},
    {"portable", portable, METH_O, "portable(bytes) -> data(bytes) computed without the crc32 instruction"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "berm_aot._checksum",
    "CRC-32C in three lanes: the integrity check of code cache entries (berm_aot/checksum.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__checksum(void) {
    make_tables();
#if HAVE_CRC_INSTRUCTION
    __builtin_cpu_init();
    use_instruction = __builtin_cpu_supports("sse4.2") != 0;
#endif
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "INSTRUCTION", use_instruction) < 0) Py_CLEAR(m);
    return m;
}
