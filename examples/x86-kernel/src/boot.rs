//! Boot: the PVH ELF note, the 32-bit entry that QEMU jumps to, the
//! switch to 64-bit long mode and the jump to the upper half.
//!
//! QEMU's `-kernel` finds the entry point in the `XEN_ELFNOTE_PHYS32_ENTRY`
//! note (type 18) and enters it in 32-bit protected mode with paging off,
//! flat segments, and `ebx` holding the physical address of the
//! `hvm_start_info` structure (Xen `arch/x86/hvm/start_info.h`).
//!
//! The entry and the 64-bit trampoline (`.text.boot`) are linked at their
//! physical address; everything else is linked in the top 2 GiB (see
//! `linker.ld` and [`crate::mem`]). The entry builds temporary tables with
//! 2 MiB pages (Intel SDM vol. 3 §4.5) that map the first 4 GiB three
//! times: identity (for the instructions right after paging goes on), at
//! [`LINEAR_BASE`] (the linear map, which the table allocator uses from
//! the first table on) and, for the first GiB, at [`KERNEL_VMA`] (the
//! image). It turns on PAE and global pages (CR4 bits 5 and 7), optionally
//! 5-level paging (CR4.LA57, bit 12, which may only change while paging is
//! off), long mode and no-execute (EFER bits 8 and 11; NXE only when
//! CPUID.80000001H:EDX[20] reports it, else `kmain` fails), paging and
//! write-protect (CR0 bits 31 and 16: supervisor stores to read-only pages
//! fault), loads the boot GDT and far-jumps into the 64-bit trampoline,
//! which jumps to `start64_high` in the image. That code clears `.bss`,
//! sets the stack and calls `kmain(start_info)`. The kernel replaces these
//! tables with its own, built by pgtable, which map nothing in the lower
//! half: the boot part is never used again.
//!
//! 5-level paging is requested by starting the command line with `la57`;
//! it is enabled only if CPUID.(EAX=7,ECX=0):ECX[16] says the CPU has it.
//! The same tables serve both modes: PML5 entries 0 and 511 both point at
//! the one PML4, so every upper-half address above lies in PML5 entry 511.

use core::arch::global_asm;

use crate::mem::{KERNEL_VMA, LINEAR_BASE};

/// Stack size of the boot CPU.
pub const STACK_SIZE: usize = 1 << 20;

/// The boot CPU's stack. `start64_high` points RSP at its end and calls
/// `kmain`, so the end must be 16-byte aligned: the System V x86-64 ABI
/// (§3.2.2) has RSP + 8 a multiple of 16 on entry to every function, and
/// compiled code relies on it. `core::fmt`, for one, tells its argument
/// list (on the stack) from a plain string by the low bit of the list's
/// address: on a stack at an odd address every formatted number printed
/// the raw format template instead.
#[repr(C, align(16))]
pub struct BootStack([u8; STACK_SIZE]);

const _: () = assert!(STACK_SIZE.is_multiple_of(16));

/// The boot stack (in `.bss`, so it is cleared before use — harmless).
#[no_mangle]
pub static mut BOOT_STACK: BootStack = BootStack([0; STACK_SIZE]);

global_asm!(
    r#"
    .section .note.pvh, "a"
    .p2align 2
    .long 4                     /* name size: "Xen\0" */
    .long 4                     /* descriptor size */
    .long 18                    /* XEN_ELFNOTE_PHYS32_ENTRY */
    .asciz "Xen"
    .p2align 2
    .long _start32
    .p2align 2

    .section .bootpt, "aw", @nobits
    .p2align 12
boot_pt_start:
boot_pml5:    .skip 4096
boot_pml4:    .skip 4096
boot_pdpt:    .skip 4096
boot_pdpt_hi: .skip 4096
boot_pd:      .skip 4 * 4096
boot_pt_end:

    .section .rodata.boot, "a"
    .p2align 3
boot_gdt:
    .quad 0                     /* null */
    .quad 0x00af9a000000ffff    /* 0x08: 64-bit code, DPL 0 */
    .quad 0x00cf92000000ffff    /* 0x10: data, DPL 0 */
boot_gdt_end:
boot_gdt_ptr:
    .word boot_gdt_end - boot_gdt - 1
    .quad boot_gdt

    .section .text.boot, "ax"
    .code32
    .global _start32
_start32:
    cli
    cld
    mov esi, ebx                /* hvm_start_info, kept in esi */

    /* Zero the boot tables. */
    mov edi, offset boot_pt_start
    mov ecx, offset boot_pt_end
    sub ecx, edi
    shr ecx, 2
    xor eax, eax
    rep stosd

    /* (present | writable) table entries:
       PML5[0], PML5[511] -> PML4;
       PML4[0] -> PDPT (identity), PML4[linear], PML4[image] -> PDPT_HI;
       PDPT[0..4], PDPT_HI[0..4] -> PD0..PD3 (0..4 GiB);
       PDPT_HI[image] -> PD0 (the first GiB, where the image lies). */
    mov eax, offset boot_pml4
    or eax, 3
    mov dword ptr [boot_pml5], eax
    mov dword ptr [boot_pml5 + 511 * 8], eax
    mov eax, offset boot_pdpt
    or eax, 3
    mov dword ptr [boot_pml4], eax
    mov eax, offset boot_pdpt_hi
    or eax, 3
    mov dword ptr [boot_pml4 + {pml4_linear} * 8], eax
    mov dword ptr [boot_pml4 + {pml4_image} * 8], eax
    mov eax, offset boot_pd
    or eax, 3
    mov dword ptr [boot_pdpt_hi + {pdpt_image} * 8], eax
    mov edi, offset boot_pdpt
    mov ecx, 4
1:
    mov dword ptr [edi], eax
    mov dword ptr [edi + 4096], eax /* the same slot of PDPT_HI */
    add eax, 4096
    add edi, 8
    loop 1b

    /* 2048 PD entries: 2 MiB pages (present | writable | PS) for 0..4 GiB. */
    mov edi, offset boot_pd
    mov eax, 0x83
    mov ecx, 2048
2:
    mov dword ptr [edi], eax
    add eax, 0x200000
    add edi, 8
    loop 2b

    /* ebp = 1 if the command line starts with "la57" and the CPU has LA57. */
    xor ebp, ebp
    mov eax, dword ptr [esi + 24]   /* cmdline_paddr (low half) */
    test eax, eax
    jz 3f
    cmp dword ptr [eax], 0x3735616c /* "la57" */
    jne 3f
    xor eax, eax
    cpuid
    cmp eax, 7
    jb 3f
    mov eax, 7
    xor ecx, ecx
    cpuid
    bt ecx, 16
    jnc 3f
    mov ebp, 1
3:
    /* CR4: PAE and PGE (the kernel's mappings are global), and LA57 when
       chosen (only changeable with paging off). */
    mov eax, cr4
    or eax, (1 << 5) | (1 << 7)
    test ebp, ebp
    jz 4f
    or eax, 1 << 12
4:
    mov cr4, eax
    mov eax, offset boot_pml4
    test ebp, ebp
    jz 5f
    mov eax, offset boot_pml5
5:
    mov cr3, eax

    /* EFER (MSR 0xC0000080): LME (bit 8), and NXE (bit 11) only when
       CPUID.80000001H:EDX[20] reports execute-disable: NXE is reserved
       otherwise (WRMSR would fault). `kmain` checks EFER.NXE and fails the
       run loudly without it: pgtable-x86 needs it for bit 63 (XD). */
    xor edi, edi
    mov eax, 0x80000000
    cpuid
    cmp eax, 0x80000001
    jb 7f
    mov eax, 0x80000001
    cpuid
    bt edx, 20
    jnc 7f
    mov edi, 1 << 11
7:
    mov ecx, 0xc0000080
    rdmsr
    or eax, 1 << 8
    or eax, edi
    wrmsr

    /* CR0: PG (bit 31), WP (bit 16), PE (bit 0). Long mode is active now. */
    mov eax, cr0
    or eax, (1 << 31) | (1 << 16) | 1
    mov cr0, eax

    lgdt [boot_gdt_ptr]
    /* Far jump into the 64-bit code segment. Not a far return: ESP is
       undefined at the PVH entry, so nothing here may use the stack. */
    ljmp 0x08, offset start64

    .code64
start64:
    mov ax, 0x10
    mov ds, ax
    mov es, ax
    mov ss, ax
    xor eax, eax
    mov fs, ax
    mov gs, ax
    /* Into the image, in the upper half (more than 2 GiB away). */
    movabs rax, offset start64_high
    jmp rax

    .section .text.start64_high, "ax"
start64_high:
    /* Clear .bss (the boot tables are outside it). */
    lea rdi, [rip + __bss_start]
    lea rcx, [rip + __bss_end]
    sub rcx, rdi
    shr rcx, 3
    xor eax, eax
    rep stosq

    lea rsp, [rip + BOOT_STACK + {stack_size}]
    xor ebp, ebp
    mov edi, esi                /* kmain(start_info), a physical address */
    call kmain
6:
    cli
    hlt
    jmp 6b
"#,
    stack_size = const STACK_SIZE,
    pml4_linear = const (LINEAR_BASE >> 39) & 511,
    pml4_image = const (KERNEL_VMA >> 39) & 511,
    pdpt_image = const (KERNEL_VMA >> 30) & 511,
);

/// The PVH `hvm_start_info` (Xen `start_info.h`), versions 0 and 1.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StartInfo {
    /// `0x336ec578` ("xEn3" with the top bit of each byte set).
    pub magic: u32,
    /// 0, or 1 when the memory map fields exist.
    pub version: u32,
    /// SIF_* flags.
    pub flags: u32,
    /// Number of modules.
    pub nr_modules: u32,
    /// Physical address of the module list.
    pub modlist_paddr: u64,
    /// Physical address of the NUL-terminated command line (0: none).
    pub cmdline_paddr: u64,
    /// Physical address of the ACPI RSDP.
    pub rsdp_paddr: u64,
    /// Physical address of the memory map (version 1).
    pub memmap_paddr: u64,
    /// Number of memory map entries (version 1).
    pub memmap_entries: u32,
    /// Reserved.
    pub reserved: u32,
}

/// One entry of the PVH memory map (E820 types: 1 = RAM).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemmapEntry {
    /// First byte.
    pub addr: u64,
    /// Length in bytes.
    pub size: u64,
    /// E820 type.
    pub kind: u32,
    /// Reserved.
    pub reserved: u32,
}

/// The magic value of [`StartInfo::magic`].
pub const START_INFO_MAGIC: u32 = 0x336e_c578;
