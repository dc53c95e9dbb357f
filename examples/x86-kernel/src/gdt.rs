//! Segments: the GDT with kernel and user code/data segments and the TSS
//! (Intel SDM vol. 3A §3.4.5 "Segment Descriptors", §8.7 "Task Management
//! in 64-bit Mode").
//!
//! The TSS holds RSP0, the stack the processor switches to when an
//! interrupt or exception arrives at CPL 3 (§6.14.4 "Stack Switching in
//! IA-32e Mode"), and IST1, a separate stack for #DF so that a fault on a
//! broken stack still reaches its handler (§6.14.5 "Interrupt Stack
//! Table"). Both are in `.bss`, in the image, so they are mapped in every
//! address space that shares the kernel half.
//!
//! This GDT replaces the boot GDT (which lies in the boot part, unmapped
//! once the kernel runs on its own tables) before the kernel leaves the
//! boot tables.

use core::cell::UnsafeCell;

use x86_64::instructions::segmentation::{Segment, CS, DS, ES, SS};
use x86_64::instructions::tables::load_tss;
use x86_64::structures::gdt::{Descriptor, GlobalDescriptorTable, SegmentSelector};
use x86_64::structures::tss::TaskStateSegment;
use x86_64::VirtAddr;

/// Kernel code selector (GDT entry 1, RPL 0).
pub const KERNEL_CS: u16 = 0x08;
/// Kernel data selector (GDT entry 2, RPL 0).
pub const KERNEL_DS: u16 = 0x10;
/// User data selector (GDT entry 3, RPL 3).
pub const USER_DS: u16 = 0x1b;
/// User code selector (GDT entry 4, RPL 3).
pub const USER_CS: u16 = 0x23;

/// The IST slot (0-based, so IST1) of the #DF handler.
pub const DOUBLE_FAULT_IST: u16 = 0;

/// Size of the RSP0 stack (traps from ring 3) and of the #DF stack.
const TRAP_STACK_SIZE: usize = 64 << 10;

/// A stack for the processor to switch to, 16-byte aligned.
#[repr(C, align(16))]
struct Stack([u8; TRAP_STACK_SIZE]);

/// The stack of traps from ring 3 (TSS.RSP0).
static mut RING0_STACK: Stack = Stack([0; TRAP_STACK_SIZE]);
/// The #DF stack (TSS.IST1).
static mut DOUBLE_FAULT_STACK: Stack = Stack([0; TRAP_STACK_SIZE]);

/// A cell the processor reads once `init` has filled it.
struct Cell<T>(UnsafeCell<T>);

// SAFETY: one CPU; written only by `init`, before the processor uses
// them, and afterwards only by the processor (the TSS busy bit in the
// GDT).
unsafe impl<T> Sync for Cell<T> {}

static GDT: Cell<GlobalDescriptorTable> = Cell(UnsafeCell::new(GlobalDescriptorTable::new()));
static TSS: Cell<TaskStateSegment> = Cell(UnsafeCell::new(TaskStateSegment::new()));

/// One past the last byte of `stack`.
fn top(stack: *const Stack) -> VirtAddr {
    VirtAddr::from_ptr(stack) + TRAP_STACK_SIZE as u64
}

/// Builds and loads the GDT and the TSS, and reloads every segment
/// register.
///
/// # Safety
///
/// Call once, at boot, with interrupts off, before anything can enter
/// ring 3.
pub unsafe fn init() {
    // SAFETY: once, on the only CPU, before the processor uses the TSS;
    // no other reference to it exists yet.
    let tss = unsafe { &mut *TSS.0.get() };
    tss.privilege_stack_table[0] = top(&raw const RING0_STACK);
    tss.interrupt_stack_table[DOUBLE_FAULT_IST as usize] = top(&raw const DOUBLE_FAULT_STACK);
    // SAFETY: the TSS is a static, complete now and never written again
    // by software.
    let tss: &'static TaskStateSegment = unsafe { &*TSS.0.get() };
    // SAFETY: as for the TSS: once, before the processor uses the GDT.
    let gdt = unsafe { &mut *GDT.0.get() };
    let kc = gdt.append(Descriptor::kernel_code_segment());
    let kd = gdt.append(Descriptor::kernel_data_segment());
    let ud = gdt.append(Descriptor::user_data_segment());
    let uc = gdt.append(Descriptor::user_code_segment());
    let ts = gdt.append(Descriptor::tss_segment(tss));
    debug_assert_eq!(
        [kc.0, kd.0, ud.0, uc.0],
        [KERNEL_CS, KERNEL_DS, USER_DS, USER_CS]
    );
    // SAFETY: the GDT is a static, complete now and never written again
    // by software (the processor sets the TSS busy bit).
    let gdt: &'static GlobalDescriptorTable = unsafe { &*GDT.0.get() };
    gdt.load();
    // SAFETY: the selectors name the code and data segments just loaded;
    // CS through a far return, as the crate does; then the TSS.
    unsafe {
        CS::set_reg(SegmentSelector(KERNEL_CS));
        SS::set_reg(SegmentSelector(KERNEL_DS));
        DS::set_reg(SegmentSelector(KERNEL_DS));
        ES::set_reg(SegmentSelector(KERNEL_DS));
        load_tss(ts);
    }
}
