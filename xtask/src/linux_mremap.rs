//! Linux's own `mremap` of 1 GiB on this machine, for comparison with the
//! in-kernel `move_page_tables` figures (the Linux patches quote 40–73 µs
//! PUD, 144–160 µs PMD, 3.5–3.7 ms PTE).
//!
//! Three layouts, 10 iterations each (3 with `cargo xtask bench --quick`):
//!
//! - **PUD-aligned**: source and destination 1 GiB aligned, so Linux moves
//!   one PUD entry (HAVE_MOVE_PUD);
//! - **PMD-aligned**: both 2 MiB aligned, 2 MiB past a 1 GiB boundary, so it
//!   moves 512 PMD entries (HAVE_MOVE_PMD);
//! - **misaligned**: source 4 KiB and destination 8 KiB past a 2 MiB
//!   boundary, so every one of the 262,144 PTEs moves alone.
//!
//! Each iteration maps a fresh 1 GiB anonymous source with 4 KiB pages
//! (`MADV_NOHUGEPAGE`, then populated and tagged page by page so every page
//! table exists), times `mremap(MREMAP_MAYMOVE | MREMAP_FIXED)` with
//! `CLOCK_MONOTONIC`, then checks every page's tag at the destination and
//! that the source is gone.

use std::time::{Duration, Instant};

const G1: usize = 1 << 30;
const M2: usize = 2 << 20;
const PAGE: usize = 4096;

/// A private anonymous reservation of address space, unmapped on drop.
struct Reservation {
    base: *mut libc::c_void,
    len: usize,
}

impl Reservation {
    fn new(len: usize) -> Result<Reservation, String> {
        // SAFETY: a fresh PROT_NONE mapping at an address the kernel picks;
        // it aliases nothing.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(format!(
                "mmap reservation: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(Reservation { base, len })
    }

    /// The first address at or after the base aligned to `align`.
    fn aligned(&self, align: usize) -> usize {
        (self.base as usize).next_multiple_of(align)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: the whole reservation (and whatever was mapped or moved
        // inside it) belongs to us and nothing refers to it any more.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

fn tag(i: usize) -> u64 {
    (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xa5a5_0000_0000_0000
}

/// One timed move of 1 GiB from `src_off` to `dst_off` (offsets from a
/// 1 GiB boundary inside an 8 GiB reservation); validated.
fn one_move(src_off: usize, dst_off: usize) -> Result<Duration, String> {
    let r = Reservation::new(8 * G1)?;
    let a = r.aligned(G1);
    let src = a + src_off;
    let dst = a + 4 * G1 + dst_off;
    // SAFETY: [src, src + 1 GiB) lies inside our reservation; MAP_FIXED
    // replaces only that part of it.
    let p = unsafe {
        libc::mmap(
            src as *mut libc::c_void,
            G1,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!("mmap source: {}", std::io::Error::last_os_error()));
    }
    // 4 KiB pages, as in the seeds' measurements: no transparent huge pages.
    // SAFETY: advice on our own mapping.
    if unsafe { libc::madvise(p, G1, libc::MADV_NOHUGEPAGE) } != 0 {
        return Err(format!("madvise: {}", std::io::Error::last_os_error()));
    }
    // Populate every page (and so every page table) and tag it.
    let words = p as *mut u64;
    for i in 0..G1 / PAGE {
        // SAFETY: inside the read-write source mapping, 8-byte aligned.
        unsafe { words.add(i * PAGE / 8 + i % 512).write_volatile(tag(i)) };
    }
    let t0 = Instant::now();
    // SAFETY: moves our mapping onto another part of our reservation.
    let q = unsafe {
        libc::mremap(
            p,
            G1,
            G1,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            dst as *mut libc::c_void,
        )
    };
    let dt = t0.elapsed();
    if q == libc::MAP_FAILED {
        return Err(format!("mremap: {}", std::io::Error::last_os_error()));
    }
    if q as usize != dst {
        return Err(format!("mremap moved to {q:?}, not {dst:#x}"));
    }
    let words = q as *const u64;
    for i in 0..G1 / PAGE {
        // SAFETY: inside the moved mapping, 8-byte aligned.
        let v = unsafe { words.add(i * PAGE / 8 + i % 512).read_volatile() };
        if v != tag(i) {
            return Err(format!(
                "page {i} holds {v:#x} after the move, expected {:#x}",
                tag(i)
            ));
        }
    }
    // The source must be unmapped now: msync fails with ENOMEM on a hole.
    // SAFETY: msync only inspects the range.
    let rc = unsafe { libc::msync(src as *mut libc::c_void, PAGE, libc::MS_ASYNC) };
    if rc == 0 {
        return Err("the source is still mapped after mremap".into());
    }
    Ok(dt)
}

/// Measures (`iters` moves per layout) and prints the table; returns the
/// median ns of the PUD-aligned, PMD-aligned and misaligned layouts. Err
/// if a move failed or lost data.
pub fn bench(iters: usize) -> Result<[u128; 3], String> {
    let layouts: [(&str, usize, usize); 3] = [
        ("PUD-aligned", 0, 0),
        ("PMD-aligned", M2, M2),
        ("misaligned (PTE)", PAGE, 2 * PAGE),
    ];
    let mut ns = vec![vec![0u128; iters]; 3];
    for (k, &(name, s, d)) in layouts.iter().enumerate() {
        eprintln!("xtask: linux mremap: {name} ...");
        for slot in ns[k].iter_mut() {
            *slot = one_move(s, d)
                .map_err(|e| format!("{name}: {e}"))?
                .as_nanos();
        }
    }
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!();
    println!(
        "Linux mremap of 1 GiB (4 KiB pages, populated, data validated) on this machine, kernel {}; THP: {}",
        release.trim(),
        thp.trim()
    );
    println!("Total mremap times for 1GB data. All times are in nanoseconds.");
    println!();
    println!(
        "{:>6}  {:>14}  {:>14}  {:>18}",
        "iter", "PUD-aligned", "PMD-aligned", "misaligned (PTE)"
    );
    for (i, ((pud, pmd), pte)) in ns[0].iter().zip(&ns[1]).zip(&ns[2]).enumerate() {
        println!("{:>6}  {:>14}  {:>14}  {:>18}", i + 1, pud, pmd, pte);
    }
    let mean = |v: &[u128]| v.iter().sum::<u128>() as f64 / iters as f64;
    println!(
        "{:>6}  {:>14.1}  {:>14.1}  {:>18.1}   <-- Mean time in nanoseconds",
        "mean",
        mean(&ns[0]),
        mean(&ns[1]),
        mean(&ns[2])
    );
    let median = |v: &[u128]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v[v.len() / 2]
    };
    Ok([median(&ns[0]), median(&ns[1]), median(&ns[2])])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_mremap_of_misaligned_pages_keeps_every_page() {
        // The PTE path moves every page alone: the most that can go wrong.
        let r = one_move(PAGE, 2 * PAGE);
        assert!(r.is_ok(), "{r:?}");
    }
}
