//! The global allocator over the guest heap (ABI.md §5): size-class free lists over a bump pointer, the bounds
//! pulled from `berm.heap.start`/`berm.heap.size` the first time anything allocates.
//!
//! Blocks of at most 4 KiB come in power-of-two classes from 16 bytes and go back to their class's list; larger
//! ones are rounded up to 4 KiB and reused best-fit, a larger free block split (its rest freed). Rust hands
//! `dealloc` and `realloc` the layout, so blocks carry no header: the class follows from the size. The block at the
//! top of the bump pointer grows in place, so a growing `Vec` or `String` does not leave its old buffers behind,
//! and goes back to the bump pointer when freed; any block shrinks in place. The bytes the bump pointer skips to
//! align a block are freed as blocks of their own. When a request finds nothing, the free blocks are sorted by address,
//! free neighbours merged and cut again into the largest aligned blocks, and the request tried again: guest memory
//! is fresh for every invocation, so this is the only compaction needed. Out of memory is a null pointer (Rust then
//! panics: "memory allocation of N bytes failed"). A guest runs on one hart, so there are no locks.

use crate::calls::{host_call, HEAP_SIZE, HEAP_START};
use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::ptr::null_mut;

const MIN_SHIFT: u32 = 4;
const MAX_SHIFT: u32 = 12;
const CLASSES: usize = (MAX_SHIFT - MIN_SHIFT + 1) as usize;
const PAGE: usize = 1 << MAX_SHIFT;

/// A free block: the next one in its list, and (for large blocks) its size.
struct Free {
    next: *mut Free,
    size: usize,
}

struct State {
    bump: usize,
    end: usize,
    small: [*mut Free; CLASSES],
    large: *mut Free,
}

/// The allocator `berm::harness!` installs as the image's `#[global_allocator]`.
pub struct Heap(UnsafeCell<State>);

// SAFETY: a guest runs on a single hart; nothing else touches the heap while a tool runs.
unsafe impl Sync for Heap {}

impl Heap {
    pub const fn new() -> Heap {
        Heap(UnsafeCell::new(State { bump: 0, end: 0, small: [null_mut(); CLASSES], large: null_mut() }))
    }
}

impl Default for Heap {
    fn default() -> Heap {
        Heap::new()
    }
}

/// The bytes a block for `layout` occupies: its power-of-two class up to 4 KiB (at least the alignment, so a
/// class's blocks, carved at multiples of their size, are aligned), whole pages above.
fn block_size(layout: Layout) -> usize {
    let size = layout.size().max(layout.align()).max(1 << MIN_SHIFT);
    if size <= PAGE {
        size.next_power_of_two()
    } else {
        size.div_ceil(PAGE).saturating_mul(PAGE)
    }
}

/// The alignment a block of `size` bytes gets from the bump pointer: its size for a class, a page (or more, when the
/// layout asks) above.
fn block_align(size: usize, align: usize) -> usize {
    if size <= PAGE {
        size
    } else {
        align.max(PAGE)
    }
}

fn class(size: usize) -> usize {
    (size.trailing_zeros() - MIN_SHIFT) as usize
}

impl State {
    fn take_bump(&mut self, size: usize, align: usize) -> *mut u8 {
        if self.end == 0 {
            // SAFETY: both calls only return numbers.
            self.bump = unsafe { host_call(HEAP_START, 0, 0) } as usize;
            self.end = self.bump + unsafe { host_call(HEAP_SIZE, 0, 0) } as usize;
        }
        let start = (self.bump + align - 1) & !(align - 1);
        match start.checked_add(size) {
            Some(end) if end <= self.end => {
                let skipped = self.bump;
                self.bump = end;
                // SAFETY: the bytes skipped to align the block are the heap's, free, and multiples of 16 from a
                // multiple of 16 (the heap starts on a page, every block is a multiple of 16). Found by a review:
                // they were lost for the invocation, and sixteen-byte and 4 KiB blocks in turn filled a 64 MiB
                // heap with 32 MB live; freed, they left runs no merge could join past the lost bytes.
                unsafe { self.give_run(skipped, start) };
                start as *mut u8
            }
            _ => null_mut(),
        }
    }

    unsafe fn take_large(&mut self, size: usize, align: usize) -> *mut u8 {
        let (mut best, mut best_link): (*mut Free, *mut *mut Free) = (null_mut(), null_mut());
        let mut link: *mut *mut Free = &mut self.large;
        while !(*link).is_null() {
            let block = *link;
            let fits = (*block).size >= size && (block as usize) % align == 0;
            if fits && (best.is_null() || (*block).size < (*best).size) {
                (best, best_link) = (block, link);
            }
            link = &mut (*block).next;
        }
        if best.is_null() {
            return self.take_bump(size, block_align(size, align));
        }
        *best_link = (*best).next;
        // the rest goes back, whole pages (a page to the 4 KiB class): handed out whole, a block was freed at the
        // size asked for, and the rest was lost (found by a review: freeing 1 MiB and keeping 5 KB, over and over,
        // ran a 64 MiB heap out of memory with 1.4 MB live)
        let rest = (*best).size - size;
        if rest > 0 {
            self.give((best as *mut u8).add(size), rest);
        }
        best as *mut u8
    }

    unsafe fn take(&mut self, layout: Layout) -> *mut u8 {
        let size = block_size(layout);
        if size > PAGE {
            return self.take_large(size, layout.align());
        }
        let list = &mut self.small[class(size)];
        if list.is_null() {
            let fresh = self.take_bump(size, block_align(size, layout.align()));
            return if fresh.is_null() { self.split_larger(size) } else { fresh };
        }
        let block = *list;
        *list = (*block).next;
        block as *mut u8
    }

    /// A class's block cut from the smallest larger free block (the rest freed), once the bump pointer has reached
    /// the heap's end: without it, a small request failed with megabytes free in larger blocks.
    unsafe fn split_larger(&mut self, size: usize) -> *mut u8 {
        let list = match (class(size) + 1..CLASSES).find(|&c| !self.small[c].is_null()) {
            Some(c) => &mut self.small[c],
            None => &mut self.large,
        };
        let block = *list;
        if block.is_null() {
            return null_mut();
        }
        *list = (*block).next;
        self.give_run(block as usize + size, block as usize + (*block).size);
        block as *mut u8
    }

    /// Frees `size` bytes at `ptr`, one block (a class's or whole pages) aligned to its size; the top block goes back
    /// to the bump pointer.
    unsafe fn give(&mut self, ptr: *mut u8, size: usize) {
        if ptr as usize + size == self.bump {
            self.bump = ptr as usize;
            return;
        }
        let block = ptr as *mut Free;
        if size <= PAGE {
            let list = &mut self.small[class(size)];
            block.write(Free { next: *list, size });
            *list = block;
        } else {
            block.write(Free { next: self.large, size });
            self.large = block;
        }
    }

    /// Merges free neighbours: every free block taken off its list, the lot sorted by address, each run of adjacent
    /// blocks freed again as the largest aligned blocks it holds (a run ending at the bump pointer goes back to it).
    /// Returns whether anything was merged. Found by a review: freed blocks were only ever reused at their own size
    /// or smaller, so a heap of freed neighbours could not serve one request larger than each of them.
    unsafe fn merge_free_neighbours(&mut self) -> bool {
        let (mut all, mut count): (*mut Free, usize) = (null_mut(), 0);
        for list in self.small.iter_mut().chain(core::iter::once(&mut self.large)) {
            while !list.is_null() {
                let block = *list;
                *list = (*block).next;
                (*block).next = all;
                (all, count) = (block, count + 1);
            }
        }
        let mut merged = false;
        let mut block = sort_by_address(all, count);
        while !block.is_null() {
            let start = block as usize;
            let mut end = start + (*block).size;
            block = (*block).next;
            while !block.is_null() && block as usize == end {
                end += (*block).size;
                block = (*block).next;
                merged = true;
            }
            if end == self.bump {
                self.bump = start;
                merged = true;
            } else {
                self.give_run(start, end);
            }
        }
        merged
    }

    /// Frees the bytes from `start` to `end` (multiples of 16) as the largest blocks aligned to their size.
    unsafe fn give_run(&mut self, mut start: usize, end: usize) {
        while start < end {
            let size = if start % PAGE == 0 && end - start > PAGE {
                (end - start) / PAGE * PAGE
            } else {
                let fits = 1usize << (usize::BITS - 1 - (end - start).min(PAGE).leading_zeros());
                fits.min(start & start.wrapping_neg()) // the largest power of two that start is a multiple of
            };
            self.give(start as *mut u8, size);
            start += size;
        }
    }
}

/// The `count` blocks of `list` in address order (a merge sort of the links: it needs no memory).
unsafe fn sort_by_address(list: *mut Free, count: usize) -> *mut Free {
    if count < 2 {
        return list;
    }
    let mut last = list;
    for _ in 1..count / 2 {
        last = (*last).next;
    }
    let second = (*last).next;
    (*last).next = null_mut();
    let (mut a, mut b) = (sort_by_address(list, count / 2), sort_by_address(second, count - count / 2));
    let mut head: *mut Free = null_mut();
    let mut tail: *mut *mut Free = &mut head;
    while !a.is_null() && !b.is_null() {
        let first = if (a as usize) < (b as usize) { &mut a } else { &mut b };
        let taken = *first;
        *first = (*taken).next;
        *tail = taken;
        tail = &mut (*taken).next;
    }
    *tail = if a.is_null() { b } else { a };
    head
}

unsafe impl GlobalAlloc for Heap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let state = &mut *self.0.get();
        let ptr = state.take(layout);
        if ptr.is_null() && state.merge_free_neighbours() {
            return state.take(layout);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        (*self.0.get()).give(ptr, block_size(layout));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = block_size(layout);
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        let new = block_size(new_layout);
        if new == old {
            return ptr;
        }
        let state = &mut *self.0.get();
        // the block at the top of the bump pointer grows or shrinks where it is (if its alignment allows)
        if ptr as usize + old == state.bump && (ptr as usize) % block_align(new, layout.align()) == 0 {
            if let Some(end) = (ptr as usize).checked_add(new).filter(|&end| end <= state.end) {
                state.bump = end;
                return ptr;
            }
        }
        // any other block shrinks where it is too, its rest freed (a block aligned for its old size is for a smaller
        // one): found by a review, a shrink moved, and on a full heap shrink_to_fit panicked out of memory
        if new < old {
            state.give_run(ptr as usize + new, ptr as usize + old);
            return ptr;
        }
        let moved = self.alloc(new_layout);
        if !moved.is_null() {
            core::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
            self.dealloc(ptr, layout);
        }
        moved
    }
}
