//! The PL011 UART of QEMU `virt` at 0x0900_0000, transmit only.
//!
//! QEMU's PL011 needs no set-up: writing the data register sends a byte.
//! The kernel reaches it at [`UART_VA`], mapped as Device-nGnRE memory by
//! the early map (boot.rs) and by the kernel map (kmap.rs).

use core::fmt;

use crate::memory::DEVICE_OFFSET;

/// Physical base of the PL011.
pub const UART_BASE: u64 = 0x0900_0000;
/// Where the kernel maps it: in the device region of the upper half.
pub const UART_VA: u64 = UART_BASE + DEVICE_OFFSET;
/// UARTDR, data register (PL011 TRM §3.3.1).
const DR: u64 = 0x000;
/// UARTFR, flag register (PL011 TRM §3.3.3); bit 5 TXFF = transmit FIFO full.
const FR: u64 = 0x018;
const FR_TXFF: u32 = 1 << 5;

/// The console: `core::fmt::Write` over the UART.
pub struct Console;

impl Console {
    fn put(b: u8) {
        let fr = (UART_VA + FR) as *const u32;
        let dr = (UART_VA + DR) as *mut u32;
        // SAFETY: `UART_VA` maps the PL011's register block of QEMU virt
        // (physical 0x0900_0000) as Device memory in every map the kernel
        // prints under (the early one and its own); the registers are
        // 32-bit and naturally aligned; only this single core uses them.
        unsafe {
            while fr.read_volatile() & FR_TXFF != 0 {}
            dr.write_volatile(u32::from(b));
        }
    }
}

impl fmt::Write for Console {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for b in s.bytes() {
            if b == b'\n' {
                Console::put(b'\r');
            }
            Console::put(b);
        }
        Ok(())
    }
}

/// Prints to the console.
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => {{
        let _ = core::fmt::Write::write_fmt(&mut $crate::console::Console, format_args!($($arg)*));
    }};
}

/// Prints a line to the console.
#[macro_export]
macro_rules! println {
    () => { $crate::print!("\n") };
    ($($arg:tt)*) => {{
        $crate::print!($($arg)*);
        $crate::print!("\n");
    }};
}
