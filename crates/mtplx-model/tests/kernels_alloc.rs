//! A product allocates nothing once the pool exists: a decode step's ~200 products cost no
//! allocator traffic. Checked with a counting global allocator (this file's own binary).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use mtplx_model::kernels::{Isa, Pool, QuantFormat, QuantMatrix};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn products_do_not_allocate() {
    let (rows, cols) = (1536, 576);
    let bytes: Vec<u8> = (0..rows * cols / 32 * 20)
        .map(|i| (i * 7 % 251) as u8 % 0x3b)
        .collect();
    let m = QuantMatrix::from_gguf_bytes(QuantFormat::Q4_1, &bytes, rows, cols).unwrap();
    let pool = Pool::new(2);
    let isa = Isa::detect();
    let x = vec![0.25f32; 64 * cols];
    let mut y = vec![0f32; 64 * rows];
    for n in [1, 5, 64] {
        // Warm up: first use of the pool and feature detection.
        m.matmul_with(&pool, isa, &x[..n * cols], n, &mut y[..n * rows]);
        let before = ALLOCATIONS.load(Ordering::SeqCst);
        for _ in 0..10 {
            m.matmul_with(&pool, isa, &x[..n * cols], n, &mut y[..n * rows]);
        }
        let during = ALLOCATIONS.load(Ordering::SeqCst) - before;
        assert_eq!(during, 0, "{during} allocations in 10 products of {n} rows");
    }
    // The counter does count: a fresh matrix allocates.
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    let _m2 = QuantMatrix::from_gguf_bytes(QuantFormat::Q4_1, &bytes, rows, cols).unwrap();
    assert!(ALLOCATIONS.load(Ordering::SeqCst) > before);
}
