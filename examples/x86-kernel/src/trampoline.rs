//! The application processors' way from real mode to the kernel's upper
//! half (SDM vol. 3A §9.4 "Multiple-Processor (MP) Initialization", §9.9
//! "Mode Switching").
//!
//! A Start-Up IPI starts an AP in real mode at `page << 12`; the code must
//! therefore lie in a page below 1 MiB. [`install`] copies it to
//! [`TRAMPOLINE_PA`] (through the linear map) and fills in its parameters;
//! it runs there identity-mapped:
//!
//! 1. 16-bit: load the trampoline's own GDT (its descriptors carry the
//!    accessed bit already, so the CPU never writes the read-only page),
//!    set CR0.PE and far-jump into 32-bit code;
//! 2. 32-bit: flat data segments; CR4 as the BSP has it (PAE, PGE, SMEP,
//!    LA57 — which may only change with paging off — without PCIDE, which
//!    needs long mode), CR3 = the boot root, EFER = LME (+ NXE), CR0 as
//!    the BSP has it (PG, WP, PE, …): long mode is active, in
//!    compatibility mode; far-jump into the 64-bit code segment;
//! 3. 64-bit: jump to `ap_entry64` in the image (upper half), which loads
//!    the kernel's own CR3 and the AP's stack ([`crate::smp`]).
//!
//! The boot root is a transient address space: the kernel's mappings plus
//! the trampoline page identity-mapped read-execute. The AP leaves it at
//! once for the kernel's root (which has no lower-half mapping); the BSP
//! drops it when every AP has reported in.

use core::arch::global_asm;

use crate::mem::phys_to_virt;

/// Where the trampoline runs: 0x8000 (Start-Up vector 0x08), in the RAM
/// below 640 KiB that nothing else of this kernel uses.
pub const TRAMPOLINE_PA: u64 = 0x8000;

global_asm!(
    r#"
    /* Fixed layout (offsets from the page start, which is the section
       start): 16-bit code at 0x00, 32-bit at 0x40, 64-bit at 0xc0, the
       GDT at 0x100, its pointer at 0x120, the parameters at 0x130. */
    .section .rodata.trampoline, "a"
    .p2align 12
    .global tramp_start, tramp_end, tramp_params
tramp_start:
    .code16
    cli
    cld
    xor ax, ax
    mov ds, ax
    lgdt [{base} + 0x120]
    mov eax, cr0
    or eax, 1
    mov cr0, eax
    /* jmp far 0x18:(base + 0x40) with a 32-bit offset. */
    .byte 0x66, 0xea
    .long {base} + 0x40
    .word 0x18

    .org 0x40
    .code32
    mov ax, 0x10
    mov ds, ax
    mov es, ax
    mov ss, ax
    mov eax, dword ptr [{base} + 0x134]  /* CR4 */
    mov cr4, eax
    mov eax, dword ptr [{base} + 0x130]  /* CR3 */
    mov cr3, eax
    mov ecx, 0xc0000080
    mov eax, dword ptr [{base} + 0x138]  /* EFER */
    xor edx, edx
    wrmsr
    mov eax, dword ptr [{base} + 0x13c]  /* CR0 */
    mov cr0, eax
    /* jmp far 0x08:(base + 0xc0) */
    .byte 0xea
    .long {base} + 0xc0
    .word 0x08

    .org 0xc0
    .code64
    mov ax, 0x10
    mov ds, ax
    mov es, ax
    mov ss, ax
    mov rax, qword ptr [{base} + 0x140]  /* the entry */
    jmp rax

    .org 0x100
    .quad 0                     /* null */
    .quad 0x00af9b000000ffff    /* 0x08: 64-bit code, accessed */
    .quad 0x00cf93000000ffff    /* 0x10: flat data, accessed */
    .quad 0x00cf9b000000ffff    /* 0x18: flat 32-bit code, accessed */
    .org 0x120
    .word 4 * 8 - 1
    .long {base} + 0x100
    .org 0x130
tramp_params:
    .long 0, 0, 0, 0            /* CR3, CR4, EFER, CR0 */
    .quad 0                     /* the 64-bit entry */
tramp_end:
    .code64
"#,
    base = const TRAMPOLINE_PA,
);

extern "C" {
    static tramp_start: u8;
    static tramp_end: u8;
    static tramp_params: u8;
}

/// The values the trampoline loads (its last 24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// CR3: the boot root (below 4 GiB: loaded in 32-bit mode).
    pub cr3: u32,
    /// CR4 (PAE, PGE, SMEP, LA57 as the BSP; PCIDE clear).
    pub cr4: u32,
    /// EFER low word: LME and NXE.
    pub efer: u32,
    /// CR0 with PG, WP and PE.
    pub cr0: u32,
    /// The 64-bit entry in the image.
    pub entry: u64,
}

/// Copies the trampoline to [`TRAMPOLINE_PA`] with `params`; returns its
/// length in bytes.
///
/// # Safety
///
/// The page at [`TRAMPOLINE_PA`] is RAM that nothing else uses (not the
/// PVH start info, command line or memory map: the caller checks).
pub unsafe fn install(params: Params) -> usize {
    let start = &raw const tramp_start as usize;
    let len = &raw const tramp_end as usize - start;
    let poff = &raw const tramp_params as usize - start;
    let dst = phys_to_virt(TRAMPOLINE_PA) as *mut u8;
    // SAFETY: the code is `len` bytes of .rodata; the destination page is
    // free RAM in the linear map (our caller's promise); `Params` is
    // 8-byte aligned there (`.p2align 3`, and the page is aligned).
    unsafe {
        core::ptr::copy_nonoverlapping(start as *const u8, dst, len);
        (dst.add(poff) as *mut Params).write(params);
    }
    len
}
