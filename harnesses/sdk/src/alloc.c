/* The heap allocator: size-class free lists over a bump pointer, bounds pulled from berm.heap.start/size the
 * first time anything allocates (a harness that never allocates never asks).
 *
 * Every block has a 16-byte header (capacity, state) so free/realloc know its size and can catch a double or
 * wild free, and so the heap can be walked block by block: blocks lie end to end from the heap's start to the
 * bump pointer, with no gaps. Small blocks (<= 4 KiB) come in power-of-two classes and go back to the list of the
 * largest class they hold; larger ones are rounded to 4 KiB and reused best-fit, a larger free block split (its
 * rest freed; once the heap's end is reached, a small allocation takes from a free block of a larger class, small
 * or large, split alike). The top block freed goes back to the bump pointer. When a request finds nothing, free
 * neighbours are merged (one walk of the heap) and the request tried again: guest memory is fresh for every
 * invocation, so this is the only compaction needed. Out of memory returns NULL. */
#include "berm.h"

#define HEADER 16u
#define MIN_CLASS_SHIFT 4u
#define MAX_CLASS_SHIFT 12u
#define CLASSES (MAX_CLASS_SHIFT - MIN_CLASS_SHIFT + 1)
#define LARGE_ALIGN 4096u
#define LIVE 0xb10cb10cb10c0001ull
#define FREE 0xb10cb10cb10c0002ull

typedef struct {
    uint64_t cap;   /* usable bytes after the header */
    uint64_t state; /* LIVE or FREE */
} header;

typedef struct block {
    struct block *next;
} block;

static bool ready;
static uintptr_t base, bump, end;
static block *small_free[CLASSES];
static block *large_free;

/* Used by the host shim so that each native invocation starts with a fresh heap, as a guest's does. */
void berm__heap_reset(void) {
    ready = false;
    base = bump = end = 0;
    memset(small_free, 0, sizeof small_free);
    large_free = NULL;
}

static bool init(void) {
    if (ready) return true;
    uint64_t start = berm_host_call(BERM_CALL_HEAP_START, 0, 0);
    uint64_t size = berm_host_call(BERM_CALL_HEAP_SIZE, 0, 0);
    base = bump = (uintptr_t)((start + 15) & ~(uint64_t)15);
    end = (uintptr_t)(start + size);
    if (bump > end) base = bump = end;
    ready = true;
    return true;
}

static header *header_of(void *ptr) { return (header *)((char *)ptr - HEADER); }

/* The class a request of `size` bytes takes from: the smallest that holds it. */
static unsigned class_of(size_t size) {
    unsigned shift = MIN_CLASS_SHIFT;
    while (((size_t)1 << shift) < size) shift++;
    return shift - MIN_CLASS_SHIFT;
}

/* The class a free small block of `cap` bytes serves: the largest it holds (a split's rest or a merged run need
 * not be a power of two; it keeps its exact capacity, so the heap stays walkable). */
static unsigned class_held(size_t cap) {
    unsigned shift = MIN_CLASS_SHIFT;
    while (((size_t)2 << shift) <= cap && shift < MAX_CLASS_SHIFT) shift++;
    return shift - MIN_CLASS_SHIFT;
}

static void *carve(size_t cap) {
    if (cap + HEADER > end - bump) return NULL;
    header *h = (header *)bump;
    bump += HEADER + cap;
    h->cap = cap;
    h->state = LIVE;
    return (char *)h + HEADER;
}

/* The free block `b`, taken off its list, handed out for `cap` bytes: what it holds beyond `cap` is split off and
 * freed when it can hold a block of its own (handed out whole, a block kept its whole size, and a small
 * allocation could not use it at all). */
static void *hand_out(block *b, size_t cap) {
    header *h = header_of(b);
    h->state = LIVE;
    if (h->cap >= cap + HEADER + (1u << MIN_CLASS_SHIFT)) {
        size_t rest = h->cap - cap - HEADER;
        h->cap = cap;
        header *tail = (header *)((char *)b + cap);
        *tail = (header){.cap = rest, .state = LIVE};
        free((char *)tail + HEADER);
    }
    return b;
}

/* The best-fitting free large block for `cap` bytes, split (hand_out), or NULL. Found by a review: with the heap's
 * end reached and 33 MB free in one large block, malloc(1) failed, and the OS harness's edit trapped after its
 * write had changed the file. */
static void *take_large(size_t cap) {
    block **best = NULL;
    for (block **link = &large_free; *link; link = &(*link)->next) {
        size_t have = header_of(*link)->cap;
        if (have >= cap && (!best || have < header_of(*best)->cap)) best = link;
    }
    if (!best) return NULL;
    block *b = *best;
    *best = b->next;
    return hand_out(b, cap);
}

/* A free block of the smallest class above `c` that has one, split for `cap` bytes (hand_out), else a free large
 * one, or NULL: for a small request once the heap's end is reached. Found by a review: only large blocks were
 * tried, and with 62 MB free in 4 KiB blocks (each kept apart by a live 16-byte one) malloc(16) failed. */
static void *take_larger(unsigned c, size_t cap) {
    for (unsigned k = c + 1; k < CLASSES; k++) {
        block *b = small_free[k];
        if (b) {
            small_free[k] = b->next;
            return hand_out(b, cap);
        }
    }
    return take_large(cap);
}

/* Puts a free block on the list it serves. */
static void list_free(header *h) {
    block *b = (block *)((char *)h + HEADER);
    if (h->cap <= ((size_t)1 << MAX_CLASS_SHIFT)) {
        unsigned c = class_held(h->cap);
        b->next = small_free[c];
        small_free[c] = b;
    } else {
        b->next = large_free;
        large_free = b;
    }
}

/* The header at `at`, a block's start below the bump pointer, checked: a guest's stray write over a header must
 * not send the heap walk outside the heap. */
static header *block_at(uintptr_t at) {
    header *h = (header *)at;
    if (bump - at < HEADER || (h->state != LIVE && h->state != FREE) || h->cap > bump - at - HEADER)
        berm_panic("heap corrupted: a block's header was overwritten");
    return h;
}

/* Merges every run of free neighbours into one block, rebuilding the free lists in one walk of the heap; a run
 * that ends at the bump pointer goes back to it. Returns whether anything was merged. Found by a review: freed
 * blocks were only ever reused at their own size or smaller, so a heap of freed neighbours could not serve one
 * request larger than each of them. */
static bool merge_free_neighbours(void) {
    bool merged = false;
    memset(small_free, 0, sizeof small_free);
    large_free = NULL;
    for (uintptr_t at = base; at < bump;) {
        header *h = block_at(at);
        uintptr_t next = at + HEADER + h->cap;
        if (h->state == FREE) {
            for (; next < bump && block_at(next)->state == FREE; next = at + HEADER + h->cap) {
                h->cap += HEADER + ((header *)next)->cap;
                merged = true;
            }
            if (next == bump) {
                bump = at;
                return true;
            }
            list_free(h);
        }
        at = next;
    }
    return merged;
}

static void *allocate(size_t size) {
    if (size <= ((size_t)1 << MAX_CLASS_SHIFT)) {
        unsigned c = class_of(size ? size : 1);
        size_t cap = (size_t)1 << (c + MIN_CLASS_SHIFT);
        block *b = small_free[c];
        if (!b) {
            void *fresh = carve(cap);
            return fresh ? fresh : take_larger(c, cap); /* the heap's end reached: from a larger free block */
        }
        small_free[c] = b->next;
        header_of(b)->state = LIVE;
        return b;
    }
    size_t cap = (size + LARGE_ALIGN - 1) & ~(size_t)(LARGE_ALIGN - 1);
    void *reused = take_large(cap);
    return reused ? reused : carve(cap);
}

void *malloc(size_t size) {
    if (!init() || size > ((size_t)1 << 40)) return NULL;
    void *fresh = allocate(size);
    return fresh || !merge_free_neighbours() ? fresh : allocate(size);
}

void free(void *ptr) {
    if (!ptr) return;
    header *h = header_of(ptr);
    if ((uintptr_t)h < HEADER || h->state != LIVE) berm_panic("free(): pointer not allocated or already freed");
    h->state = FREE;
    if ((uintptr_t)ptr + h->cap == bump) bump = (uintptr_t)h; /* the top block: back to the bump pointer */
    else list_free(h);
}

void *realloc(void *ptr, size_t size) {
    if (!ptr) return malloc(size);
    header *h = header_of(ptr);
    if (h->state != LIVE) berm_panic("realloc(): pointer not allocated or already freed");
    if (size <= h->cap) return ptr;
    /* The last block carved grows where it is: a buffer grown by a fixed step each time (not doubling) moved on
     * every step and ran the heap out with little live (found by a review: NULL at the 91st 8 KiB step of 32 MiB,
     * 745 KB live; Rust's heap grows its top block in place). */
    size_t grown = (size + LARGE_ALIGN - 1) & ~(size_t)(LARGE_ALIGN - 1);
    if ((uintptr_t)ptr + h->cap == bump && size > ((size_t)1 << MAX_CLASS_SHIFT) && size <= ((size_t)1 << 40) &&
        grown - h->cap <= end - bump) {
        bump += grown - h->cap;
        h->cap = grown;
        return ptr;
    }
    void *fresh = malloc(size);
    if (!fresh) return NULL;
    memcpy(fresh, ptr, h->cap);
    free(ptr);
    return fresh;
}

void *calloc(size_t count, size_t size) {
    if (size && count > ((size_t)-1) / size) return NULL;
    void *p = malloc(count * size);
    if (p) memset(p, 0, count * size);
    return p;
}
