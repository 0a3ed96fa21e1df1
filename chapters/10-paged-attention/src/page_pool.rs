//! The page pool's books: which physical pages of the KV cache are free, and how many of
//! them admission has promised away.
//!
//! The cache is one pool of pages shared by every sequence (see `kv_cache.rs`). A page holds
//! [`PAGE_SIZE`] consecutive positions of one sequence; a sequence's *block table* lists its
//! pages in order, so position p lives at offset `p % PAGE_SIZE` of page
//! `block_table[p / PAGE_SIZE]`, wherever that page is. Pages are taken one at a time, when
//! a sequence first needs them, and given back when it finishes.
//!
//! Taking pages lazily could run the pool dry halfway through a sequence, with every running
//! sequence waiting for a page another holds. So admission works with *credits*, one per
//! page: a request is admitted only if credits for the most pages it can ever hold fit
//! beside those already reserved. Every page a sequence takes is covered by one of its own
//! credits, so a sequence that needs a page always finds one free.
//!
//! Nothing here touches the GPU: these are numbers, tested on their own.

// ANCHOR: page_pool
/// Positions per page.
pub const PAGE_SIZE: usize = 16;

/// Pages that hold `positions` positions.
pub fn pages_for(positions: usize) -> usize {
    positions.div_ceil(PAGE_SIZE)
}

/// The pool row of `position` of the sequence with `block_table`: offset
/// `position % PAGE_SIZE` of its page. (vLLM calls these rows the slot mapping.)
pub fn cache_row(block_table: &[u32], position: usize) -> u32 {
    (block_table[position / PAGE_SIZE] as usize * PAGE_SIZE + position % PAGE_SIZE) as u32
}

pub struct PagePool {
    /// Pages nobody holds, as a stack: the last one freed is the next one taken.
    free: Vec<u32>,
    pages: usize,
    /// Credits not reserved by any request.
    unreserved: usize,
}

impl PagePool {
    pub fn new(pages: usize) -> Self {
        PagePool { free: (0..pages as u32).rev().collect(), pages, unreserved: pages }
    }

    /// Pages in the pool.
    pub fn pages(&self) -> usize {
        self.pages
    }

    pub fn free_pages(&self) -> usize {
        self.free.len()
    }

    /// Pages some sequence holds now.
    pub fn assigned(&self) -> usize {
        self.pages - self.free.len()
    }

    /// Credits no request holds: what the next request may reserve.
    pub fn unreserved(&self) -> usize {
        self.unreserved
    }

    /// Reserves `credits` pages for a request, if they fit beside the reservations made.
    pub fn reserve(&mut self, credits: usize) -> bool {
        if credits > self.unreserved {
            return false;
        }
        self.unreserved -= credits;
        true
    }

    /// A free page, for a sequence with a credit left for it. Every page taken is covered
    /// by a credit and credits never exceed the pool, so one is always free: running dry
    /// would be a bug in the books, not something a workload can cause.
    pub fn take(&mut self) -> u32 {
        self.free.pop().expect("a sequence took a page beyond its reservation")
    }

    /// A finished sequence's pages back to the pool, and its `credits` with them.
    pub fn release(&mut self, block_table: &mut Vec<u32>, credits: usize) {
        assert!(block_table.len() <= credits, "a sequence held more pages than it had reserved");
        self.free.append(block_table);
        self.unreserved += credits;
        assert!(self.unreserved <= self.pages, "more credits came back than were reserved");
    }
}
// ANCHOR_END: page_pool

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_round_up_to_whole_pages() {
        assert_eq!(pages_for(0), 0);
        assert_eq!(pages_for(1), 1);
        assert_eq!(pages_for(16), 1);
        assert_eq!(pages_for(17), 2);
        assert_eq!(pages_for(2048), 128);
    }

    #[test]
    fn a_position_goes_to_its_offset_in_its_page() {
        assert_eq!(cache_row(&[7, 3], 0), 7 * 16);
        assert_eq!(cache_row(&[7, 3], 15), 7 * 16 + 15);
        assert_eq!(cache_row(&[7, 3], 17), 3 * 16 + 1);
    }

    #[test]
    fn credits_bound_what_is_reserved_and_come_back() {
        let mut pool = PagePool::new(10);
        assert!(pool.reserve(6));
        assert!(!pool.reserve(5), "6 + 5 credits in a pool of 10");
        assert!(pool.reserve(4));
        let mut table: Vec<u32> = (0..3).map(|_| pool.take()).collect();
        assert_eq!((pool.assigned(), pool.free_pages(), pool.unreserved()), (3, 7, 0));
        pool.release(&mut table, 6);
        assert!(table.is_empty());
        assert_eq!((pool.assigned(), pool.unreserved()), (0, 6));
    }

    #[test]
    #[should_panic(expected = "more pages than it had reserved")]
    fn a_sequence_cannot_return_more_pages_than_it_reserved() {
        let mut pool = PagePool::new(4);
        pool.reserve(1);
        let mut table = vec![pool.take(), pool.take()];
        pool.release(&mut table, 1);
    }
}
