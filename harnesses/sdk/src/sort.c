/* qsort as a heapsort: O(n log n) whatever the input (a guest sorting hostile data must not go quadratic), in
 * place, with no recursion and no allocation. */
#include "berm.h"

static void swap(unsigned char *a, unsigned char *b, size_t size) {
    for (size_t i = 0; i < size; i++) {
        unsigned char t = a[i];
        a[i] = b[i];
        b[i] = t;
    }
}

/* Move element `root` down the heap of the first `n` elements until neither child is larger. */
static void sift_down(unsigned char *base, size_t root, size_t n, size_t size,
                      int (*cmp)(const void *, const void *)) {
    for (;;) {
        size_t largest = root, left = 2 * root + 1, right = left + 1;
        if (left < n && cmp(base + left * size, base + largest * size) > 0) largest = left;
        if (right < n && cmp(base + right * size, base + largest * size) > 0) largest = right;
        if (largest == root) return;
        swap(base + root * size, base + largest * size, size);
        root = largest;
    }
}

void qsort(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *)) {
    unsigned char *bytes = base;
    if (n < 2 || size == 0) return;
    for (size_t i = n / 2; i-- > 0;) sift_down(bytes, i, n, size, cmp);
    for (size_t end = n - 1; end > 0; end--) {
        swap(bytes, bytes + end * size, size);
        sift_down(bytes, 0, end, size, cmp);
    }
}
