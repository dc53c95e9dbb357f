//! COM1 (16550 UART at I/O port 0x3f8): the kernel's console.
//!
//! The kernel has one CPU and prints from one context at a time (the trap
//! handler prints only on its way to exiting), so the port needs no lock.

use core::fmt;

use x86_64::instructions::port::Port;

const COM1: u16 = 0x3f8;

/// Programs COM1: 115200 baud (divisor 1), 8N1, FIFOs on, interrupts off.
pub fn init() {
    let reg = |off: u16, v: u8| {
        // SAFETY: the 16550 registers at COM1 are owned by this kernel;
        // writing them has no effect on memory.
        unsafe { Port::<u8>::new(COM1 + off).write(v) }
    };
    reg(1, 0x00); // IER: no interrupts
    reg(3, 0x80); // LCR: DLAB on
    reg(0, 0x01); // DLL: divisor 1 (115200 baud)
    reg(1, 0x00); // DLM
    reg(3, 0x03); // LCR: 8 bits, no parity, 1 stop, DLAB off
    reg(2, 0xc7); // FCR: enable and clear FIFOs
    reg(4, 0x03); // MCR: DTR | RTS
}

fn put(b: u8) {
    let mut lsr = Port::<u8>::new(COM1 + 5);
    let mut thr = Port::<u8>::new(COM1);
    // SAFETY: reading the line status register has no side effect on memory.
    while unsafe { lsr.read() } & 0x20 == 0 {
        core::hint::spin_loop();
    }
    // SAFETY: the transmit holding register is empty (LSR bit 5).
    unsafe { thr.write(b) }
}

/// A `fmt::Write` sink for COM1 (`\n` becomes `\r\n`).
pub struct Serial;

impl fmt::Write for Serial {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for b in s.bytes() {
            if b == b'\n' {
                put(b'\r');
            }
            put(b);
        }
        Ok(())
    }
}

/// Prints to COM1.
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => {{
        let _ = core::fmt::Write::write_fmt(&mut $crate::serial::Serial, format_args!($($arg)*));
    }};
}

/// Prints a line to COM1.
#[macro_export]
macro_rules! println {
    () => { $crate::print!("\n") };
    ($($arg:tt)*) => {{
        $crate::print!($($arg)*);
        $crate::print!("\n");
    }};
}
