/* Quicksort (median of three, insertion sort below 16 elements, recursion on the smaller side) of 256 PRNG
 * words, n times with fresh data. One unit of work = filling and sorting 256 elements. */
#include "kernel.h"

#define SORT_LEN 256

static uint32_t sort_arr[SORT_LEN];

static void insertion_sort(uint32_t *a, int lo, int hi) {
    for (int i = lo + 1; i <= hi; i++) {
        uint32_t v = a[i];
        int j = i - 1;
        while (j >= lo && a[j] > v) {
            a[j + 1] = a[j];
            j--;
        }
        a[j + 1] = v;
    }
}

static inline void swap(uint32_t *a, int i, int j) {
    uint32_t t = a[i];
    a[i] = a[j];
    a[j] = t;
}

static void quicksort(uint32_t *a, int lo, int hi) {
    while (hi - lo >= 16) {
        int mid = lo + (hi - lo) / 2;
        if (a[mid] < a[lo]) swap(a, mid, lo);
        if (a[hi] < a[lo]) swap(a, hi, lo);
        if (a[hi] < a[mid]) swap(a, hi, mid);
        uint32_t pivot = a[mid];
        int i = lo, j = hi;
        while (i <= j) {
            while (a[i] < pivot) i++;
            while (a[j] > pivot) j--;
            if (i <= j) swap(a, i++, j--);
        }
        if (j - lo < hi - i) {
            quicksort(a, lo, j);
            lo = i;
        } else {
            quicksort(a, i, hi);
            hi = j;
        }
    }
    insertion_sort(a, lo, hi);
}

uint64_t kernel_sort(uint64_t n) {
    uint64_t seed = 0x12345678deadULL;
    uint64_t sum = 0;
    for (uint64_t r = 0; r < n; r++) {
        for (int i = 0; i < SORT_LEN; i++)
            sort_arr[i] = (uint32_t)(kernel_rng(&seed) >> 32);
        quicksort(sort_arr, 0, SORT_LEN - 1);
        for (int i = 0; i < SORT_LEN; i++)
            sum = sum * 31 + (sort_arr[i] ^ (uint32_t)i);
    }
    return sum;
}
